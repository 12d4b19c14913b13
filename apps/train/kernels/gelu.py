"""GELU (tanh approximation): forward and backward kernels.

::

    u        = sqrt(2/pi) * (x + 0.044715 x^3)
    gelu(x)  = 0.5 x (1 + tanh(u))
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

(Hendrycks & Gimpel 2016; PyTorch's ``GELU(approximate="tanh")``.)

Both take an optional ``bias`` over the last axis that is added to ``x`` first
(``gelu(x + bias)``, the sum rounded to the storage dtype): a preceding Linear
layer leaves its bias to this kernel instead of a separate pass over its output
(:class:`apps.train.nn.layers.Linear`, ``defer_bias``); backward recomputes the sum.

GPU: one fused RawKernel per direction -- one read of ``x`` (and of the incoming
gradient) and one write, 16-byte vector loads and stores (4 float32 / 8 float16
per access) when the buffers are aligned, arithmetic in float32 for float16 and
float32 data (float64 for float64), instead of the ~10 array expressions (each a
full pass over memory) of the NumPy formulation. CPU: the NumPy expressions, which
are also the reference of the GPU parity tests; bfloat16 is computed in float32 and
rounded once, as the GPU kernels do (bfloat16 travels there as ``uint16`` bit patterns).
"""

import functools

import numpy as np

from .backend import array_module, check_float_array, is_bfloat16, is_cupy
from .cuda_source import CUDA_HELPERS, GELU_FUNCTIONS, STORAGE_TYPES, VECTOR_WIDTH

SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
GELU_CUBIC = 0.044715


def gelu_forward(x, bias=None):
    """``gelu(x + bias)`` elementwise; returns a new array with the shape and dtype of ``x``.

    Parameters
    ----------
    x : ndarray of float16, bfloat16 (NumPy), float32 or float64 (NumPy or CuPy)
    bias : ndarray, shape (x.shape[-1],), dtype of ``x``, optional
        Added along the last axis before the activation.
    """
    check_float_array(x, "gelu_forward: x")
    _check_bias(x, bias, "gelu_forward")
    if is_cupy(x):
        return _gelu_cupy(x, None, bias)
    xp = array_module(x)
    if bias is not None:
        x = x + bias            # rounded to the storage dtype, as the GPU kernels do
    out_dtype = x.dtype
    if is_bfloat16(out_dtype):
        x = x.astype(np.float32)
    inner = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
    return (0.5 * x * (1.0 + xp.tanh(inner))).astype(out_dtype, copy=False)


def gelu_backward(x, grad_out, bias=None):
    """``grad_out * gelu'(x + bias)``; returns a new array with the dtype of ``grad_out``.

    Parameters
    ----------
    x : ndarray
        The forward input.
    grad_out : ndarray, shape of ``x``
        Gradient with respect to the output.
    bias : ndarray, optional
        The forward's ``bias`` (the gradient with respect to ``x`` and to ``x + bias``
        is the same; the bias gradient is the caller's column sum of it).
    """
    check_float_array(x, "gelu_backward: x")
    check_float_array(grad_out, "gelu_backward: grad_out")
    _check_bias(x, bias, "gelu_backward")
    if grad_out.shape != x.shape:
        raise ValueError(
            f"gelu_backward: grad_out has shape {tuple(grad_out.shape)}, expected the "
            f"shape of x {tuple(x.shape)}"
        )
    if is_cupy(x) != is_cupy(grad_out):
        raise TypeError("gelu_backward: x and grad_out must be on the same backend")
    if is_cupy(x):
        if grad_out.dtype != x.dtype:
            return _gelu_cupy(x, grad_out.astype(x.dtype), bias).astype(grad_out.dtype)
        return _gelu_cupy(x, grad_out, bias)
    xp = array_module(grad_out)
    if bias is not None:
        x = x + bias
    out_dtype = grad_out.dtype
    if is_bfloat16(out_dtype) or is_bfloat16(x.dtype):
        x, grad_out = x.astype(np.float32), grad_out.astype(np.float32)
    tanh_inner = xp.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))
    d_inner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
    derivative = 0.5 * (1.0 + tanh_inner) + 0.5 * x * (1.0 - tanh_inner * tanh_inner) * d_inner
    return (grad_out * derivative).astype(out_dtype, copy=False)


def _check_bias(x, bias, function_name):
    if bias is None:
        return
    check_float_array(bias, f"{function_name}: bias", ndim=1)
    if x.ndim < 1 or bias.shape != (x.shape[-1],) or bias.dtype != x.dtype:
        raise ValueError(
            f"{function_name}: bias must have shape ({x.shape[-1] if x.ndim else '?'},) and "
            f"dtype {x.dtype} (the last axis of x), found {bias.dtype}{tuple(bias.shape)}"
        )
    if is_cupy(bias) != is_cupy(x):
        raise TypeError(f"{function_name}: bias is on a different backend than x")


# ----------------------------------------------------------------- GPU (CuPy) --

_GELU_SOURCE = CUDA_HELPERS + GELU_FUNCTIONS + r"""
// out = gelu(x + bias) (grad_out null) or grad_out * gelu'(x + bias). Each thread handles
// packs of VEC consecutive elements (one 16-byte access per array when VEC > 1: the host
// picks VEC = 1 unless the pointers are 16-byte aligned and n_cols is a multiple of VEC,
// so a pack never straddles two rows); the n % VEC tail goes element by element.
template <typename S, int VEC>
__global__ void hpcgpu_train_gelu(const S* x, const S* grad_out, const S* bias, S* out,
                                  long long n, long long n_cols) {
    typedef typename MathType<S>::type M;
    const long long n_packs = n / VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long pack = first; pack < n_packs; pack += stride) {
        const Pack<S, VEC> x_pack = reinterpret_cast<const Pack<S, VEC>*>(x)[pack];
        Pack<S, VEC> g_pack;
        if (grad_out != nullptr) {
            g_pack = reinterpret_cast<const Pack<S, VEC>*>(grad_out)[pack];
        }
        Pack<S, VEC> result;
        const long long column = (pack * VEC) % n_cols;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const M v = load_biased(x_pack.value, bias, k, column + k);
            const M r = grad_out != nullptr ? load_math(g_pack.value, k) * gelu_derivative(v)
                                            : gelu_value(v);
            store_math(result.value, k, r);
        }
        reinterpret_cast<Pack<S, VEC>*>(out)[pack] = result;
    }
    for (long long i = n_packs * VEC + first; i < n; i += stride) {
        const M v = load_biased(x, bias, i, i % n_cols);
        const M r = grad_out != nullptr ? load_math(grad_out, i) * gelu_derivative(v)
                                        : gelu_value(v);
        store_math(out, i, r);
    }
}
"""

_THREADS = 256


def _name_expressions():
    return [f"hpcgpu_train_gelu<{STORAGE_TYPES[name]}, {width}>"
            for name, vector in VECTOR_WIDTH.items() for width in (1, vector)]


@functools.lru_cache(maxsize=None)
def _module():
    import cupy

    return cupy.RawModule(code=_GELU_SOURCE, name_expressions=_name_expressions())


@functools.lru_cache(maxsize=4)
def _max_blocks(device_id):
    import cupy

    return 16 * cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


def _gelu_cupy(x, grad_out, bias):
    import cupy

    x = cupy.ascontiguousarray(x)
    out = cupy.empty_like(x if grad_out is None else grad_out)
    n = int(x.size)
    if n == 0:
        return out
    n_cols = int(x.shape[-1]) if x.ndim else 1
    if grad_out is not None:
        grad_out = cupy.ascontiguousarray(grad_out)
    if bias is not None:
        bias = cupy.ascontiguousarray(bias)
    arrays = [a for a in (x, grad_out, bias, out) if a is not None]
    width = VECTOR_WIDTH[x.dtype.name]
    if any(a.data.ptr % 16 for a in arrays) or (bias is not None and n_cols % width):
        width = 1
    kernel = _module().get_function(f"hpcgpu_train_gelu<{STORAGE_TYPES[x.dtype.name]}, {width}>")
    n_threads_needed = max(1, n // width)
    n_blocks = int(min((n_threads_needed + _THREADS - 1) // _THREADS,
                       _max_blocks(cupy.cuda.Device().id)))
    null = np.uintp(0)
    kernel((n_blocks,), (_THREADS,),
           (x, null if grad_out is None else grad_out, null if bias is None else bias, out,
            np.int64(n), np.int64(max(1, n_cols))))
    return out
