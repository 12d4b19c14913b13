"""Jacobi relaxation for the 2D Laplace equation (NVIDIA multi-GPU programming models benchmark).

- :mod:`~apps.stencil.jacobi.problem` — the global problem: initial state, Dirichlet columns.
- :mod:`~apps.stencil.jacobi.sweep` — :func:`jacobi_sweep`, one sweep over a region of a padded array.
- :mod:`~apps.stencil.jacobi.stencil` — the update of one cell as an ``@hpcgpu.stencil`` function, whose
  generated Numba kernel is the CPU sweep; :mod:`~apps.stencil.jacobi.gpu` — the CUDA kernels.
- :mod:`~apps.stencil.jacobi.arrays` — argument checks shared with :mod:`apps.stencil.heat3d`.
"""

from apps.stencil.jacobi.gpu import GPU_VARIANTS
from apps.stencil.jacobi.problem import (
    boundary_values,
    fill_initial_state,
    fixed_local_columns,
    initial_condition,
)
from apps.stencil.jacobi.sweep import jacobi_sweep, n_lattice_updates

__all__ = [
    "GPU_VARIANTS",
    "boundary_values",
    "fill_initial_state",
    "fixed_local_columns",
    "initial_condition",
    "jacobi_sweep",
    "n_lattice_updates",
]
