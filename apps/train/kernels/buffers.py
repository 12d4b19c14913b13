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
* :func:`round_to_bfloat16` -- float32 -> bfloat16 (the refresh of the bf16 compute
  copy, the input batch). On a GPU bfloat16 arrays are ``uint16`` bit patterns (CuPy
  has no bfloat16 dtype), so the few elementwise operations the layers apply to
  bfloat16 activations there are kernels here too: :func:`add` (residual sums),
  :func:`add_bias_bfloat16`, :func:`scale_bfloat16`, :func:`positive_bfloat16`.
"""

import functools

import numpy as np

from .backend import check_float_array, is_bfloat16, is_cupy
from .cuda_source import CUDA_HELPERS, STORAGE_TYPES

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
    source : ndarray, 1-D float16, bfloat16 or float32
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
        if is_bfloat16(source.dtype):
            _bfloat16_kernels()["scaled_copy"](source, factor, target)
        else:
            _scaled_copy_kernel()(source, factor, target)
        return None
    target[...] = source
    target *= factor
    return None


def round_to_bfloat16(source, target):
    """``target[...] = bfloat16(source)``, round to nearest even; returns None.

    Parameters
    ----------
    source : ndarray of float32
    target : ndarray of bfloat16 (CPU: ``ml_dtypes.bfloat16``; GPU: ``uint16`` bit patterns),
        shape of ``source``, same backend; written in place (views stay valid).
    """
    if source.dtype != np.float32 or not is_bfloat16(target.dtype) or source.shape != target.shape:
        raise ValueError(
            f"round_to_bfloat16: expected float32 source and a bfloat16 target of the same shape, found "
            f"{source.dtype}{tuple(source.shape)} and {target.dtype}{tuple(target.shape)}")
    if is_cupy(source) != is_cupy(target):
        raise TypeError("round_to_bfloat16: source and target must be on the same backend")
    if is_cupy(target):
        _bfloat16_kernels()["round"](source, target)
    else:
        target[...] = source
    return None


def add_bias_bfloat16(y, bias):
    """GPU: ``y += bias`` along the last axis for bfloat16 bit patterns (sum in float32, rounded
    once, as NumPy's bfloat16 addition); returns None."""
    _bfloat16_kernels()["add_bias"](bias, np.int64(bias.shape[0]), y)


def scale_bfloat16(x, scale):
    """GPU: ``x * bfloat16(scale)`` for bfloat16 bit patterns (product in float32, rounded once);
    returns a new array."""
    scale_bits = _float_to_bfloat16_host(scale)
    scale_value = np.array([scale_bits << 16], dtype=np.uint32).view(np.float32)[0]
    return _bfloat16_kernels()["scale"](x, scale_value)


def add(a, b):
    """``a + b`` (same shape and dtype); GPU bfloat16 bit patterns are added as numbers (in float32,
    rounded once, as NumPy's bfloat16 addition) instead of as integers. Returns a new array."""
    if is_cupy(a) and a.dtype.name == "uint16":
        return _bfloat16_kernels()["add"](a, b)
    return a + b


def positive_bfloat16(x):
    """GPU: ``x > 0`` for bfloat16 bit patterns (a positive finite number or +inf; not NaN)."""
    return _bfloat16_kernels()["positive"](x)


def _float_to_bfloat16_host(value):
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


# ----------------------------------------------------------------- GPU (CuPy) --

_BFLOAT16_PREAMBLE = r"""
__device__ __forceinline__ float bf16_load(unsigned short bits) {
    return __uint_as_float(((unsigned int)bits) << 16);
}
__device__ __forceinline__ unsigned short bf16_store(float value) {
    const unsigned int bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    }
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
"""


@functools.lru_cache(maxsize=None)
def _bfloat16_kernels():
    """The elementwise kernels on bfloat16 bit patterns (``uint16`` CuPy arrays)."""
    import cupy

    def kernel(in_params, out_params, body, name):
        return cupy.ElementwiseKernel(in_params, out_params, body, f"hpcgpu_train_bf16_{name}",
                                      preamble=_BFLOAT16_PREAMBLE)

    return {
        "round": kernel("float32 source", "uint16 target", "target = bf16_store(source)", "round"),
        # factor 1 (bf16 mixed precision's widening): a pure bit move, exact also for subnormals
        "scaled_copy": kernel("uint16 source, float32 factor", "float32 target",
                              "target = factor == 1.0f ? bf16_load(source) : bf16_load(source) * factor",
                              "scaled_copy"),
        "add_bias": kernel("raw uint16 bias, int64 n_cols", "uint16 y",
                           "y = bf16_store(bf16_load(y) + bf16_load(bias[i % n_cols]))", "add_bias"),
        "add": kernel("uint16 a, uint16 b", "uint16 total", "total = bf16_store(bf16_load(a) + bf16_load(b))",
                      "add"),
        "scale": kernel("uint16 x, float32 scale", "uint16 y", "y = bf16_store(bf16_load(x) * scale)",
                        "scale"),
        # (bits - 1) as 16 bits is below 0x7f80 exactly for +min subnormal .. +inf
        "positive": kernel("uint16 x", "bool positive",
                           "positive = (unsigned short)(x - 1) < (unsigned short)0x7f80u", "positive"),
    }

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
