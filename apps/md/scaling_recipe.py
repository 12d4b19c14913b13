"""The MD app's scaling recipe for ``python -m hpcgpu.bench scaling --app md``.

Strong: the same lattice (or ``--data`` file) on every rank count. Weak: the baseline's block of unit
cells replicated along the process grid (``--cells`` multiplied per axis and passed with ``--dims``),
so atoms per rank stay constant: the cube-root rule made exact. A data file cannot grow: ``--weak``
with ``--data`` is refused. Registered when :func:`hpcgpu.bench.recipes.scaling_recipes` imports it.
"""

from __future__ import annotations

import math

from hpcgpu.bench.recipes import (
    RunPlan, ScalingRecipe, dims_text, register_scaling_recipe, replicate_block, requested_dims, split_known,
)
from hpcgpu.errors import ConfigurationError

DEFAULT_ARGS = ("--cells", "10", "--steps", "50", "--no-plot")
ATOMS_PER_CELL = {"fcc": 4, "bcc": 2, "sc": 1}


def plan_md(ranks: list[int], mode: str, args: list[str]) -> list[RunPlan]:
    """Runs of a ``mode`` series over ``ranks`` for the MD flags ``args`` (see the module docstring)."""
    known, rest = split_known(args, ["--cells", "--dims", "--lattice", "--data"])
    if known.data is not None:
        if mode == "weak":
            raise ConfigurationError("--weak with apps.md needs a lattice (--cells), not --data: a data file cannot "
                                     "be grown with the rank count; use --strong")
        rest += ["--data", known.data]
    cells = [int(v) for v in known.cells.split(",")]
    cells = cells * 3 if len(cells) == 1 else cells
    lattice = known.lattice or "fcc"
    requested = requested_dims(known.dims, 3)
    per_cell = ATOMS_PER_CELL.get(lattice, 1)
    plans = []
    for n in ranks:
        shape, dims = tuple(cells), requested
        if mode == "weak":
            # choose_dims works in C order (z, y, x); apps.md's --cells and --dims are (x, y, z).
            try:
                shape_zyx, dims_zyx = replicate_block(shape[::-1], ranks[0], n,
                                                      None if requested is None else requested[::-1])
            except ConfigurationError as exc:
                plans.append(RunPlan(n, [], math.prod(shape) * per_cell * n / ranks[0], "atoms", "-", error=str(exc)))
                continue
            shape, dims = shape_zyx[::-1], dims_zyx[::-1]
        run_args = ["--lattice", lattice, "--cells", dims_text(shape)]
        if dims is not None:
            run_args += ["--dims", dims_text(dims)]
        n_atoms = math.prod(shape) * per_cell
        plans.append(RunPlan(n, run_args + rest, n_atoms, "atoms",
                             f"{lattice} {' x '.join(map(str, shape))} cells, {n_atoms} atoms"))
    return plans


register_scaling_recipe("md", ScalingRecipe(module="apps.md", default_args=DEFAULT_ARGS, plan_fn=plan_md))
