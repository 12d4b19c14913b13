"""The stencil app's scaling recipe for ``python -m hpcgpu.bench scaling --app stencil``.

Strong: the same grid on every rank count. Weak: the baseline's block replicated along the process
grid the decomposition chooses, passed as ``--dims`` so every rank owns exactly the baseline's block
(``--nx/--ny/--nz`` multiplied per axis). Registered when :func:`hpcgpu.bench.recipes.scaling_recipes`
imports this module.
"""

from __future__ import annotations

import importlib
import math

from hpcgpu.bench.recipes import (
    RunPlan, ScalingRecipe, dims_text, register_scaling_recipe, replicate_block, requested_dims, split_known,
)
from hpcgpu.errors import ConfigurationError

#: jacobi 1024 x 1024, 200 steps: seconds on CPUs.
DEFAULT_ARGS = ("--model", "jacobi", "--steps", "200", "--no-plot")
#: Grid of the default problem when no --nx/--ny/--nz is given (other models: their class's default_shape).
SIZES = {"jacobi": {"ny": 1024, "nx": 1024}}
#: Model classes that know their default grid (imported only when a size is missing).
MODELS = {"jacobi": ("apps.stencil.jacobi.model", "JacobiModel"),
          "heat3d": ("apps.stencil.heat3d.model", "Heat3DModel"),
          "swe": ("apps.stencil.channel.model", "SweModel")}


def plan_stencil(ranks: list[int], mode: str, args: list[str]) -> list[RunPlan]:
    """Runs of a ``mode`` series over ``ranks`` for the stencil flags ``args`` (see the module docstring)."""
    known, rest = split_known(args, ["--model", "--nx", "--ny", "--nz", "--dims"])
    model = known.model or "swe"
    axes = ("nz", "ny", "nx") if model == "heat3d" else ("ny", "nx")
    if any(getattr(known, axis) is None for axis in axes):
        module, name = MODELS[model]
        defaults = SIZES.get(model) or getattr(importlib.import_module(module), name).default_shape
        for axis in axes:
            if getattr(known, axis) is None:
                setattr(known, axis, defaults[axis])
    base_shape = tuple(int(getattr(known, axis)) for axis in axes)
    requested = requested_dims(known.dims, len(axes))
    plans = []
    for n in ranks:
        shape, dims = base_shape, requested
        if mode == "weak":
            try:
                shape, dims = replicate_block(base_shape, ranks[0], n, requested)
            except ConfigurationError as exc:
                plans.append(RunPlan(n, [], math.prod(base_shape) * n / ranks[0], "cells", "-", error=str(exc)))
                continue
        run_args = ["--model", model] + [a for axis, v in zip(axes, shape) for a in (f"--{axis}", str(v))]
        if dims is not None:
            run_args += ["--dims", dims_text(dims)]
        plans.append(RunPlan(n, run_args + rest, math.prod(shape), "cells",
                             f"{model} {' x '.join(map(str, shape))} cells"))
    return plans


register_scaling_recipe("stencil", ScalingRecipe(module="apps.stencil", default_args=DEFAULT_ARGS,
                                                 plan_fn=plan_stencil))
