"""GPU (CuPy RawKernel) implementations of the Jacobi sweep; called by :func:`~apps.stencil.jacobi.sweep.jacobi_sweep`.

Variants (all compute bitwise the same ``out``; they differ only in how threads map to cells):

``simple``
    One thread per cell, 2D blocks of ``threads_x x threads_y``; five loads per cell, the neighbours
    mostly hit L1/L2. The baseline (277 GLUPS fp32 on an H200 at 16384^2).
``march``
    Row marching: each thread owns one column of a tile of ``rows_per_thread`` rows. It loads the
    ``rows_per_thread + 2`` values of its column up front (all loads in flight at once, each input value
    read ~once per tile), keeps them in registers, and takes its west/east neighbours from the adjacent
    lanes with warp shuffles; only the first and last lane of a warp load one extra value per row.
``march_vec2`` / ``march_vec4``
    Row marching where each thread owns 2 or 4 adjacent columns, loaded and stored as one aligned
    vector (float2/float4, double2/2x double2). Needs the row pitch and the width to be multiples of
    the vector width and both buffers aligned to it; a padded width of ``nx_local + 2`` is even when
    ``nx_local`` is, so ``march_vec2`` fits the usual case.

``auto`` picks ``march_vec2`` where its alignment holds and ``march`` otherwise.

Bitwise agreement with the CPU kernel: every kernel is compiled with ``--fmad=false`` so NVCC never
contracts a multiply-add into an FMA; the float32 adds and the multiply are inline PTX ``add.rn.f32`` /
``mul.rn.f32`` (no ``.ftz``), because CuPy compiles every kernel with ``-ftz=true``, which flushes float32
subnormals to zero where the CPU keeps them (the Jacobi front leaves values near 1e-40 behind it; flushed,
they changed the final checksum). The kernel and evaluates ``0.25 * ((east + west) + (south + north))`` in
the data dtype, as the Numba kernel does. The residual is accumulated in float64 (per thread, then a
warp-shuffle and shared-memory block reduction, then one ``atomicAdd(double)`` per block), so it agrees
with the CPU value to rounding but not bitwise (atomic order varies).
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.errors import ConfigurationError

GPU_VARIANTS = ("simple", "march", "march_vec2", "march_vec4")
_VECTOR_WIDTH = {"march": 1, "march_vec2": 2, "march_vec4": 4}
DEFAULT_LAUNCH = {
    # variant: (threads_x, threads_y, rows_per_thread)
    "simple": (32, 8, 1),
    "march": (128, 1, 8),
    "march_vec2": (128, 1, 8),
    "march_vec4": (64, 1, 8),
}
_MAX_ROWS_PER_THREAD = 64
_COMPILE_OPTIONS = ("--fmad=false",)

_SOURCE = r"""
// Jacobi 5-point sweep on a padded 2D array with row pitch `pitch` (elements).
// out[j, i] = T(0.25) * ((in[j, i+1] + in[j, i-1]) + (in[j+1, i] + in[j-1, i]))
// for j0 <= j < j1, i0 <= i < i1, skipping the (up to two) fixed columns fixed0/fixed1 (-1: none).
// Compiled with --fmad=false: the same rounding as the CPU kernel, bit for bit.

// IEEE adds and multiplies that keep subnormals whatever -ftz says (CuPy always passes -ftz=true) and
// are never contracted into an FMA: the CPU's rounding, bit for bit.
__device__ __forceinline__ float add_rn(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The update of one cell: 0.25 * ((east + west) + (south + north)).
template <typename T>
__device__ __forceinline__ T jacobi_update(T east, T west, T south, T north) {
    return mul_rn(T(0.25), add_rn(add_rn(east, west), add_rn(south, north)));
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
    T v[V];
};

// Adds `value` summed over the block to *residual with one atomicAdd. Every thread of the block must
// call it (it synchronises), and the block must consist of whole warps.
__device__ __forceinline__ void add_block_sum(double value, double* residual) {
    __shared__ double warp_sums[32];
    const unsigned full = 0xffffffffu;
    const int thread = threadIdx.y * blockDim.x + threadIdx.x;
    const int lane = thread & 31;
    const int warp = thread >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(full, value, offset);
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x * blockDim.y) >> 5;
        value = lane < n_warps ? warp_sums[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(full, value, offset);
        if (lane == 0 && value != 0.0) atomicAdd(residual, value);
    }
}

template <typename T, bool RESIDUAL>
__global__ void jacobi_simple(T* __restrict__ out, const T* __restrict__ inp, long long pitch,
                              int j0, int j1, int i0, int i1, int fixed0, int fixed1,
                              double* __restrict__ residual) {
    const int i = i0 + blockIdx.x * blockDim.x + threadIdx.x;
    const int j = j0 + blockIdx.y * blockDim.y + threadIdx.y;
    double sum_of_squares = 0.0;
    // No early return: with RESIDUAL every thread must reach the block reduction.
    if (i < i1 && j < j1 && i != fixed0 && i != fixed1) {
        const long long c = (long long)j * pitch + i;
        const T new_value = jacobi_update(inp[c + 1], inp[c - 1], inp[c + pitch], inp[c - pitch]);
        out[c] = new_value;
        if (RESIDUAL) {
            const double difference = (double)new_value - (double)inp[c];
            sum_of_squares = difference * difference;
        }
    }
    if (RESIDUAL) add_block_sum(sum_of_squares, residual);
}

// Row marching. Thread (x, y) of block (bx, by) owns the V columns of "group" g = i0 / V + bx *
// blockDim.x + x (columns g*V .. g*V+V-1) in the R rows starting at tile_j0. blockDim.x is a multiple
// of 32, so a warp shares threadIdx.y (hence its rows) and holds 32 consecutive groups: a lane's west
// and east neighbours are in the registers of the lanes beside it.
template <typename T, int V, int R, bool RESIDUAL>
__global__ void jacobi_march(T* __restrict__ out, const T* __restrict__ inp, long long pitch,
                             int width, int j0, int j1, int i0, int i1, int fixed0, int fixed1,
                             double* __restrict__ residual) {
    typedef Pack<T, V> P;
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int group = i0 / V + blockIdx.x * blockDim.x + threadIdx.x;
    const bool owns_group = group * V < i1;
    // Threads past the end still load (a clamped, valid address) because every lane must take part in
    // the shuffles; clamping to the last group of the row keeps each owning lane's neighbours right.
    const int first_column = min(group, width / V - 1) * V;
    const int west_column = max(first_column - 1, 0);
    const int east_column = min(first_column + V, width - 1);
    const int tile_j0 = j0 + (blockIdx.y * blockDim.y + threadIdx.y) * R;

    // All loads first, so R + 2 vector loads per thread are in flight together. Rows past the region
    // are clamped to row j1 (a ghost or unused row that exists in memory) and never used.
    P column[R + 2];
#pragma unroll
    for (int t = 0; t < R + 2; ++t) {
        const int j = min(tile_j0 - 1 + t, j1);
        column[t] = *reinterpret_cast<const P*>(inp + (long long)j * pitch + first_column);
    }
    T edge[R];  // lane 0: west neighbour of its first column; lane 31: east neighbour of its last
#pragma unroll
    for (int t = 0; t < R; ++t) {
        const long long row = (long long)min(tile_j0 + t, j1) * pitch;
        edge[t] = T(0);
        if (lane == 0) edge[t] = inp[row + west_column];
        if (lane == 31) edge[t] = inp[row + east_column];
    }

    double sum_of_squares = 0.0;
#pragma unroll
    for (int t = 0; t < R; ++t) {
        const int j = tile_j0 + t;
        if (j >= j1) break;  // uniform across the warp (same threadIdx.y), so the shuffles stay full
        const P& above = column[t];
        const P& center = column[t + 1];
        const P& below = column[t + 2];
        const T from_west_lane = __shfl_up_sync(full, center.v[V - 1], 1);
        const T from_east_lane = __shfl_down_sync(full, center.v[0], 1);
        const T west_of_first = lane == 0 ? edge[t] : from_west_lane;
        const T east_of_last = lane == 31 ? edge[t] : from_east_lane;
        P result;
        bool active[V];
        bool all_active = true;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const int i = first_column + e;
            const T west = e == 0 ? west_of_first : center.v[e > 0 ? e - 1 : 0];
            const T east = e == V - 1 ? east_of_last : center.v[e < V - 1 ? e + 1 : 0];
            result.v[e] = jacobi_update(east, west, below.v[e], above.v[e]);
            active[e] = owns_group && i >= i0 && i < i1 && i != fixed0 && i != fixed1;
            all_active = all_active && active[e];
            if (RESIDUAL && active[e]) {
                const double difference = (double)result.v[e] - (double)center.v[e];
                sum_of_squares += difference * difference;
            }
        }
        T* destination = out + (long long)j * pitch + first_column;
        if (all_active) {
            *reinterpret_cast<P*>(destination) = result;
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e)
                if (active[e]) destination[e] = result.v[e];
        }
    }
    if (RESIDUAL) add_block_sum(sum_of_squares, residual);
}
"""


def _type_name(dtype) -> str:
    return {"float32": "float", "float64": "double"}[np.dtype(dtype).name]


def _kernel_name(variant: str, dtype, rows_per_thread: int, with_residual: bool) -> str:
    residual = "true" if with_residual else "false"
    if variant == "simple":
        return f"jacobi_simple<{_type_name(dtype)}, {residual}>"
    vector_width = _VECTOR_WIDTH[variant]
    return f"jacobi_march<{_type_name(dtype)}, {vector_width}, {int(rows_per_thread)}, {residual}>"


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    """Compile (once per process; CuPy caches the binary per device and on disk) one instantiation."""
    import cupy

    module = cupy.RawModule(code=_SOURCE, options=_COMPILE_OPTIONS, name_expressions=(name,))
    return module.get_function(name)


def cuda_source() -> str:
    """The CUDA C++ source of all variants (for inspection and offline compilation with nvcc)."""
    return _SOURCE


def resolve_launch(variant, arrays, threads_x, threads_y, rows_per_thread):
    """Resolve ``auto`` and default launch parameters; check they fit the variant and the ``arrays``.

    Returns
    -------
    (variant, threads_x, threads_y, rows_per_thread)
    """
    if variant == "auto":
        fits = all(vector_alignment_problem(array, 2) is None for array in arrays)
        variant = "march_vec2" if fits else "march"
    if variant not in GPU_VARIANTS:
        raise ConfigurationError(
            f"jacobi_sweep: unknown GPU variant {variant!r}; expected 'auto' or one of {GPU_VARIANTS}"
        )
    default_x, default_y, default_rows = DEFAULT_LAUNCH[variant]
    threads_x = default_x if threads_x is None else int(threads_x)
    threads_y = default_y if threads_y is None else int(threads_y)
    rows_per_thread = default_rows if rows_per_thread is None else int(rows_per_thread)
    n_threads = threads_x * threads_y
    if threads_x < 1 or threads_y < 1 or n_threads > 1024 or n_threads % 32:
        raise ConfigurationError(
            f"jacobi_sweep: a block of threads_x * threads_y = {threads_x} * {threads_y} threads must be "
            "a positive multiple of 32 (whole warps) and at most 1024"
        )
    if variant != "simple":
        if threads_x % 32:
            raise ConfigurationError(
                f"jacobi_sweep: variant {variant!r} needs threads_x to be a multiple of 32 (a warp must "
                f"share its rows for the neighbour shuffles), found threads_x={threads_x}"
            )
        if not 1 <= rows_per_thread <= _MAX_ROWS_PER_THREAD:
            raise ConfigurationError(
                f"jacobi_sweep: rows_per_thread must be in [1, {_MAX_ROWS_PER_THREAD}], found {rows_per_thread}"
            )
        for array in arrays:
            problem = vector_alignment_problem(array, _VECTOR_WIDTH[variant])
            if problem is not None:
                raise ConfigurationError(f"jacobi_sweep: variant {variant!r} cannot run here: {problem}")
    return variant, threads_x, threads_y, rows_per_thread


def vector_alignment_problem(array, vector_width: int):
    """Why ``array`` cannot be read in aligned vectors of ``vector_width`` elements, or None if it can."""
    if vector_width == 1:
        return None
    pitch = array.strides[0] // array.itemsize
    width = array.shape[1]
    pointer = array.data.ptr if hasattr(array, "data") and hasattr(array.data, "ptr") else None
    if width % vector_width or pitch % vector_width:
        return (
            f"the padded width ({width}) and row pitch ({pitch} elements) must be multiples of "
            f"{vector_width}; use variant 'march' or pad the rows"
        )
    if pointer is not None and pointer % (vector_width * array.itemsize):
        return (
            f"the data pointer must be aligned to {vector_width * array.itemsize} bytes; "
            "use a freshly allocated array or variant 'march'"
        )
    return None


def jacobi_sweep_gpu(out, inp, region, fixed_columns, residual, variant, threads_x, threads_y, rows_per_thread):
    """Launch one sweep on CuPy arrays (arguments validated) on the current stream; no synchronisation."""
    variant, threads_x, threads_y, rows_per_thread = resolve_launch(
        variant, (out, inp), threads_x, threads_y, rows_per_thread
    )
    row_start, row_stop, column_start, column_stop = region
    if row_stop == row_start or column_stop == column_start:
        return
    fixed = sorted(set(int(c) for c in fixed_columns)) + [-1, -1]
    pitch = np.int64(inp.strides[0] // inp.itemsize)
    # A null pointer when no residual is wanted: the kernel instantiation without RESIDUAL never reads it.
    residual_pointer = residual if residual is not None else np.uint64(0)
    kernel = _kernel(_kernel_name(variant, inp.dtype, rows_per_thread, residual is not None))
    n_rows = row_stop - row_start
    if variant == "simple":
        grid = (-(-(column_stop - column_start) // threads_x), -(-n_rows // threads_y), 1)
        arguments = (out, inp, pitch, *_int32(row_start, row_stop, column_start, column_stop, fixed[0], fixed[1]))
    else:
        vector_width = _VECTOR_WIDTH[variant]
        n_groups = (column_stop - 1) // vector_width - column_start // vector_width + 1
        grid = (-(-n_groups // threads_x), -(-n_rows // (threads_y * rows_per_thread)), 1)
        arguments = (
            out, inp, pitch,
            *_int32(inp.shape[1], row_start, row_stop, column_start, column_stop, fixed[0], fixed[1]),
        )
    if grid[1] > 65535:
        raise ConfigurationError(
            f"jacobi_sweep: {n_rows} rows need {grid[1]} blocks along y, above CUDA's 65535; "
            "raise rows_per_thread or threads_y"
        )
    kernel(grid, (threads_x, threads_y, 1), (*arguments, residual_pointer))


def _int32(*values):
    return tuple(np.int32(v) for v in values)
