"""CPU (Numba) implementation of the heat3d step; called by :func:`apps.stencil.heat3d.step.heat3d_step`.

``prange`` runs over (plane, row) pairs so that thin boxes still spread over all threads; the inner
loop walks one row through slices indexed from 0 (no negative-index wrap check, so LLVM vectorises
it). The arithmetic matches the GPU kernel bit for bit: no FMA contraction with ``fastmath`` off, and
``r`` and ``six`` arrive in the data dtype so float32 data is never promoted.
"""

from __future__ import annotations

from numba import njit, prange


@njit(parallel=True, cache=True)
def _step_rows(out, inp, k0, k1, j0, j1, i0, i1, r, six):
    n_rows = j1 - j0
    length = i1 - i0
    for pair in prange((k1 - k0) * n_rows):
        k = k0 + pair // n_rows
        j = j0 + pair % n_rows
        center = inp[k, j, i0:i1]
        east = inp[k, j, i0 + 1 : i1 + 1]
        west = inp[k, j, i0 - 1 : i1 - 1]
        south = inp[k, j + 1, i0:i1]
        north = inp[k, j - 1, i0:i1]
        above = inp[k + 1, j, i0:i1]
        below = inp[k - 1, j, i0:i1]
        result = out[k, j, i0:i1]
        for i in range(length):
            # Association order fixed for every backend: ((x+ + x-) + (y+ + y-)) + (z+ + z-).
            neighbours = ((east[i] + west[i]) + (south[i] + north[i])) + (above[i] + below[i])
            result[i] = center[i] + r * (neighbours - six * center[i])


def heat3d_step_cpu(out, inp, region, r) -> None:
    """Run one step on NumPy arrays (arguments validated). Mutates ``out``."""
    k0, k1, j0, j1, i0, i1 = region
    if k1 > k0 and j1 > j0 and i1 > i0:
        dtype = out.dtype.type
        _step_rows(out, inp, k0, k1, j0, j1, i0, i1, dtype(r), dtype(6.0))


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
