"""The polar filter on a GPU: the same damping factors and arithmetic as the NumPy filter.

:func:`filter_and_combine_gpu` finishes the filtered (polar) rows of one SSP-RK3 stage for CuPy
fields, in one of two ways:

* **Whole latitude circles on this rank** (the row communicator has size 1, i.e. the decomposition
  splits latitude only; ``gather`` is :func:`apps.stencil.sphere.polar_circles.local_gather`): the
  polar rows' increments stay on the device. Per stage that is five steps whatever the number of
  polar rows: one kernel gathers the increments of h, u and v on all polar rows into one
  ``(3 * n_rows, n)`` block, one batched ``cupy.fft.rfft`` (cuFFT) transforms every row, one
  multiply applies ``S_k`` (a row of ones where a field is not filtered on that row), one batched
  ``cupy.fft.irfft`` transforms back, and one kernel combines
  ``out = a*base + b*(stage + S(increment))``, taking the raw increment where the field is not
  filtered (as the CPU does, which copies it through). No host round trip, no synchronisation.
* **Rows split across ranks** (longitude decomposed): the increments of the polar rows are copied to
  the host, gathered in the row communicator and filtered by the CPU code
  (:func:`apps.stencil.sphere.polar_circles.filter_circles`, the identical NumPy FFT on identical
  circles), then the owned columns go back to the device for the combine kernel. This is correct for
  any decomposition but slower: it synchronises the compute stream and moves the polar rows through
  PCIe and MPI three times per step. Prefer ``--dims N,1`` (latitude bands) on GPUs.

The cuFFT transforms round differently from NumPy's pocketfft (relative differences ~1e-16 of the
increment), so the device path agrees with the CPU to rounding, not bitwise; the host-staged path
uses the CPU's FFT. The combine kernel is compiled with ``--fmad=false`` (the CPU's rounding).

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.sphere.polar_circles import FilterPlan, filter_circles, local_gather

_SOURCE = r"""
// values[f][r][c] = increment_f[rows[r]][i0 + c]: the polar rows' increments of h, u, v in one block
// of shape (3, n_rows, n), C order.
template <typename real>
__global__ void polar_gather(real* values, const real* inc_h, const real* inc_u, const real* inc_v,
                             const int* rows, const int n_rows, const int i0, const int n, const int n_columns)
{
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int r = (int)blockIdx.y;
    const int f = (int)blockIdx.z;
    if (c >= n) {
        return;
    }
    const real* increment = f == 0 ? inc_h : (f == 1 ? inc_u : inc_v);
    values[((long long)f * n_rows + r) * n + c] = increment[(long long)rows[r] * n_columns + i0 + c];
}

// Polar rows: out = a*base + b*(stage + value) on rows[r], columns [i0, i0 + n) of the three fields,
// value = filtered[f][r][c] where use_filtered[f * n_rows + r] != 0, else raw[f][r][c] (both (3, n_rows, n)).
template <typename real>
__global__ void polar_combine(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    const real* raw, const real* filtered, const signed char* use_filtered, const int* rows,
    const real a, const real b, const int n_rows, const int i0, const int n, const int n_columns)
{
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int r = (int)blockIdx.y;
    const int f = (int)blockIdx.z;
    if (c >= n) {
        return;
    }
    const long long k = (long long)rows[r] * n_columns + i0 + c;
    const long long m = ((long long)f * n_rows + r) * n + c;
    const real value = use_filtered[f * n_rows + r] != 0 ? filtered[m] : raw[m];
    real* out = f == 0 ? out_h : (f == 1 ? out_u : out_v);
    const real* base = f == 0 ? base_h : (f == 1 ? base_u : base_v);
    const real* stage = f == 0 ? h : (f == 1 ? u : v);
    out[k] = a * base[k] + b * (stage[k] + value);
}
"""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}
_THREADS = 256


@functools.lru_cache(maxsize=None)
def _module() -> Any:
    """The compiled CuPy RawModule holding the gather and combine kernels for both dtypes (built once)."""
    import cupy

    names = tuple(f"{kernel}<{real}>" for kernel in ("polar_gather", "polar_combine") for real in _REAL.values())
    return cupy.RawModule(code=_SOURCE, options=("--fmad=false",), name_expressions=names)


@dataclasses.dataclass(frozen=True)
class DeviceFilterTables:
    """A :class:`FilterPlan` on the device.

    Attributes
    ----------
    filtered_rows : cupy int8 array, shape (n_rows + 2w,)
        The plan's row flags (for the stage kernel).
    rows : cupy int32 array, shape (n_filtered_rows,)
        Padded indices of the filtered rows.
    use_filtered : cupy int8 array, shape (3 * n_filtered_rows,)
        1 where field ``f`` is filtered on filtered row ``r`` (index ``f * n_filtered_rows + r``).
    factors : cupy float64 array, shape (3 * n_filtered_rows, nx//2 + 1)
        S_k of each (field, row), in the same order; ones where the field is not filtered.
    """

    filtered_rows: Any
    rows: Any
    use_filtered: Any
    factors: Any


def device_tables(plan: FilterPlan) -> DeviceFilterTables:
    """The plan's device arrays on the current CuPy device, built once per plan and device."""
    import cupy

    key = ("tables", cupy.cuda.runtime.getDevice())
    tables = plan.device_tables.get(key)
    if tables is None:
        n_rows = len(plan.rows)
        n_modes = next(s.size for row in plan.factors for s in row if s is not None)
        factors = np.ones((3, n_rows, n_modes))
        use_filtered = np.zeros((3, n_rows), dtype=np.int8)
        for row_index, row_factors in enumerate(plan.factors):
            for field, s in enumerate(row_factors):
                if s is not None:
                    factors[field, row_index] = s
                    use_filtered[field, row_index] = 1
        tables = DeviceFilterTables(
            filtered_rows=plan.filtered_rows_like(cupy.empty(0)),
            rows=cupy.asarray(np.array(plan.rows, dtype=np.int32)),
            use_filtered=cupy.asarray(use_filtered.reshape(-1)),
            factors=cupy.asarray(factors.reshape(3 * n_rows, n_modes)),
        )  # fmt: skip
        plan.device_tables[key] = tables
    return tables


def filter_and_combine_gpu(
    out: Sequence[Any], base: Sequence[Any], stage: Sequence[Any], increment: Sequence[Any],
    a: float, b: float, plan: FilterPlan, gather: Callable[[np.ndarray], np.ndarray],
) -> None:
    """:func:`apps.stencil.sphere.polar_filter.filter_and_combine` for CuPy fields; in place.

    Arguments as there (padded C-contiguous CuPy arrays of one dtype). Runs on the current CuPy
    stream. With a ``gather`` other than ``local_gather`` it is collective over the row communicator
    and synchronises the current stream (host staging, see the module docstring). Returns None.
    """
    import cupy

    if not plan.rows:
        return
    tables = device_tables(plan)
    dtype = np.dtype(out[0].dtype)
    real = dtype.type
    module = _module()
    n_rows, n, n_columns = len(plan.rows), plan.n_columns, out[0].shape[1]
    w = plan.halo_width
    grid = (-(-n // _THREADS), n_rows, 3)
    sizes = (np.int32(n_rows), np.int32(w), np.int32(n), np.int32(n_columns))
    # (3, n_filtered_rows, n): the raw increments dt*L of the polar rows' owned columns.
    raw = cupy.empty((3, n_rows, n), dtype=dtype)
    module.get_function(f"polar_gather<{_REAL[dtype]}>")(grid, (_THREADS,), (raw, *increment, tables.rows, *sizes))
    if gather is local_gather:
        if plan.column_start != 0:
            raise ValueError(f"local_gather needs whole latitude circles, but this tile starts at column "
                             f"{plan.column_start}; pass the row communicator's gather (mpi_row_gather).")
        # Every (field, row) in one batch; NumPy's order of operations: rfft in the field dtype, the
        # product with the float64 factors, irfft, then the cast back to the field dtype.
        spectrum = cupy.fft.rfft(raw.reshape(3 * n_rows, n), axis=-1) * tables.factors
        filtered = cupy.fft.irfft(spectrum, n=n, axis=-1).astype(dtype, copy=False)
        use_filtered = tables.use_filtered
    else:
        # The increments were written by kernels on the current stream: finish them before the host
        # copy and the MPI allgather (MPI knows nothing of CUDA streams).
        cupy.cuda.get_current_stream().synchronize()
        block = np.ascontiguousarray(cupy.asnumpy(raw).transpose(1, 0, 2))
        filtered = cupy.asarray(np.ascontiguousarray(filter_circles(gather(block), plan, dtype).transpose(1, 0, 2)))
        use_filtered = tables.use_filtered  # filter_circles already copied unfiltered fields through
    module.get_function(f"polar_combine<{_REAL[dtype]}>")(
        grid, (_THREADS,),
        (*out, *base, *stage, raw, filtered, use_filtered, tables.rows, real(a), real(b), *sizes),
    )  # fmt: skip


__all__ = ["DeviceFilterTables", "device_tables", "filter_and_combine_gpu"]
