"""One explicit step of 3D diffusion with the 7-point stencil over a region of a padded local array.

In padded local indices ``(k, j, i)`` (axis order z, y, x), a cell of the region becomes ::

    out = u + r * (neighbours - 6 * u),
    neighbours = ((u[k, j, i+1] + u[k, j, i-1]) + (u[k, j+1, i] + u[k, j-1, i])) + (u[k+1, j, i] + u[k-1, j, i])

evaluated in the data dtype in exactly this order (``6 * u`` and the product with ``r`` rounded in the
data dtype, no FMA), so CPU, GPU and any split of the region give bitwise the same ``out``. No MPI
happens here: the caller fills the periodic ghost cells (halo exchange) before each step.
"""

from __future__ import annotations

from apps.stencil.heat3d.problem import check_stability
from apps.stencil.jacobi.arrays import check_padded_pair, check_region, is_cupy


def heat3d_step(
    out,
    inp,
    region,
    r: float,
    *,
    threads_x: int | None = None,
    threads_y: int | None = None,
    planes_per_thread: int | None = None,
) -> None:
    """Update ``out[k0:k1, j0:j1, i0:i1]`` from ``inp`` with one diffusion step. Mutates ``out``.

    Parameters
    ----------
    out, inp : numpy.ndarray or cupy.ndarray, shape (nz_local + 2, ny_local + 2, nx_local + 2)
        Padded local arrays (halo width 1), float32 or float64, same shape, dtype and strides, unit
        stride along x, not overlapping; ``inp``'s ghost cells filled.
    region : (int, int, int, int, int, int)
        ``(k0, k1, j0, j1, i0, i1)``, half-open bounds in padded indices, each within
        ``[1, padded extent - 1]``.
    r : float
        Diffusion number ``kappa dt / dx^2`` (dimensionless), ``0 <= r <= 1/6`` for stability; larger
        values raise :class:`hpcgpu.errors.NumericalError`.
    threads_x, threads_y, planes_per_thread : int, optional
        GPU launch shape (block ``threads_x x threads_y``, planes each thread marches through);
        ignored on the CPU. Defaults in :data:`apps.stencil.heat3d.gpu.DEFAULT_LAUNCH`.

    Notes
    -----
    On the GPU the kernel is launched on CuPy's current stream and the call returns without
    synchronising.
    """
    check_padded_pair(out, inp, ndim=3, kernel="heat3d_step")
    bounds = check_region(region, inp.shape, kernel="heat3d_step")
    r = check_stability(r)
    if is_cupy(inp):
        from apps.stencil.heat3d.gpu import heat3d_step_gpu

        heat3d_step_gpu(out, inp, bounds, r, threads_x, threads_y, planes_per_thread)
        return
    from apps.stencil.heat3d.cpu import heat3d_step_cpu

    heat3d_step_cpu(out, inp, bounds, r)


def n_lattice_updates(region) -> int:
    """Number of cells one step over ``region`` updates."""
    k0, k1, j0, j1, i0, i1 = (int(b) for b in region)
    return max(k1 - k0, 0) * max(j1 - j0, 0) * max(i1 - i0, 0)
