"""Scaling recipes: how an app's problem is sized and grown for ``python -m hpcgpu.bench scaling``.

The scaling study knows no app by name. Each app registers a :class:`ScalingRecipe` — the module to
run, small default flags, and a planner that turns a list of rank counts into runs (the same problem
for a strong series; a problem grown with the rank count for a weak one) — from a module of its own::

    # apps/md/scaling_recipe.py
    from hpcgpu.bench.recipes import ScalingRecipe, register_scaling_recipe

    register_scaling_recipe("md", ScalingRecipe(module="apps.md", default_args=(...), plan_fn=plan_md))

and declares that module in the entry-point group ``hpcgpu.scaling_recipes`` of its distribution, under
the app's name (hpcgpu's own ``pyproject.toml`` does so for ``apps.stencil``, ``apps.md`` and
``apps.train``)::

    [project.entry-points."hpcgpu.scaling_recipes"]
    md = "apps.md.scaling_recipe"

Discovery (:func:`scaling_recipes`) loads, once, every entry point of that group from the installed
distributions' metadata: nothing here imports an app by name, so hpcgpu works without the bundled apps
and a pip-installed app of any package adds itself. The metadata exists once the distribution is
installed (``pip install -e .`` for a checkout); an empty group means it is not, and the error says so.
An entry point that fails to load, or loads without registering the recipe it is named after, is an
error naming it: a broken recipe is never silently missing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from hpcgpu.decomposition import choose_dims
from hpcgpu.errors import ConfigurationError

#: The entry-point group whose entries (``APP_NAME = "package.module"``) register the scaling recipes.
ENTRY_POINT_GROUP = "hpcgpu.scaling_recipes"


@dataclass
class RunPlan:
    """One run of the series: rank count, the app's arguments, and its problem size."""

    n_ranks: int
    app_args: list[str]
    global_size: float          # cells, atoms, or samples per step, over all ranks
    size_unit: str
    description: str
    error: str | None = None    # why this rank count cannot be planned

    @property
    def size_per_rank(self) -> float:
        return self.global_size / self.n_ranks


@dataclass(frozen=True)
class ScalingRecipe:
    """How to run and scale one app.

    Attributes
    ----------
    module : str
        Run as ``python -m module`` (e.g. ``apps.stencil``).
    default_args : tuple of str
        Small default problem (seconds on CPUs); the user's flags after ``--`` come after them and win.
    plan_fn : callable
        ``plan_fn(ranks, mode, args) -> list[RunPlan]``: ``ranks`` the sorted rank counts (the first is
        the baseline), ``mode`` ``"strong"`` or ``"weak"``, ``args`` the default flags followed by the
        user's. Raises ConfigurationError (or ValueError / TypeError) when the flags cannot be scaled.
    """

    module: str
    default_args: tuple[str, ...]
    plan_fn: Callable[[list[int], str, list[str]], list[RunPlan]]


_registry: dict[str, ScalingRecipe] = {}
_discovered = False


def register_scaling_recipe(app_name: str, recipe: ScalingRecipe) -> None:
    """Make ``app_name`` a choice of ``hpcgpu.bench scaling --app``. Registering a name again replaces it."""
    if not isinstance(app_name, str) or not app_name.isidentifier():
        raise ConfigurationError(f"a scaling recipe needs a short app name such as 'stencil', got {app_name!r}")
    if not isinstance(recipe, ScalingRecipe):
        raise ConfigurationError(f"register_scaling_recipe({app_name!r}, ...) expects a ScalingRecipe, got "
                                 f"{type(recipe).__name__}")
    _registry[app_name] = recipe


def _entry_point_text(entry_point) -> str:
    distribution = getattr(entry_point, "dist", None)
    owner = f" of {distribution.name} {distribution.version}" if distribution is not None else ""
    return f"entry point {entry_point.name} = {entry_point.value!r}{owner} (group {ENTRY_POINT_GROUP})"


def _load_entry_point(entry_point) -> None:
    """Import the module an entry point names (it registers its recipes); check that it registered its own."""
    try:
        entry_point.load()
    except Exception as exc:
        raise ConfigurationError(
            f"{_entry_point_text(entry_point)} failed to load: {type(exc).__name__}: {exc}. Expected a module "
            "that calls register_scaling_recipe; fix it, or reinstall or uninstall the distribution that "
            "declares it") from exc
    if entry_point.name not in _registry:
        raise ConfigurationError(
            f"{_entry_point_text(entry_point)} loaded, but registered no recipe named {entry_point.name!r} "
            f"(registered: {', '.join(sorted(_registry)) or 'none'}). Expected the module to call "
            f"register_scaling_recipe({entry_point.name!r}, ...): name the entry point after the app it registers")


def scaling_recipes() -> dict[str, ScalingRecipe]:
    """All registered recipes (discovering the entry points on the first call), by app name.

    Raises
    ------
    ConfigurationError
        When an entry point of :data:`ENTRY_POINT_GROUP` fails to load or registers no recipe of its name.
    """
    global _discovered
    if not _discovered:
        _discovered = True
        for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            _load_entry_point(entry_point)
    return dict(_registry)


def get_recipe(app_name: str) -> ScalingRecipe:
    """The recipe registered as ``app_name``; ConfigurationError saying how to get one when there is none."""
    recipes = scaling_recipes()
    if app_name in recipes:
        return recipes[app_name]
    if not recipes:
        raise ConfigurationError(
            f"no scaling recipe for app {app_name!r}: no installed distribution declares the entry-point group "
            f"{ENTRY_POINT_GROUP}. Expected hpcgpu installed (its pyproject.toml declares the recipes of "
            f"apps.stencil, apps.md and apps.train); found hpcgpu imported from "
            f"{Path(__file__).resolve().parents[1]} without that metadata (a checkout on PYTHONPATH only?). "
            "Install it: pip install -e CHECKOUT (or pip install hpcgpu)")
    raise ConfigurationError(
        f"no scaling recipe for app {app_name!r}; registered: {', '.join(sorted(recipes))}. Add one: a module "
        f"that calls register_scaling_recipe({app_name!r}, ...), declared in your pyproject.toml as "
        f'[project.entry-points."{ENTRY_POINT_GROUP}"] {app_name} = "yourpackage.scaling_recipe", then '
        "pip install your package")


# -- helpers for planners --------------------------------------------------------------------------------


def dims_text(dims) -> str:
    """``2,2,1`` from (2, 2, 1)."""
    return ",".join(str(d) for d in dims)


def requested_dims(text: str | None, n_axes: int):
    """The ``--dims`` flag as a tuple (0 for '*' or '0'), or None when not given."""
    if text is None:
        return None
    values = tuple(0 if part.strip() in ("*", "0") else int(part) for part in text.split(","))
    if len(values) != n_axes:
        raise ConfigurationError(f"--dims {text!r}: expected {n_axes} entries")
    return values


def replicate_block(base_shape: Sequence[int], baseline_ranks: int, n_ranks: int, requested):
    """Weak scaling: (global shape, dims) giving every one of ``n_ranks`` the baseline's block.

    The baseline's block (``base_shape`` split over ``baseline_ranks`` as the decomposition would) is
    replicated along the process grid chosen for ``n_ranks`` (:func:`hpcgpu.decomposition.choose_dims`).
    """
    baseline_dims = choose_dims(baseline_ranks, base_shape, requested)
    block = [n // d for n, d in zip(base_shape, baseline_dims)]
    dims = choose_dims(n_ranks, block, requested)
    return tuple(b * d for b, d in zip(block, dims)), dims


def split_known(args: Sequence[str], names: Sequence[str]):
    """(values of the flags ``names``, the other arguments) from ``args``; the last value of a flag wins."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in names:
        parser.add_argument(name, default=None)
    return parser.parse_known_args(list(args))
