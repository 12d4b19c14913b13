"""The polar filter on a GPU: the same damping factors and arithmetic as the NumPy filter.

:func:`filter_and_combine_gpu` finishes the filtered (polar) rows of one SSP-RK3 stage for CuPy
fields, in one of two ways:

* **Whole latitude circles on this rank** (the row communicator has size 1, i.e. the decomposition
  splits latitude only; ``gather`` is :func:`apps.stencil.sphere.polar_filter.local_gather`): the
  polar rows' increments stay on the device; each field's filtered rows go through one batched
  ``cupy.fft.rfft`` / multiply by ``S_k`` / ``cupy.fft.irfft`` (cuFFT), and one kernel combines
  ``out = a*base + b*(stage + S(increment))``. No host round trip, no synchronisation.
* **Rows split across ranks** (longitude decomposed): the increments of the polar rows are copied to
  the host, gathered in the row communicator and filtered by the CPU code
  (:func:`apps.stencil.sphere.polar_filter.filter_circles`, the identical NumPy FFT on identical
  circles), then the owned columns go back to the device for the combine kernel. This is correct for
  any decomposition but slower: it synchronises the compute stream and moves the polar rows through
  PCIe and MPI three times per step. Prefer ``--dims N,1`` (latitude bands) on GPUs.

The cuFFT transforms round differently from NumPy's pocketfft (relative differences ~1e-16 of the
increment), so the device path agrees with the CPU to rounding, not bitwise; the host-staged path
uses the CPU's FFT.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.sphere.polar_filter import FilterPlan, filter_circles, local_gather


@dataclasses.dataclass(frozen=True)
class DeviceFilterTables:
    """A :class:`FilterPlan` on the device.

    Attributes
    ----------
    filtered_rows : cupy int8 array, shape (n_rows + 2w,)
        The plan's row flags (for the stage kernel).
    rows : cupy int32 array, shape (n_filtered_rows,)
        Padded indices of the filtered rows.
    selections : tuple of 3 (cupy int64 array or None)
        Per field (h, u, v): positions in ``rows`` where that field is filtered; None when none is.
    factors : tuple of 3 (cupy float64 array or None)
        Per field: S_k of the selected rows, shape (n_selected, nx//2 + 1).
    """

    filtered_rows: Any
    rows: Any
    selections: tuple
    factors: tuple


def device_tables(plan: FilterPlan) -> DeviceFilterTables:
    """The plan's device arrays on the current CuPy device, built once per plan and device."""
    import cupy

    key = ("cupy", cupy.cuda.runtime.getDevice())
    tables = plan.device_tables.get(key)
    if tables is None:
        selections, factors = [], []
        for field in range(3):
            chosen = [index for index, row_factors in enumerate(plan.factors) if row_factors[field] is not None]
            if chosen:
                selections.append(cupy.asarray(np.array(chosen, dtype=np.int64)))
                factors.append(cupy.asarray(np.stack([plan.factors[index][field] for index in chosen])))
            else:
                selections.append(None)
                factors.append(None)
        tables = DeviceFilterTables(
            filtered_rows=cupy.asarray(plan.filtered_rows),
            rows=cupy.asarray(np.array(plan.rows, dtype=np.int32)),
            selections=tuple(selections), factors=tuple(factors),
        )  # fmt: skip
        plan.device_tables[key] = tables
    return tables


def filter_and_combine_gpu(
    out: Sequence[Any], base: Sequence[Any], stage: Sequence[Any], increment: Sequence[Any],
    a: float, b: float, plan: FilterPlan, gather: Callable[[np.ndarray], np.ndarray],
) -> None:
    """:func:`apps.stencil.sphere.polar_filter.filter_and_combine` for CuPy fields; in place.

    Arguments as there (padded CuPy arrays of one dtype). Runs on the current CuPy stream. With a
    ``gather`` other than ``local_gather`` it is collective over the row communicator and
    synchronises the current stream (host staging, see the module docstring).
    """
    import cupy

    from apps.stencil.sphere.stage_gpu import polar_combine_gpu

    if not plan.rows:
        return
    tables = device_tables(plan)
    dtype = np.dtype(out[0].dtype)
    w, n = plan.halo_width, plan.n_columns
    owned = slice(w, w + n)
    # (3, n_filtered_rows, n): the raw increments dt*L of the polar rows' owned columns.
    values = cupy.stack([inc[tables.rows, owned] for inc in increment])
    if gather is local_gather:
        if plan.column_start != 0:
            raise ValueError(f"local_gather needs whole latitude circles, but this tile starts at column "
                             f"{plan.column_start}; pass the row communicator's gather (mpi_row_gather).")
        for field in range(3):
            selection = tables.selections[field]
            if selection is None:
                continue
            field_values = values[field]
            spectrum = cupy.fft.rfft(field_values[selection], axis=-1) * tables.factors[field]
            field_values[selection] = cupy.fft.irfft(spectrum, n=n, axis=-1).astype(dtype, copy=False)
    else:
        # The increments were written by kernels on the current stream: finish them before the host
        # copy and the MPI allgather (MPI knows nothing of CUDA streams).
        cupy.cuda.get_current_stream().synchronize()
        block = np.ascontiguousarray(cupy.asnumpy(values).transpose(1, 0, 2))
        filtered = filter_circles(gather(block), plan, dtype)
        values = cupy.asarray(np.ascontiguousarray(filtered.transpose(1, 0, 2)))
    real = dtype.type
    polar_combine_gpu(out, base, stage, cupy.ascontiguousarray(values), tables.rows, real(a), real(b), w)


__all__ = ["DeviceFilterTables", "device_tables", "filter_and_combine_gpu"]
