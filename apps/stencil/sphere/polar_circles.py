"""Whole latitude circles for the polar filter: which rows, which damping factors, the NumPy filter.

The filter itself (why, and the formula of the factors ``S_k``) is described in
:mod:`apps.stencil.sphere.polar_filter`. This module holds what both of its implementations share --
the per-tile :class:`FilterPlan`, how a rank obtains whole circles (:func:`local_gather`,
:func:`row_gather`), and the NumPy filter of whole circles (:func:`filter_circles`, the CPU path
and the GPU's host-staged path) -- so that :mod:`apps.stencil.sphere.polar_filter` (the dispatcher)
and :mod:`apps.stencil.sphere.polar_filter_gpu` both import it and not each other.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from apps.stencil.sphere.parameters import SphereParameters, mirrored_center_rows
from hpcgpu.arch import is_device_array


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

    def use_filtered(self) -> np.ndarray:
        """int8 array, shape (3 * len(rows),): 1 where field ``f`` is filtered on filtered row ``r``
        (index ``f * len(rows) + r``: the circle order of the device filters), else 0."""
        flags = [[s is not None for s in row] for row in self.factors]
        return np.array(flags, dtype=np.int8).reshape(len(self.rows), 3).T.reshape(-1)

    def filtered_rows_like(self, array: Any) -> Any:
        """``filtered_rows`` in the array library of ``array`` (a CuPy copy is built once per device and cached)."""
        if not is_device_array(array):
            return self.filtered_rows
        import cupy  # only for CuPy arrays: this module imports without CuPy

        key = ("filtered_rows", cupy.cuda.runtime.getDevice())
        if key not in self.device_tables:
            self.device_tables[key] = cupy.asarray(self.filtered_rows)
        return self.device_tables[key]


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


def row_gather(row_comm, width: int) -> Callable[[np.ndarray], np.ndarray]:
    """Row gather over the ranks of one latitude band, ordered by longitude (``key=coords[1]``).

    Parameters
    ----------
    row_comm : hpcgpu.Communicator or None
        The band's communicator (collective: built once per model).
    width : int
        This rank's number of columns (the last axis of every block it contributes).

    Returns
    -------
    callable
        ``gather(block)`` with ``block`` of shape (..., width) -> (..., nx): every rank's block side by
        side in longitude order (an all-gather through the job's transport on host buffers).
    """
    if row_comm is None or row_comm.size == 1:
        return local_gather
    from hpcgpu.transport import collectives

    movers = collectives(row_comm, on_device=False)
    widths = [int(w) for w in row_comm.mpi.allgather(int(width))]

    def gather(block: np.ndarray) -> np.ndarray:
        block = np.ascontiguousarray(block)
        lead = block.shape[:-1]
        per_column = int(np.prod(lead, dtype=np.int64))
        counts = [per_column * w for w in widths]
        gathered = movers.allgatherv(block.reshape(-1), np.empty(sum(counts), dtype=block.dtype), counts)
        pieces = np.split(gathered, np.cumsum(counts)[:-1])
        return np.concatenate([piece.reshape(lead + (w,)) for piece, w in zip(pieces, widths)], axis=-1)

    return gather


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


__all__ = ["FilterPlan", "damping_factors", "filter_circles", "local_gather", "make_filter_plan", "row_gather"]
