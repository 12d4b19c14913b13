"""One explicit step of 3D diffusion with the 7-point stencil over a region of a padded local array.

In padded local indices ``(k, j, i)`` (axis order z, y, x), a cell of the region becomes ::

    out = u + r * (neighbours - 6 * u),
    neighbours = ((u[k, j, i+1] + u[k, j, i-1]) + (u[k, j+1, i] + u[k, j-1, i])) + (u[k+1, j, i] + u[k-1, j, i])

evaluated in the data dtype in exactly this order (``6 * u`` and the product with ``r`` rounded in the
data dtype, no FMA), so CPU, GPU and any split of the region give bitwise the same ``out``. No MPI
happens here: the caller fills the periodic ghost cells (halo exchange) before each step, or, for a
box that is one block along every axis, asks the step to fill ``out``'s face ghosts itself
(``periodic_ghosts=True``: the same values a periodic exchange without corners copies, written by
the kernel that computes them, with no second pass over the faces).
"""

from __future__ import annotations

from apps.stencil.heat3d.problem import check_stability
from apps.stencil.jacobi.arrays import check_padded_pair, check_region, is_cupy
from hpcgpu.errors import ConfigurationError


def heat3d_step(
    out,
    inp,
    region,
    r: float,
    *,
    threads_x: int | None = None,
    threads_y: int | None = None,
    planes_per_thread: int | None = None,
    periodic_ghosts: bool = False,
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
    periodic_ghosts : bool
        Also fill ``out``'s six face ghosts periodically from the new values (``out[0] = out[nz]``,
        ``out[nz + 1] = out[1]`` over the owned rows and columns, and likewise along y and x; edge
        and corner ghosts untouched), as a periodic halo exchange without corners of a box that is
        one block along every axis would. ``region`` must then be the whole owned block,
        ``(1, nz + 1, 1, ny + 1, 1, nx + 1)``.

    Notes
    -----
    On the GPU the kernel is launched on CuPy's current stream and the call returns without
    synchronising.
    """
    check_padded_pair(out, inp, ndim=3, kernel="heat3d_step")
    bounds = check_region(region, inp.shape, kernel="heat3d_step")
    r = check_stability(r)
    periodic_ghosts = bool(periodic_ghosts)
    whole = tuple(v for n in inp.shape for v in (1, n - 1))
    if periodic_ghosts and bounds != whole:
        raise ConfigurationError(
            f"heat3d_step: periodic_ghosts=True needs the whole owned block {whole} as the region, found {bounds}"
        )
    if is_cupy(inp):
        from apps.stencil.heat3d.gpu import heat3d_step_gpu

        heat3d_step_gpu(out, inp, bounds, r, threads_x, threads_y, planes_per_thread, periodic_ghosts)
        return
    from apps.stencil.heat3d.stencil import fill_periodic_faces, heat3d_step_cpu

    heat3d_step_cpu(out, inp, bounds, r)
    if periodic_ghosts:
        fill_periodic_faces(out)


def n_lattice_updates(region) -> int:
    """Number of cells one step over ``region`` updates."""
    k0, k1, j0, j1, i0, i1 = (int(b) for b in region)
    return max(k1 - k0, 0) * max(j1 - j0, 0) * max(i1 - i0, 0)
