"""The polar filter on a GPU: the same damping factors and arithmetic as the NumPy filter.

:func:`filter_and_combine_gpu` finishes the filtered (polar) rows of one SSP-RK3 stage for CuPy
fields, in one of two ways:

* **Whole latitude circles on this rank** (the row communicator has size 1, i.e. the decomposition
  splits latitude only; ``gather`` is :func:`apps.stencil.sphere.polar_circles.local_gather`): the
  polar rows' increments stay on the device, and a stage allocates nothing and never synchronises
  with the host, so the lat-lon step can be captured as a CUDA graph (``--graph``). Circles of
  lengths the fused kernel takes (:data:`DEVICE_FILTER`, :data:`FUSED_FASTER_UP_TO`) are filtered
  and combined in one launch, :func:`apps.stencil.sphere.polar_fft_gpu.fused_filter_and_combine`;
  the others as follows. The work
  buffers and the two cuFFT plans are built once per plan, device and dtype
  (:func:`device_workspace`, cached on ``plan.device_tables`` like :func:`device_tables`). Per stage,
  whatever the number of polar rows:

  1. one kernel gathers the increments of h, u and v on all polar rows into ``raw``, one
     ``(3 * n_rows, n)`` block;
  2. one batched forward transform (``cupy.cuda.cufft.Plan1d``: R2C for float32, D2Z for float64)
     into ``spectrum`` (complex64 / complex128);
  3. ``product = spectrum * S_k`` (``cupy.multiply(..., out=)``; the factors are float64, so the
     product is complex128 for both dtypes; a row of ones where a field is not filtered on that row);
  4. one batched Z2D inverse transform of ``product`` into ``inverse`` (float64); cuFFT's C2R
     overwrites its input, which is fine: ``product`` is rewritten by step 3 before every use;
  5. one kernel combines ``out = a*base + b*(stage + S(increment))`` with the filtered value
     ``(real)(inverse / n)``: CuPy ``irfft``'s normalisation (``out /= n``: true division by the
     Python int n, in float64) and ``astype``'s cast, per value, instead of two passes over the
     block; it takes the raw increment where the field is not filtered (as the CPU does, which
     copies it through).

  These are exactly the operations of ``cupy.fft.irfft(cupy.fft.rfft(raw, axis=-1) * factors,
  n=n, axis=-1).astype(dtype)`` in CuPy 14 (the same plan types and batch, the same multiply, the
  same division by n in float64, the same cast), minus its copies and allocations, so the results
  are bitwise those of that formula (tests/apps/stencil/sphere/test_sphere_graph.py).
* **Rows split across ranks** (longitude decomposed): the increments of the polar rows are copied to
  the host, gathered in the row communicator and filtered by the CPU code
  (:func:`apps.stencil.sphere.polar_circles.filter_circles`, the identical NumPy FFT on identical
  circles), then the owned columns go back to the device for the combine kernel. This is correct for
  any decomposition but slower: it synchronises the compute stream and moves the polar rows through
  PCIe and MPI three times per step, and it cannot be captured as a CUDA graph. Prefer
  ``--dims N,1`` (latitude bands) on GPUs.

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
from apps.stencil.sphere.polar_fft_gpu import fused_filter_and_combine, fused_filter_supports

DEVICE_FILTER = {"method": "auto"}
"""How whole circles are filtered on the device: ``"auto"`` (the default: the fused kernel of
:mod:`apps.stencil.sphere.polar_fft_gpu` for circles it supports of at most
:data:`FUSED_FASTER_UP_TO` points, else cuFFT), ``"fused"`` (the fused kernel wherever it supports
the length) or ``"cufft"`` (always the five-step cuFFT path below). They agree to float64 rounding,
not bitwise."""

FUSED_FASTER_UP_TO = 2880
"""The longest circle for which ``"auto"`` takes the fused kernel. Filter time per stage on one H200
(fp64 / fp32, fused against cuFFT): 720 points 12.8 / 17.5 us (fp64), 1440 points 30.8 / 52.3 us and
28.7 / 44.3 us, 2880 points 150 / 171 us (fp64); 3600 points 250 / 246 us and 234 / 192 us (fewer
blocks per SM at 115 KB of shared memory each)."""

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
// value = (real)(filtered[f][r][c] / divisor) where use_filtered[f * n_rows + r] != 0, else raw[f][r][c]
// (both (3, n_rows, n)). With the unnormalised float64 inverse transform as ``filtered`` and divisor n this
// is irfft's normalisation (true division in float64) and astype's cast, done here instead of in two
// passes over the block; with filtered values of the field dtype and divisor 1 it is the value itself
// (x / 1.0 and float -> double -> float are exact).
template <typename real, typename stored>
__global__ void polar_combine(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    const real* raw, const stored* filtered, const double divisor, const signed char* use_filtered,
    const int* rows, const real a, const real b, const int n_rows, const int i0, const int n, const int n_columns)
{
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int r = (int)blockIdx.y;
    const int f = (int)blockIdx.z;
    if (c >= n) {
        return;
    }
    const long long k = (long long)rows[r] * n_columns + i0 + c;
    const long long m = ((long long)f * n_rows + r) * n + c;
    const real value = use_filtered[f * n_rows + r] != 0 ? (real)((double)filtered[m] / divisor) : raw[m];
    real* out = f == 0 ? out_h : (f == 1 ? out_u : out_v);
    const real* base = f == 0 ? base_h : (f == 1 ? base_u : base_v);
    const real* stage = f == 0 ? h : (f == 1 ? u : v);
    out[k] = a * base[k] + b * (stage[k] + value);
}
"""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}
_COMBINE_NAMES = ("polar_combine<double, double>", "polar_combine<float, double>", "polar_combine<float, float>")
_THREADS = 256


@functools.lru_cache(maxsize=None)
def _module() -> Any:
    """The compiled CuPy RawModule holding the gather and combine kernels for both dtypes (built once)."""
    import cupy

    names = tuple(f"polar_gather<{real}>" for real in _REAL.values()) + _COMBINE_NAMES
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
        use_filtered = plan.use_filtered()
        factors = np.ones((3, n_rows, n_modes))
        for row_index, row_factors in enumerate(plan.factors):
            for field, s in enumerate(row_factors):
                if s is not None:
                    factors[field, row_index] = s
        tables = DeviceFilterTables(
            filtered_rows=plan.filtered_rows_like(cupy.empty(0)),
            rows=cupy.asarray(np.array(plan.rows, dtype=np.int32)),
            use_filtered=cupy.asarray(use_filtered),
            factors=cupy.asarray(factors.reshape(3 * n_rows, n_modes)),
        )  # fmt: skip
        plan.device_tables[key] = tables
    return tables


@dataclasses.dataclass(frozen=True)
class DeviceFilterWorkspace:
    """The persistent buffers and cuFFT plans of the whole-circles device filter, for one dtype.

    Built once per plan, device and dtype (:func:`device_workspace`): a stage then allocates nothing,
    so it can be captured as a CUDA graph, which bakes in these buffers' addresses.

    Attributes
    ----------
    raw : cupy array of the field dtype, shape (3 * n_rows, n)
        The polar rows' raw increments dt*L, (field, row) pairs in order (the gather kernel's output).
    spectrum : cupy complex64 (float32 fields) or complex128 array, shape (3 * n_rows, n//2 + 1)
        The forward transform of ``raw``.
    product : cupy complex128 array, shape (3 * n_rows, n//2 + 1)
        ``spectrum * factors``; the inverse transform's input, overwritten by it (scratch).
    inverse : cupy float64 array, shape (3 * n_rows, n)
        The inverse transform of ``product``, not yet divided by n: the combine kernel divides and
        casts each value it reads.
    forward, backward : cupy.cuda.cufft.Plan1d
        Length n, batch 3 * n_rows: R2C (float32) or D2Z (float64); Z2D.
    """

    raw: Any
    spectrum: Any
    product: Any
    inverse: Any
    forward: Any
    backward: Any


def device_workspace(plan: FilterPlan, dtype: Any) -> DeviceFilterWorkspace:
    """The whole-circles filter's buffers and cuFFT plans for fields of ``dtype`` on the current CuPy
    device, built once per plan, device and dtype (cached on ``plan.device_tables``).

    Call it outside a CUDA graph capture (the first stage of an eager step, or the model's
    ``prepare``): it allocates device memory and plans the transforms. The plan types are those
    ``cupy.fft.rfft`` / ``irfft`` choose for the same arrays (CuPy 14 ``cupy/fft/_fft.py``).
    """
    import cupy
    from cupy.cuda import cufft

    dtype = np.dtype(dtype)
    key = ("workspace", cupy.cuda.runtime.getDevice(), dtype.str)
    workspace = plan.device_tables.get(key)
    if workspace is None:
        if dtype not in _REAL:
            raise TypeError(f"the device polar filter takes float32 or float64 fields, not {dtype}")
        batch, n = 3 * len(plan.rows), plan.n_columns
        modes = n // 2 + 1
        complex_dtype = np.complex64 if dtype == np.float32 else np.complex128
        forward_type = cufft.CUFFT_R2C if dtype == np.float32 else cufft.CUFFT_D2Z
        workspace = DeviceFilterWorkspace(
            raw=cupy.empty((batch, n), dtype=dtype),
            spectrum=cupy.empty((batch, modes), dtype=complex_dtype),
            # The factors are float64: CuPy promotes complex64 * float64 to complex128 (as NumPy does).
            product=cupy.empty((batch, modes), dtype=np.complex128),
            inverse=cupy.empty((batch, n), dtype=np.float64),
            forward=cufft.Plan1d(n, forward_type, batch),
            backward=cufft.Plan1d(n, cufft.CUFFT_Z2D, batch),
        )  # fmt: skip
        plan.device_tables[key] = workspace
    return workspace


def _filter_whole_circles(workspace: DeviceFilterWorkspace, factors: Any) -> None:
    """``workspace.inverse = n * irfft(rfft(workspace.raw) * factors, n)`` row by row, with CuPy 14's
    arithmetic and no allocation (module docstring, steps 2-4; the combine kernel does irfft's
    division by n and astype's cast); in place, returns None."""
    import cupy
    from cupy.cuda import cufft

    workspace.forward.fft(workspace.raw, workspace.spectrum, cufft.CUFFT_FORWARD)
    cupy.multiply(workspace.spectrum, factors, out=workspace.product)
    # Z2D overwrites its input (product): nothing reads product again before step 3 rewrites it.
    workspace.backward.fft(workspace.product, workspace.inverse, cufft.CUFFT_INVERSE)


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
    gather_kernel = module.get_function(f"polar_gather<{_REAL[dtype]}>")
    if gather is local_gather:
        if plan.column_start != 0:
            raise ValueError(f"local_gather needs whole latitude circles, but this tile starts at column "
                             f"{plan.column_start}; pass the row communicator's gather (row_gather).")
        # Every (field, row) in one batch, in persistent buffers (capturable: no allocation, no host
        # synchronisation); NumPy's order of operations: the forward transform in the field dtype,
        # the product with the float64 factors, the inverse transform, then the cast to the field dtype.
        method = DEVICE_FILTER["method"]
        if method != "cufft" and fused_filter_supports(n) and (method == "fused" or n <= FUSED_FASTER_UP_TO):
            fused_filter_and_combine(out, base, stage, increment, a, b, plan, tables)
            return
        workspace = device_workspace(plan, dtype)
        gather_kernel(grid, (_THREADS,), (workspace.raw, *increment, tables.rows, *sizes))
        _filter_whole_circles(workspace, tables.factors)
        # irfft's normalisation ``out /= n`` (true division by the Python int n, in float64) and the
        # cast to the field dtype happen per value in the combine kernel: the same bits, one pass.
        raw, filtered, divisor = workspace.raw, workspace.inverse, n
    else:
        # (3, n_filtered_rows, n): the raw increments dt*L of the polar rows' owned columns.
        raw = cupy.empty((3, n_rows, n), dtype=dtype)
        gather_kernel(grid, (_THREADS,), (raw, *increment, tables.rows, *sizes))
        # The increments were written by kernels on the current stream: finish them before the host
        # copy and the MPI allgather (MPI knows nothing of CUDA streams).
        cupy.cuda.get_current_stream().synchronize()
        block = np.ascontiguousarray(cupy.asnumpy(raw).transpose(1, 0, 2))
        # filter_circles copies unfiltered fields through; the combine takes raw there anyway.
        filtered = cupy.asarray(np.ascontiguousarray(filter_circles(gather(block), plan, dtype).transpose(1, 0, 2)))
        divisor = 1
    stored = _REAL[np.dtype(filtered.dtype)]
    module.get_function(f"polar_combine<{_REAL[dtype]}, {stored}>")(
        grid, (_THREADS,),
        (*out, *base, *stage, raw, filtered, np.float64(divisor), tables.use_filtered, tables.rows,
         real(a), real(b), *sizes),
    )  # fmt: skip


__all__ = ["DEVICE_FILTER", "FUSED_FASTER_UP_TO", "DeviceFilterTables", "DeviceFilterWorkspace", "device_tables", "device_workspace", "filter_and_combine_gpu"]
