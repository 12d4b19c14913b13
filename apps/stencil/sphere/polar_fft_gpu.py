"""The fused polar filter on a GPU: transform, damp, transform back and combine in one kernel.

The whole-circles device filter of :mod:`apps.stencil.sphere.polar_filter_gpu` runs five steps over
the polar rows (gather, R2C/D2Z transform, product with the damping factors, Z2D transform, combine):
at 0.25 deg (1440 x 720, 723 filtered (field, row) circles) they take about 53 us per stage on one
H200, half of it in the two cuFFT transforms, for about 110 MB of traffic. Here one thread block
filters two circles at once, from the increments to the combined fields, with the transforms in
shared memory; the traffic is the minimum -- read the increment, ``base`` and ``stage`` of a circle,
write ``out`` -- about 33 MB at 0.25 deg.

Per block (``polar_fft_filter_combine``), for circles x and y (two (field, row) pairs whose field is
filtered on that row; a block may hold only x):

1. ``z = x + i y`` in float64, from the raw increments ``dt*L`` (no gather: read in place);
2. ``Z = DFT(z)``, a mixed-radix Stockham FFT in shared memory (radices 4, 2, 3, 5, in
   that order; twiddles ``exp(-2 pi i j / n)`` from a table computed on the host in extended
   precision, exact at multiples of a quarter turn);
3. the damped spectrum of both circles at once: with ``S^x_k, S^y_k`` the factors of
   :func:`apps.stencil.sphere.polar_circles.damping_factors` (symmetric: ``S_(n-k) = S_k``),
   ``W_k = (S^x_k + S^y_k)/2 Z_k + (S^x_k - S^y_k)/2 conj(Z_(n-k))`` is ``S^x X_k + i S^y Y_k``, the
   transforms of the filtered x and y;
4. ``conj(DFT(conj(W))) = n * (x' + i y')``, the same FFT again;
5. ``out = a*base + b*(stage + value)`` with ``value = (real)(x' / n)`` on circle x (``y'`` on y),
   the division in float64 and the cast as in the cuFFT path.

Circles whose field is not filtered on that row (``use_filtered == 0``) get a block of their own that
combines the raw increment, as the CPU and the cuFFT path do.

The transforms are compiled with FMA contraction (no CPU result to match bit for bit; a fused
multiply-add rounds once); the combine rounds operation by operation (``__dadd_rn`` etc.), so
circles that are not filtered get the CPU's bits.

Accuracy: the transforms are in float64 for both field dtypes (the cuFFT path transforms fp32 fields
in fp32). The result agrees with NumPy's ``irfft(rfft(x) * S)`` to a few units of float64 rounding of
the increment (about 1e-15 of its magnitude at n = 1440), like cuFFT's; it is not bitwise either's.
The arithmetic is deterministic: the same inputs give the same bits in every run and inside a CUDA
graph.

Sizes: ``n`` (the circle length, ``nx``) must factor into primes up to 5 and its two float64 complex
buffers (32 n bytes) must fit one block's shared memory (n up to 7,264 on an H200); other circles use
the cuFFT path (:func:`fused_filter_supports`).

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

from apps.stencil.sphere.polar_circles import FilterPlan

RADICES = (4, 2, 3, 5)
"""The butterflies the kernel has, in the order a length is factored into them."""

THREADS = 256
"""Threads per block (one block per pair of circles); 1024 // THREADS blocks fit an SM's registers."""

_SOURCE = r"""
struct cplx { double x, y; };

__device__ __forceinline__ cplx cmul(cplx a, cplx b) { return {a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x}; }
__device__ __forceinline__ cplx cadd(cplx a, cplx b) { return {a.x + b.x, a.y + b.y}; }
__device__ __forceinline__ cplx csub(cplx a, cplx b) { return {a.x - b.x, a.y - b.y}; }
__device__ __forceinline__ cplx cscale(double s, cplx a) { return {s * a.x, s * a.y}; }
__device__ __forceinline__ cplx minus_i(cplx a) { return {a.y, -a.x}; }   // -i a, exact

// The combine's arithmetic without contraction (the module is compiled with FMA contraction for the
// transforms): out = a*base + b*(stage + value) rounded operation by operation, as on the CPU.
__device__ __forceinline__ double add_rn(double x, double y) { return __dadd_rn(x, y); }
__device__ __forceinline__ double mul_rn(double x, double y) { return __dmul_rn(x, y); }
__device__ __forceinline__ float add_rn(float x, float y) { return __fadd_rn(x, y); }
__device__ __forceinline__ float mul_rn(float x, float y) { return __fmul_rn(x, y); }
template <typename real>
__device__ __forceinline__ real combine(real a, real base, real b, real stage, real value)
{
    return add_rn(mul_rn(a, base), mul_rn(b, add_rn(stage, value)));
}

// cos(2 pi / 5), cos(4 pi / 5), sin(2 pi / 5), sin(4 pi / 5), sin(2 pi / 3), correctly rounded.
#define C1_5 0.30901699437494745
#define C2_5 (-0.8090169943749475)
#define S1_5 0.9510565162951535
#define S2_5 0.5877852522924731
#define S_3 0.8660254037844386

// One Stockham stage of radix R over n points, src -> dst, with `span` the product of the radices
// before it: butterfly j takes src[j + r n/R] (r < R), multiplies by w^(k0 r n/(span R)) with
// k0 = j mod span, transforms (length R), and writes dst[(j / span) span R + k0 + k span].
// w[j] = exp(-2 pi i j / n).
template <int R>
__device__ void stockham_stage(const cplx* __restrict__ src, cplx* __restrict__ dst, const cplx* __restrict__ w,
                               const int n, const int span)
{
    const int butterflies = n / R;
    const int stride = n / (span * R);
    for (int j = (int)threadIdx.x; j < butterflies; j += (int)blockDim.x) {
        const int group = j / span;
        const int k0 = j - group * span;
        cplx v[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            v[r] = src[j + r * butterflies];
            if (r > 0) {
                v[r] = cmul(v[r], w[k0 * r * stride]);
            }
        }
        const int d = group * span * R + k0;
        if (R == 2) {
            dst[d] = cadd(v[0], v[1]);
            dst[d + span] = csub(v[0], v[1]);
        } else if (R == 4) {
            // Length-4 DFT; multiplying by -i is (y, -x), exact.
            const cplx s02 = cadd(v[0], v[2]), d02 = csub(v[0], v[2]);
            const cplx s13 = cadd(v[1], v[3]), d13 = csub(v[1], v[3]);
            dst[d] = cadd(s02, s13);
            dst[d + span] = {d02.x + d13.y, d02.y - d13.x};
            dst[d + 2 * span] = csub(s02, s13);
            dst[d + 3 * span] = {d02.x - d13.y, d02.y + d13.x};
        } else if (R == 3) {
            const cplx sum = cadd(v[1], v[2]);
            const cplx rotated = minus_i(cscale(S_3, csub(v[1], v[2])));
            const cplx middle = csub(v[0], cscale(0.5, sum));
            dst[d] = cadd(v[0], sum);
            dst[d + span] = cadd(middle, rotated);
            dst[d + 2 * span] = csub(middle, rotated);
        } else {   // R == 5
            const cplx a1 = cadd(v[1], v[4]), b1 = csub(v[1], v[4]);
            const cplx a2 = cadd(v[2], v[3]), b2 = csub(v[2], v[3]);
            const cplx m1 = cadd(v[0], cadd(cscale(C1_5, a1), cscale(C2_5, a2)));
            const cplx m2 = cadd(v[0], cadd(cscale(C2_5, a1), cscale(C1_5, a2)));
            const cplx n1 = minus_i(cadd(cscale(S1_5, b1), cscale(S2_5, b2)));
            const cplx n2 = minus_i(csub(cscale(S2_5, b1), cscale(S1_5, b2)));
            dst[d] = cadd(v[0], cadd(a1, a2));
            dst[d + span] = cadd(m1, n1);
            dst[d + 2 * span] = cadd(m2, n2);
            dst[d + 3 * span] = csub(m2, n2);
            dst[d + 4 * span] = csub(m1, n1);
        }
    }
}

// The forward DFT of a (n points) in shared memory, ping-ponging with b; returns the buffer holding it.
__device__ cplx* stockham_fft(cplx* a, cplx* b, const cplx* __restrict__ w, const int* __restrict__ radices,
                              const int n_stages, const int n)
{
    int span = 1;
    for (int s = 0; s < n_stages; ++s) {
        const int radix = radices[s];
        switch (radix) {
            case 2: stockham_stage<2>(a, b, w, n, span); break;
            case 3: stockham_stage<3>(a, b, w, n, span); break;
            case 4: stockham_stage<4>(a, b, w, n, span); break;
            default: stockham_stage<5>(a, b, w, n, span); break;
        }
        span *= radix;
        __syncthreads();
        cplx* t = a; a = b; b = t;
    }
    return a;
}

// Polar circles: out = a*base + b*(stage + value) on the circles of this block (see the module
// docstring). pairs[2 * block + {0, 1}] are circle indices f * n_rows + r (the second -1 if none);
// a circle's increment is inc_f[rows[r], i0 + c], c < n.
template <typename real>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) polar_fft_filter_combine(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    const real* inc_h, const real* inc_u, const real* inc_v,
    const int* __restrict__ pairs, const int* __restrict__ rows, const signed char* __restrict__ use_filtered,
    const double* __restrict__ factors, const cplx* __restrict__ w, const int* __restrict__ radices,
    const int n_stages, const real a, const real b, const int n_rows, const int i0, const int n,
    const int n_columns)
{
    extern __shared__ cplx buffers[];
    const int first = pairs[2 * blockIdx.x];
    const int second = pairs[2 * blockIdx.x + 1];
    const int circles = second < 0 ? 1 : 2;
    real* outs[2]; const real* bases[2]; const real* stages[2]; const real* incs[2]; long long offsets[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        const int item = q == 0 ? first : (second < 0 ? first : second);
        const int f = item / n_rows;
        offsets[q] = (long long)rows[item % n_rows] * n_columns + i0;
        outs[q] = f == 0 ? out_h : (f == 1 ? out_u : out_v);
        bases[q] = f == 0 ? base_h : (f == 1 ? base_u : base_v);
        stages[q] = f == 0 ? h : (f == 1 ? u : v);
        incs[q] = f == 0 ? inc_h : (f == 1 ? inc_u : inc_v);
    }
    if (use_filtered[first] == 0) {
        // Not filtered here: combine the raw increment (one circle per such block).
        for (int c = (int)threadIdx.x; c < n; c += (int)blockDim.x) {
            const long long k = offsets[0] + c;
            outs[0][k] = combine(a, bases[0][k], b, stages[0][k], incs[0][k]);
        }
        return;
    }
    cplx* one = buffers;
    cplx* two = buffers + n;
    for (int c = (int)threadIdx.x; c < n; c += (int)blockDim.x) {
        one[c] = {(double)incs[0][offsets[0] + c], circles == 2 ? (double)incs[1][offsets[1] + c] : 0.0};
    }
    __syncthreads();
    cplx* spectrum = stockham_fft(one, two, w, radices, n_stages, n);
    cplx* other = spectrum == one ? two : one;
    const int modes = n / 2 + 1;
    const double* sx = factors + (long long)first * modes;
    const double* sy = circles == 2 ? factors + (long long)second * modes : sx;
    for (int k = (int)threadIdx.x; k < n; k += (int)blockDim.x) {
        const int mirror = k == 0 ? 0 : n - k;
        const int mode = k < mirror ? k : mirror;
        const double mean = (sx[mode] + sy[mode]) * 0.5;
        const double half_difference = (sx[mode] - sy[mode]) * 0.5;
        const cplx z = spectrum[k];
        const cplx zc = {spectrum[mirror].x, -spectrum[mirror].y};
        const double re = mean * z.x + half_difference * zc.x;
        const double im = mean * z.y + half_difference * zc.y;
        other[k] = {re, -im};   // conj(W): the inverse transform as a forward one
    }
    __syncthreads();
    const cplx* result = stockham_fft(other, spectrum, w, radices, n_stages, n);
    const double length = (double)n;
    for (int c = (int)threadIdx.x; c < n; c += (int)blockDim.x) {
        const cplx z = result[c];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            if (q == 1 && circles == 1) {
                break;
            }
            const long long k = offsets[q] + c;
            const real value = (real)((q == 0 ? z.x : -z.y) / length);
            outs[q][k] = combine(a, bases[q][k], b, stages[q][k], value);
        }
    }
}
"""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}
_MAX_SHARED_BYTES = 227 * 1024
"""Shared memory one block may opt in to on Hopper (sm_90)."""


def radices(n: int) -> tuple[int, ...] | None:
    """The kernel's factorisation of a circle of ``n`` points (:data:`RADICES` in order), or None when
    ``n`` has a prime factor above 5."""
    factors = []
    for radix in RADICES:
        while n % radix == 0:
            factors.append(radix)
            n //= radix
    return tuple(factors) if n == 1 else None


def fused_filter_supports(n: int) -> bool:
    """Whether :func:`fused_filter_and_combine` takes circles of ``n`` points: prime factors up to 5
    and 32 n bytes of shared memory (two float64 complex buffers) within a block's limit."""
    return n >= 1 and radices(n) is not None and 32 * n <= _MAX_SHARED_BYTES


def twiddles(n: int) -> np.ndarray:
    """``exp(-2 pi i j / n)`` for j < n, complex128, shape (n,): computed in extended precision
    (``numpy.longdouble``) and rounded once; exactly 1, -i, -1, i at the quarter turns."""
    j = np.arange(n, dtype=np.longdouble)
    angle = 2 * np.longdouble("3.141592653589793238462643383279502884") * j / n
    cosine, sine = np.cos(angle).astype(np.float64), (-np.sin(angle)).astype(np.float64)
    quarter = (4 * np.arange(n)) % n == 0
    cosine[quarter], sine[quarter] = np.round(cosine[quarter]), np.round(sine[quarter])
    return cosine + 1j * sine


def circle_pairs(plan: FilterPlan) -> np.ndarray:
    """The circles of each block, int32 shape (n_blocks, 2): filtered circles two by two, each with
    the next row's circle of the same field (similar magnitudes, so rounding of one barely touches
    the other), the second -1 for a circle left over; then one block per unfiltered circle.

    Circle ``f * n_rows + r`` is field ``f`` on filtered row ``r`` (:meth:`FilterPlan.use_filtered`).
    """
    n_rows = len(plan.rows)
    use_filtered = plan.use_filtered()
    blocks = []
    for field in range(3):
        filtered = [field * n_rows + r for r in range(n_rows) if use_filtered[field * n_rows + r]]
        blocks += [(filtered[i], filtered[i + 1] if i + 1 < len(filtered) else -1) for i in range(0, len(filtered), 2)]
    blocks += [(k, -1) for k in range(3 * n_rows) if not use_filtered[k]]
    return np.array(blocks, dtype=np.int32).reshape(-1, 2)


@dataclasses.dataclass(frozen=True)
class FusedFilterTables:
    """The fused kernel's device tables for one plan (:func:`fused_tables`).

    Attributes
    ----------
    pairs : cupy int32 array, shape (n_blocks, 2)
        :func:`circle_pairs`.
    twiddles : cupy complex128 array, shape (n,)
        :func:`twiddles` of the circle length.
    radices : cupy int32 array, shape (n_stages,)
        :func:`radices` of the circle length.
    """

    pairs: Any
    twiddles: Any
    radices: Any


def fused_tables(plan: FilterPlan) -> FusedFilterTables:
    """The plan's fused-kernel tables on the current CuPy device, built once per plan and device
    (cached on ``plan.device_tables``)."""
    import cupy

    key = ("fused", cupy.cuda.runtime.getDevice())
    tables = plan.device_tables.get(key)
    if tables is None:
        n = plan.n_columns
        tables = FusedFilterTables(
            pairs=cupy.asarray(circle_pairs(plan)),
            twiddles=cupy.asarray(twiddles(n)),
            radices=cupy.asarray(np.array(radices(n), dtype=np.int32)),
        )  # fmt: skip
        plan.device_tables[key] = tables
    return tables


@functools.lru_cache(maxsize=None)
def _kernel(dtype: np.dtype, shared_bytes: int, threads: int) -> Any:
    """The compiled kernel for ``dtype`` and ``threads`` per block (registers capped so that 1024
    threads fit an SM), allowed ``shared_bytes`` of dynamic shared memory."""
    import cupy

    name = f"polar_fft_filter_combine<{_REAL[dtype]}>"
    options = ("--fmad=true", f"-DTHREADS={threads}", f"-DMIN_BLOCKS={max(1, 1024 // threads)}")
    module = cupy.RawModule(code=_SOURCE, options=options, name_expressions=(name,))
    kernel = module.get_function(name)
    if shared_bytes > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = shared_bytes
    return kernel


def fused_filter_and_combine(
    out: Sequence[Any], base: Sequence[Any], stage: Sequence[Any], increment: Sequence[Any],
    a: float, b: float, plan: FilterPlan, device_tables: Any,
) -> None:
    """Filter every polar circle of this tile and combine, one launch on the current CuPy stream.

    Parameters
    ----------
    out, base, stage, increment : sequences of 3 CuPy arrays (h, u, v), shape (n_rows + 2w, n_cols + 2w)
        Padded C-contiguous fields of one dtype (float32 or float64); ``increment`` holds ``dt*L`` on
        the filtered rows. Only the owned columns of the filtered rows of ``out`` are written.
    a, b : float
        The stage weights.
    plan : FilterPlan
        Whole circles on this tile (``column_start == 0``), ``fused_filter_supports(plan.n_columns)``.
    device_tables : DeviceFilterTables
        The plan's rows, flags and damping factors on the device.

    Allocates nothing after the first call for a plan (capturable in a CUDA graph); returns None.
    """
    dtype = np.dtype(out[0].dtype)
    n = plan.n_columns
    if not fused_filter_supports(n):
        raise ValueError(f"the fused polar filter needs circles of at most {_MAX_SHARED_BYTES // 32} points whose "
                         f"prime factors are at most 5; found {n}")
    tables = fused_tables(plan)
    shared_bytes = 32 * n
    kernel = _kernel(dtype, shared_bytes, THREADS)
    real = dtype.type
    kernel(
        (tables.pairs.shape[0],), (THREADS,),
        (*out, *base, *stage, *increment, tables.pairs, device_tables.rows, device_tables.use_filtered,
         device_tables.factors, tables.twiddles, tables.radices, np.int32(tables.radices.size), real(a), real(b),
         np.int32(len(plan.rows)), np.int32(plan.halo_width), np.int32(n), np.int32(out[0].shape[1])),
        shared_mem=shared_bytes,
    )  # fmt: skip


__all__ = ["RADICES", "THREADS", "FusedFilterTables", "circle_pairs", "fused_filter_and_combine",
           "fused_filter_supports", "fused_tables", "radices", "twiddles"]
