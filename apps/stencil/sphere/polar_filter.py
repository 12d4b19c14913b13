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
form a *row communicator* (``comm.mpi.Split(color=coords[0], key=coords[1])``); each rank
allgathers its pieces of the polar rows' increments in longitude order, so *every* rank of the row
holds the full circle, filters it (one NumPy FFT per row and field, the same call on the same
numbers whatever the decomposition), and keeps its own columns. The result is bitwise independent
of how longitude is split.

On a GPU (CuPy fields) the same filter runs in :mod:`apps.stencil.sphere.polar_filter_gpu`: on the
device with ``cupy.fft`` when the rank holds whole circles (row communicator of size 1), else staged
through the host and this module's NumPy filter (see there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.sphere.parameters import SphereParameters, mirrored_center_rows


def damping_factors(latitude: float, nx: int, cutoff_latitude: float) -> np.ndarray:
    """S_k for k = 0 .. nx//2 at ``latitude`` (rad) for a cutoff ``cutoff_latitude``; shape (nx//2 + 1,).

    All ones equatorward of the cutoff; at a pole face (cos = 0) only k = 0 survives.
    """
    k = np.arange(nx // 2 + 1, dtype=np.float64)
    sine = np.abs(np.sin(0.5 * k * (2.0 * math.pi / nx)))
    ratio = abs(math.cos(latitude)) / math.cos(cutoff_latitude)
    with np.errstate(divide="ignore"):
        factors = np.where(sine > 0, np.minimum(1.0, ratio / np.where(sine > 0, sine, 1.0)), 1.0)
    return factors


@dataclasses.dataclass(frozen=True)
class FilterPlan:
    """Which padded rows of a tile are filtered, and the damping factors of each field on them.

    Attributes
    ----------
    filtered_rows : int8 array, shape (n_rows + 2w,)
        1 on owned rows where h/u or v lies poleward of the cutoff (passed to the stage kernel).
    rows : tuple of int
        Padded indices of those rows.
    factors : tuple of (S_h, S_u, S_v)
        Per filtered row, each array shape (nx//2 + 1,) or None when that field is not filtered there.
    halo_width, column_start, n_columns : int
        Where the tile's owned columns sit in the circle.
    """

    filtered_rows: np.ndarray
    rows: tuple
    factors: tuple
    halo_width: int
    column_start: int
    n_columns: int
    device_tables: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """Cache of the plan's device arrays (filled by :mod:`apps.stencil.sphere.polar_filter_gpu`)."""

    def filtered_rows_like(self, array: Any) -> Any:
        """``filtered_rows`` in the array library of ``array`` (a CuPy copy is built once and cached)."""
        if type(array).__module__.startswith("cupy"):
            from apps.stencil.sphere.polar_filter_gpu import device_tables

            return device_tables(self).filtered_rows
        return self.filtered_rows


def make_filter_plan(parameters: SphereParameters, row_start: int, n_rows: int, column_start: int,
                     n_columns: int, halo_width: int = 1) -> FilterPlan:
    """Build the :class:`FilterPlan` of the tile owning rows ``[row_start, row_start + n_rows)``."""
    p = parameters
    flags = np.zeros(n_rows + 2 * halo_width, dtype=np.int8)
    rows, factors = [], []
    for local in range(n_rows):
        j = row_start + local
        center = float(p.center_latitudes(mirrored_center_rows(np.array([j]), p.ny))[0])
        face = float(p.face_latitudes(np.array([j]))[0])
        center_filtered = abs(center) > p.filter_latitude
        face_filtered = abs(face) > p.filter_latitude
        if not (center_filtered or face_filtered):
            continue
        flags[halo_width + local] = 1
        rows.append(halo_width + local)
        s_center = damping_factors(center, p.nx, p.filter_latitude) if center_filtered else None
        s_face = damping_factors(face, p.nx, p.filter_latitude) if face_filtered else None
        factors.append((s_center, s_center, s_face))
    return FilterPlan(flags, tuple(rows), tuple(factors), halo_width, column_start, n_columns)


def local_gather(block: np.ndarray) -> np.ndarray:
    """Row gather of a tile that owns whole latitude circles (one rank in longitude)."""
    return block


def mpi_row_gather(row_comm) -> Callable[[np.ndarray], np.ndarray]:
    """Row gather over an mpi4py row communicator whose ranks are ordered by longitude (key=coords[1])."""
    if row_comm is None or row_comm.Get_size() == 1:
        return local_gather

    def gather(block: np.ndarray) -> np.ndarray:
        return np.concatenate(row_comm.allgather(np.ascontiguousarray(block)), axis=-1)

    return gather


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
        columns, returned as (n_filtered_rows, 3, nx) in longitude order (:func:`mpi_row_gather`).

    Notes
    -----
    CuPy fields go to :func:`apps.stencil.sphere.polar_filter_gpu.filter_and_combine_gpu`: on the
    device when ``gather`` is :func:`local_gather` (whole circles on this rank), else through the host.
    """
    if not plan.rows:
        return
    if type(out[0]).__module__.startswith("cupy"):
        from apps.stencil.sphere.polar_filter_gpu import filter_and_combine_gpu

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


def filter_circles(circle: np.ndarray, plan: FilterPlan, dtype: Any) -> np.ndarray:
    """Filter whole latitude circles and keep this tile's columns (NumPy; the CPU path and GPU staging).

    Parameters
    ----------
    circle : array, shape (n_filtered_rows, 3, nx)
        Raw increments of (h, u, v) on the plan's rows, whole circles in longitude order.
    plan : FilterPlan
    dtype : the field dtype of the result

    Returns
    -------
    array, shape (n_filtered_rows, 3, n_columns), dtype ``dtype``
        The filtered increments of the tile's owned columns (unfiltered fields copied through).
    """
    dtype = np.dtype(dtype)
    start, n = plan.column_start, plan.n_columns
    result = np.empty((len(plan.rows), 3, n), dtype=dtype)
    for row_index, factors in enumerate(plan.factors):
        for field, s in enumerate(factors):
            values = circle[row_index, field]
            if s is not None:
                # One FFT per row and field: the same call on the same full circle on every decomposition.
                values = np.fft.irfft(np.fft.rfft(values) * s, n=values.size).astype(dtype, copy=False)
            result[row_index, field] = values[start:start + n]
    return result


__all__ = ["FilterPlan", "damping_factors", "filter_and_combine", "filter_circles", "local_gather", "make_filter_plan", "mpi_row_gather"]
