"""Fourier polar filter: the time step is set by the grid spacing at the cutoff latitude, not the poles.

Zonal grid spacing ``a cos(lat) dlon`` shrinks toward the poles; the fastest zonal gravity wave of
the C-grid on a row has frequency ``c * 2 |sin(k dlon / 2)| / (a cos(lat) dlon)`` for zonal
wavenumber k. Poleward of the cutoff latitude ``lat_c`` the *increments* ``dt * L`` of h, u and v of
each SSP-RK3 stage are Fourier-filtered along the latitude circle with the factors

    S_k(lat) = min(1, cos(lat) / (cos(lat_c) |sin(k dlon / 2)|)),      S_0 = 1

so every mode's frequency times S_k is at most the 2-grid-interval frequency at ``lat_c``: the
explicit step is stable with the CFL limit of the cutoff latitude (Takacs & Balgovind 1983;
Arakawa & Lamb 1977 use the same factor). The zonal mean (k = 0) is untouched, so the filter keeps
mass (to rounding). Each field is filtered at its own latitude (h and u at the cell-centre rows,
v at the face rows). Equatorward of ``lat_c`` nothing changes.

Whole circles and decompositions
--------------------------------
The filter needs whole latitude circles. The ranks of one latitude band (same ``grid.coords[0]``)
form a *row communicator* (``comm.split(color=coords[0], key=coords[1])``); each rank
allgathers its pieces of the polar rows' increments in longitude order, so *every* rank of the row
holds the full circle, filters it (one NumPy FFT per row and field, the same call on the same
numbers whatever the decomposition), and keeps its own columns. The result is bitwise independent
of how longitude is split.

On a GPU (CuPy fields) the same filter runs in :mod:`apps.stencil.sphere.polar_filter_gpu`: on the
device with cuFFT (persistent buffers and plans: capturable in a CUDA graph) when the rank holds
whole circles (row communicator of size 1), else staged through the host and the NumPy filter (see there).

Modules: :mod:`apps.stencil.sphere.polar_circles` holds the plan, the gathers and the NumPy filter of
whole circles; this module is the entry point (:func:`filter_and_combine`): it runs the CPU path
itself and hands CuPy fields to :mod:`apps.stencil.sphere.polar_filter_gpu`. Both import
``polar_circles`` and neither is imported by it, so there is no import cycle.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.sphere.polar_circles import (
    FilterPlan,
    damping_factors,
    filter_circles,
    local_gather,
    make_filter_plan,
    row_gather,
)
from apps.stencil.sphere.polar_filter_gpu import filter_and_combine_gpu
from hpcgpu.arch import is_device_array


def filter_and_combine(
    out: Sequence[Any], base: Sequence[Any], stage: Sequence[Any], increment: Sequence[Any],
    a: float, b: float, plan: FilterPlan, gather: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Finish the filtered rows of a stage: ``out = a*base + b*(stage + S(increment))``; in place.

    Collective over the row communicator behind ``gather`` (every rank of a latitude band holds the
    same filtered rows, so all call it with equal block shapes; a band with no polar rows skips it).

    Parameters
    ----------
    out, base, stage, increment : sequence of 3 padded arrays (h, u, v)
        As for :func:`apps.stencil.sphere.stage.sphere_stage`, which filled ``increment`` on the
        filtered rows.
    a, b : float
        The stage weights.
    plan : FilterPlan
    gather : callable
        ``gather(block) -> circle``: block shape (n_filtered_rows, 3, n_columns) of this rank's owned
        columns, returned as (n_filtered_rows, 3, nx) in longitude order (:func:`row_gather`).

    Notes
    -----
    CuPy fields go to :func:`apps.stencil.sphere.polar_filter_gpu.filter_and_combine_gpu`: on the
    device when ``gather`` is :func:`local_gather` (whole circles on this rank), else through the host.
    """
    if not plan.rows:
        return
    if is_device_array(out[0]):
        filter_and_combine_gpu(out, base, stage, increment, a, b, plan, gather)
        return
    w, n = plan.halo_width, plan.n_columns
    owned = slice(w, w + n)
    block = np.stack([np.stack([inc[j, owned] for inc in increment]) for j in plan.rows])
    filtered = filter_circles(gather(block), plan, out[0].dtype)
    dtype = out[0].dtype.type
    real_a, real_b = dtype(a), dtype(b)
    for row_index, j in enumerate(plan.rows):
        for field in range(3):
            mine = filtered[row_index, field]
            out[field][j, owned] = real_a * base[field][j, owned] + real_b * (stage[field][j, owned] + mine)


__all__ = ["FilterPlan", "damping_factors", "filter_and_combine", "filter_circles", "local_gather", "make_filter_plan", "row_gather"]
