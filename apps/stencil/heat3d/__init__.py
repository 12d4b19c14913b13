"""3D heat equation, explicit 7-point stencil on a periodic box: a validation model with an exact solution.

- :mod:`~apps.stencil.heat3d.problem` — Fourier-mode initial state, exact discrete solution, stability.
- :mod:`~apps.stencil.heat3d.step` — :func:`heat3d_step`, one step over a region of a padded array.
- :mod:`~apps.stencil.heat3d.stencil` — the update of one cell as an ``@hpcgpu.stencil`` function, whose
  generated Numba kernel is the CPU step; :mod:`~apps.stencil.heat3d.gpu` — the CUDA kernel.
"""

from apps.stencil.heat3d.problem import (
    MAX_STABLE_R,
    amplification_factor,
    check_stability,
    exact_solution,
    initial_condition,
)
from apps.stencil.heat3d.step import heat3d_step, n_lattice_updates

__all__ = [
    "MAX_STABLE_R",
    "amplification_factor",
    "check_stability",
    "exact_solution",
    "heat3d_step",
    "initial_condition",
    "n_lattice_updates",
]
