"""The heat3d update of one cell, written once for the kernel layer (``@hpcgpu.stencil``).

The CPU step (:func:`~apps.stencil.heat3d.step.heat3d_step` on NumPy arrays) runs the Numba kernel
the layer generates from :func:`heat3d` over the region (:mod:`apps.stencil.region_kernels`).
"""

from __future__ import annotations

import hpcgpu
from apps.stencil.region_kernels import apply_to_regions


@hpcgpu.stencil
def heat3d(u, r):
    # Association order fixed for every backend: ((x+ + x-) + (y+ + y-)) + (z+ + z-).
    neighbours = ((u[0, 0, 1] + u[0, 0, -1]) + (u[0, 1, 0] + u[0, -1, 0])) + (u[1, 0, 0] + u[-1, 0, 0])
    return u[0, 0, 0] + r * (neighbours - 6 * u[0, 0, 0])


def heat3d_step_cpu(out, inp, region, r) -> None:
    """Run one step on NumPy arrays (arguments validated). Mutates ``out``."""
    apply_to_regions(heat3d, (out,), (inp,), (r,), [region])


def fill_periodic_faces(array) -> None:
    """Copy each owned face of a padded 3D array (halo width 1) into the opposite ghost face, over the
    owned part of the other two axes (edges and corners untouched). Mutates ``array``."""
    owned = slice(1, -1)
    for axis in range(3):
        n = array.shape[axis] - 2

        def at(index):
            return tuple(index if a == axis else owned for a in range(3))

        array[at(0)] = array[at(n)]
        array[at(n + 1)] = array[at(1)]
