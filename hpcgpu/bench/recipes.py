"""Scaling recipes: how an app's problem is sized and grown for ``python -m hpcgpu.bench scaling``.

The scaling study knows no app by name. Each app registers a :class:`ScalingRecipe` — the module to
run, small default flags, and a planner that turns a list of rank counts into runs (the same problem
for a strong series; a problem grown with the rank count for a weak one) — from a module of its own::

    # apps/md/scaling_recipe.py
    from hpcgpu.bench.recipes import ScalingRecipe, register_scaling_recipe

    register_scaling_recipe("md", ScalingRecipe(module="apps.md", default_args=(...), plan_fn=plan_md))

Discovery (:func:`scaling_recipes`) imports, once, the module ``scaling_recipe`` of every package in

1. :data:`APP_PACKAGES` (``apps.stencil``, ``apps.md``, ``apps.train``: the apps of this repository);
2. ``HPCGPU_SCALING_RECIPES``: a comma list of more packages or modules (``mypkg.myapp``, or the full
   ``mypkg.myapp.scaling_recipe``), for apps outside this repository;
3. the entry point group ``hpcgpu.scaling_recipes`` of installed distributions (each entry point names
   a module; loading it registers its recipes), so a pip-installed app needs no environment variable.

A package of the list that cannot be imported (an app not shipped in a wheel) is skipped; an error
*inside* a recipe module is raised, so a broken recipe is never silently missing.
"""

from __future__ import annotations

import argparse
import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Sequence

from hpcgpu.decomposition import choose_dims
from hpcgpu.errors import ConfigurationError

#: Packages whose ``scaling_recipe`` module is imported by :func:`scaling_recipes`, in this order.
APP_PACKAGES = ("apps.stencil", "apps.md", "apps.train")
RECIPES_ENV = "HPCGPU_SCALING_RECIPES"
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


def _import_recipe_module(name: str, optional: bool) -> None:
    module = name if name.endswith(".scaling_recipe") else f"{name}.scaling_recipe"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only a missing package or recipe module is tolerated, never a failing import inside the recipe.
        if not optional or not (exc.name and module.startswith(exc.name)):
            raise


def scaling_recipes() -> dict[str, ScalingRecipe]:
    """All registered recipes (discovering them on the first call), by app name."""
    global _discovered
    if not _discovered:
        _discovered = True
        for package in APP_PACKAGES:
            _import_recipe_module(package, optional=True)
        for name in filter(None, (part.strip() for part in os.environ.get(RECIPES_ENV, "").split(","))):
            _import_recipe_module(name, optional=False)
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            entry_point.load()
    return dict(_registry)


def get_recipe(app_name: str) -> ScalingRecipe:
    recipes = scaling_recipes()
    if app_name not in recipes:
        raise ConfigurationError(f"no scaling recipe for app {app_name!r}; registered: {', '.join(recipes) or 'none'}. "
                                 f"Add one with hpcgpu.bench.recipes.register_scaling_recipe ({RECIPES_ENV})")
    return recipes[app_name]


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
