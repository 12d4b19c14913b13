"""GELU (tanh approximation): forward and backward kernels.

::

    u        = sqrt(2/pi) * (x + 0.044715 x^3)
    gelu(x)  = 0.5 x (1 + tanh(u))
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

(Hendrycks & Gimpel 2016; PyTorch's ``GELU(approximate="tanh")``.)

GPU: one fused CuPy ElementwiseKernel per direction -- one read of ``x`` (and of
the incoming gradient) and one write, with the arithmetic in float32 for float16
and float32 data (float64 for float64), instead of the ~10 array expressions
(each a full pass over memory, several with float16 rounding in between) of the
NumPy formulation. CPU: the NumPy expressions, which are also the reference of
the GPU parity tests.
"""

import functools

import numpy as np

from ._backend import array_module, check_float_array, is_cupy

SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
GELU_CUBIC = 0.044715


def gelu_forward(x):
    """``gelu(x)`` elementwise; returns a new array with the shape and dtype of ``x``.

    Parameters
    ----------
    x : ndarray of float16, float32 or float64 (NumPy or CuPy)
    """
    check_float_array(x, "gelu_forward: x")
    if is_cupy(x):
        return _forward_kernel()(x)
    xp = array_module(x)
    inner = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
    return (0.5 * x * (1.0 + xp.tanh(inner))).astype(x.dtype, copy=False)


def gelu_backward(x, grad_out):
    """``grad_out * gelu'(x)``; returns a new array with the dtype of ``grad_out``.

    Parameters
    ----------
    x : ndarray
        The forward input.
    grad_out : ndarray, shape of ``x``
        Gradient with respect to the output.
    """
    check_float_array(x, "gelu_backward: x")
    check_float_array(grad_out, "gelu_backward: grad_out")
    if grad_out.shape != x.shape:
        raise ValueError(
            f"gelu_backward: grad_out has shape {tuple(grad_out.shape)}, expected the "
            f"shape of x {tuple(x.shape)}"
        )
    if is_cupy(x) != is_cupy(grad_out):
        raise TypeError("gelu_backward: x and grad_out must be on the same backend")
    if is_cupy(x):
        return _backward_kernel()(x, grad_out)
    xp = array_module(grad_out)
    tanh_inner = xp.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))
    d_inner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
    derivative = 0.5 * (1.0 + tanh_inner) + 0.5 * x * (1.0 - tanh_inner * tanh_inner) * d_inner
    return (grad_out * derivative).astype(grad_out.dtype, copy=False)


# ----------------------------------------------------------------- GPU (CuPy) --

# M: the arithmetic type -- float for float16/float32 storage, double for float64.
_PREAMBLE = r"""
template <typename Storage> struct hpcgpu_gelu_math { typedef float type; };
template <> struct hpcgpu_gelu_math<double> { typedef double type; };
__device__ __forceinline__ float hpcgpu_gelu_tanh(float value) { return tanhf(value); }
__device__ __forceinline__ double hpcgpu_gelu_tanh(double value) { return tanh(value); }
"""

_FORWARD_BODY = r"""
    typedef hpcgpu_gelu_math<T>::type M;
    const M v = (M)x;
    const M inner = (M)0.7978845608028654 * (v + (M)0.044715 * v * v * v);
    y = (T)((M)0.5 * v * ((M)1 + hpcgpu_gelu_tanh(inner)));
"""

_BACKWARD_BODY = r"""
    typedef hpcgpu_gelu_math<T>::type M;
    const M v = (M)x;
    const M t = hpcgpu_gelu_tanh((M)0.7978845608028654 * (v + (M)0.044715 * v * v * v));
    const M d_inner = (M)0.7978845608028654 * ((M)1 + (M)0.134145 * v * v);
    const M derivative = (M)0.5 * ((M)1 + t) + (M)0.5 * v * ((M)1 - t * t) * d_inner;
    grad_in = (G)((M)grad_out * derivative);
"""


@functools.lru_cache(maxsize=None)
def _forward_kernel():
    import cupy

    return cupy.ElementwiseKernel("T x", "T y", _FORWARD_BODY, "hpcgpu_train_gelu_forward",
                                  preamble=_PREAMBLE)


@functools.lru_cache(maxsize=None)
def _backward_kernel():
    import cupy

    # the arithmetic type follows x; the result has the dtype of grad_out
    return cupy.ElementwiseKernel("T x, G grad_out", "G grad_in", _BACKWARD_BODY,
                                  "hpcgpu_train_gelu_backward", preamble=_PREAMBLE)
