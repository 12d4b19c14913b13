"""Scaling recipes (hpcgpu.bench.recipes): the apps register theirs; other packages can add one."""

from __future__ import annotations

import sys
import textwrap

import pytest

from hpcgpu.bench import recipes
from hpcgpu.bench.__main__ import main as bench_main
from hpcgpu.bench.recipes import RunPlan, ScalingRecipe, register_scaling_recipe, scaling_recipes
from hpcgpu.errors import ConfigurationError


def forget_recipes():
    recipes._registry.clear()
    recipes._discovered = False
    for name in [name for name in sys.modules if name.endswith(".scaling_recipe")]:
        del sys.modules[name]   # so that the next discovery imports (and registers) them again


@pytest.fixture
def fresh_registry():
    """Discovery runs again, and whatever a test registered is gone afterwards."""
    forget_recipes()
    yield
    forget_recipes()


def test_the_three_apps_register_their_recipes(fresh_registry):
    found = scaling_recipes()
    assert {name: recipe.module for name, recipe in found.items()} == {
        "stencil": "apps.stencil", "md": "apps.md", "train": "apps.train"}
    assert found["stencil"].default_args[:2] == ("--model", "jacobi")
    assert found["md"].plan_fn.__module__ == "apps.md.scaling_recipe"


def test_a_package_named_in_the_environment_adds_an_app(fresh_registry, monkeypatch, tmp_path, capsys):
    package = tmp_path / "toyapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scaling_recipe.py").write_text(textwrap.dedent("""
        from hpcgpu.bench.recipes import RunPlan, ScalingRecipe, register_scaling_recipe

        def plan(ranks, mode, args):
            return [RunPlan(n, list(args), 10.0 * n, "widgets", f"{n} x 10 widgets") for n in ranks]

        register_scaling_recipe("toy", ScalingRecipe(module="toyapp", default_args=("--size", "10"), plan_fn=plan))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HPCGPU_SCALING_RECIPES", "toyapp")
    assert bench_main(["scaling", "--app", "toy", "--ranks", "1,2", "--dry-run", "--", "--fast"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["   1 ranks: mpiexec -n 1 python -m toyapp --size 10 --fast",
                   "   2 ranks: mpiexec -n 2 python -m toyapp --size 10 --fast"]


def test_a_broken_recipe_is_an_error_not_a_missing_app(fresh_registry, monkeypatch, tmp_path):
    package = tmp_path / "brokenapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scaling_recipe.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HPCGPU_SCALING_RECIPES", "brokenapp")
    with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
        scaling_recipes()


def test_a_missing_app_package_is_skipped(fresh_registry, monkeypatch):
    monkeypatch.setattr(recipes, "APP_PACKAGES", ("apps.stencil", "apps.no_such_app"))
    assert list(scaling_recipes()) == ["stencil"]


def test_registration_is_checked(fresh_registry):
    with pytest.raises(ConfigurationError, match="short app name"):
        register_scaling_recipe("my app", ScalingRecipe("x", (), lambda r, m, a: []))
    with pytest.raises(ConfigurationError, match="expects a ScalingRecipe"):
        register_scaling_recipe("toy", {"module": "x"})
    with pytest.raises(ConfigurationError, match="no scaling recipe for app 'nope'"):
        recipes.get_recipe("nope")
    register_scaling_recipe("toy", ScalingRecipe("x", (), lambda r, m, a: [RunPlan(1, [], 1.0, "u", "")]))
    assert recipes.get_recipe("toy").module == "x"
