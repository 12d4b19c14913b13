"""Whole-buffer kernels of the optimiser step: sum of squares and scaled copy.

Both run once per step over the full flat gradient buffer (143M elements for the
large MLP), so they must run at memory bandwidth:

* :func:`sum_of_squares` -- the local part of the global gradient norm (clipping and
  the fp16 overflow test). On a GPU, CuPy's generic reductions handle a reduction
  to ONE value with a single thread block when CUB is not enabled
  (``CUPY_ACCELERATORS``), i.e. a few percent of the memory bandwidth -- several
  milliseconds per step here. This is a two-stage, fixed-order reduction over
  ~1000 blocks with float64 accumulation (deterministic, so bitwise restarts hold).
* :func:`scaled_copy` -- ``target = float32(source) * factor`` in one pass (the
  fp16 -> fp32 unscaling of mixed precision), instead of a cast pass and a
  multiply pass.
"""

import functools

import numpy as np

from ._backend import check_float_array, is_cupy
from ._cuda_source import CUDA_HELPERS, STORAGE_TYPES

#: Thread blocks of the first reduction stage (fixed: the summation order, and so the
#: result's bits, depend only on the buffer length).
REDUCTION_BLOCKS = 1024
_THREADS = 256


def sum_of_squares(values):
    """``sum(values**2)`` of a 1-D float buffer, as a Python float (synchronises a GPU).

    CPU: float16 is upcast to float32 and the sum is a BLAS dot product in the
    buffer dtype. GPU: accumulated in float64 whatever the buffer dtype.
    """
    check_float_array(values, "sum_of_squares: values", ndim=1)
    if is_cupy(values):
        return float(_sum_of_squares_cupy(values))
    if values.dtype.itemsize < 4:
        values = values.astype(np.float32)
    return float(values @ values)


def scaled_copy(source, target, factor):
    """``target[...] = float32(source) * float32(factor)`` elementwise; returns None.

    Parameters
    ----------
    source : ndarray, 1-D float16 or float32
    target : ndarray of float32, shape of ``source``, same backend
    factor : float
        Rounded to float32 first (bitwise the CPU's cast-then-multiply).
    """
    check_float_array(source, "scaled_copy: source", ndim=1)
    check_float_array(target, "scaled_copy: target", ndim=1)
    if target.dtype != np.float32 or source.shape != target.shape:
        raise ValueError(
            f"scaled_copy: expected a float32 target of the source's shape {tuple(source.shape)}, "
            f"found {target.dtype}{tuple(target.shape)}"
        )
    if is_cupy(source) != is_cupy(target):
        raise TypeError("scaled_copy: source and target must be on the same backend")
    factor = np.float32(factor)
    if is_cupy(target):
        _scaled_copy_kernel()(source, factor, target)
        return None
    target[...] = source
    target *= factor
    return None


# ----------------------------------------------------------------- GPU (CuPy) --

_SUM_OF_SQUARES_SOURCE = CUDA_HELPERS + r"""
template <typename S>
__global__ void hpcgpu_train_sum_of_squares_partial(const S* values, long long n, double* partial) {
    __shared__ double scratch[33];
    double sum = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double value = (double)load_math(values, i);
        sum += value * value;
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
    }
}

__global__ void hpcgpu_train_sum_partials(const double* partial, int n_partial, double* total) {
    __shared__ double scratch[33];
    double sum = 0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) {
        sum += partial[i];
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        total[0] = sum;
    }
}
"""


@functools.lru_cache(maxsize=None)
def _sum_module():
    import cupy

    expressions = [f"hpcgpu_train_sum_of_squares_partial<{storage}>"
                   for storage in STORAGE_TYPES.values()]
    expressions.append("hpcgpu_train_sum_partials")
    return cupy.RawModule(code=_SUM_OF_SQUARES_SOURCE, name_expressions=expressions)


def _sum_of_squares_cupy(values):
    """0-d float64 CuPy array holding the sum of squares (no host synchronisation)."""
    import cupy

    values = cupy.ascontiguousarray(values)
    total = cupy.zeros((), dtype=cupy.float64)
    n = int(values.size)
    if n == 0:
        return total
    n_blocks = int(min(REDUCTION_BLOCKS, (n + _THREADS - 1) // _THREADS))
    partial = cupy.empty(n_blocks, dtype=cupy.float64)
    module = _sum_module()
    storage = STORAGE_TYPES[values.dtype.name]
    module.get_function(f"hpcgpu_train_sum_of_squares_partial<{storage}>")(
        (n_blocks,), (_THREADS,), (values, np.int64(n), partial))
    module.get_function("hpcgpu_train_sum_partials")(
        (1,), (1024,), (partial, np.int32(n_blocks), total))
    return total


@functools.lru_cache(maxsize=None)
def _scaled_copy_kernel():
    import cupy

    return cupy.ElementwiseKernel("S source, float32 factor", "float32 target",
                                  "target = (float)source * factor",
                                  "hpcgpu_train_scaled_copy")
