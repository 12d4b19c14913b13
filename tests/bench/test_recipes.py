"""Scaling recipes (hpcgpu.bench.recipes): found through the entry-point group, never by importing an app.

The bundled apps' recipes come from hpcgpu's own entry points (pyproject.toml), so these tests need hpcgpu
installed (``pip install -e .``, as CI does). Other apps are installed here for real: a package and its
``*.dist-info`` (METADATA, entry_points.txt) in a directory put on ``sys.path``, which is where
:mod:`importlib.metadata` finds installed distributions.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from hpcgpu.bench import recipes
from hpcgpu.bench.__main__ import main as bench_main
from hpcgpu.bench.recipes import RunPlan, ScalingRecipe, register_scaling_recipe, scaling_recipes
from hpcgpu.errors import ConfigurationError

TOY_RECIPE = """
    from hpcgpu.bench.recipes import RunPlan, ScalingRecipe, register_scaling_recipe

    def plan(ranks, mode, args):
        return [RunPlan(n, list(args), 10.0 * n, "widgets", f"{n} x 10 widgets") for n in ranks]

    register_scaling_recipe("toy", ScalingRecipe(module="toyapp", default_args=("--size", "10"), plan_fn=plan))
"""


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


def install_app(site, monkeypatch, package: str, entry_points: dict[str, str], recipe_source: str) -> None:
    """Install ``package`` (with ``package/scaling_recipe.py``) and a distribution declaring ``entry_points``
    in the directory ``site``, and put it on sys.path."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text("")
    (site / package / "scaling_recipe.py").write_text(textwrap.dedent(recipe_source))
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{recipes.ENTRY_POINT_GROUP}]\n{lines}")
    monkeypatch.syspath_prepend(str(site))


def test_the_three_apps_register_their_recipes_through_entry_points(fresh_registry):
    found = scaling_recipes()
    assert {name: found[name].module for name in ("stencil", "md", "train")} == {
        "stencil": "apps.stencil", "md": "apps.md", "train": "apps.train"}, (
        "the bundled recipes come from hpcgpu's entry points: is hpcgpu installed (pip install -e .)?")
    assert found["stencil"].default_args[:2] == ("--model", "jacobi")
    assert found["md"].plan_fn.__module__ == "apps.md.scaling_recipe"


def test_an_installed_package_adds_an_app(fresh_registry, monkeypatch, tmp_path, capsys):
    install_app(tmp_path / "site", monkeypatch, "toyapp", {"toy": "toyapp.scaling_recipe"}, TOY_RECIPE)
    assert bench_main(["scaling", "--app", "toy", "--ranks", "1,2", "--dry-run", "--", "--fast"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["   1 ranks: mpiexec -n 1 python -m toyapp --size 10 --fast",
                   "   2 ranks: mpiexec -n 2 python -m toyapp --size 10 --fast"]


def test_a_broken_recipe_is_an_error_naming_its_entry_point(fresh_registry, monkeypatch, tmp_path):
    install_app(tmp_path / "site", monkeypatch, "brokenapp", {"broken": "brokenapp.scaling_recipe"},
                "import no_such_module_anywhere\n")
    with pytest.raises(ConfigurationError, match="no_such_module_anywhere") as error:
        scaling_recipes()
    assert "entry point broken = 'brokenapp.scaling_recipe' of brokenapp 0.1" in str(error.value)
    assert isinstance(error.value.__cause__, ModuleNotFoundError)


def test_an_entry_point_must_register_the_app_it_is_named_after(fresh_registry, monkeypatch, tmp_path):
    install_app(tmp_path / "site", monkeypatch, "toyapp", {"widgets": "toyapp.scaling_recipe"}, TOY_RECIPE)
    with pytest.raises(ConfigurationError, match="registered no recipe named 'widgets'"):
        scaling_recipes()


def test_an_empty_group_says_to_install_hpcgpu(fresh_registry, monkeypatch, capsys):
    """What a checkout on PYTHONPATH without ``pip install`` sees: no metadata, so no entry points."""
    monkeypatch.setattr(recipes, "ENTRY_POINT_GROUP", "hpcgpu.scaling_recipes.none_installed")
    with pytest.raises(ConfigurationError, match="pip install -e CHECKOUT") as error:
        recipes.get_recipe("stencil")
    assert "no installed distribution declares the entry-point group" in str(error.value)
    assert bench_main(["scaling", "--app", "stencil", "--ranks", "1", "--dry-run"]) == 2
    assert "pip install -e CHECKOUT" in capsys.readouterr().err


def test_registration_is_checked(fresh_registry):
    with pytest.raises(ConfigurationError, match="short app name"):
        register_scaling_recipe("my app", ScalingRecipe("x", (), lambda r, m, a: []))
    with pytest.raises(ConfigurationError, match="expects a ScalingRecipe"):
        register_scaling_recipe("toy", {"module": "x"})
    with pytest.raises(ConfigurationError, match="no scaling recipe for app 'nope'; registered: md, stencil, train"):
        recipes.get_recipe("nope")
    register_scaling_recipe("toy", ScalingRecipe("x", (), lambda r, m, a: [RunPlan(1, [], 1.0, "u", "")]))
    assert recipes.get_recipe("toy").module == "x"
