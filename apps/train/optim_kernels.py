"""Fused, in-place optimiser updates on flat (shards of) buffers.

One pass over memory per step instead of the ~10 passes of an expression built
from array operations -- the update is memory bound, so this is the whole speed
story on GPU. Each public function validates its arrays and dispatches to a CuPy
ElementwiseKernel or a Numba CPU loop; the tests hold plain NumPy references of
the published update rules.

``grad_scale`` multiplies the gradient on the fly: it carries the gradient
clipping factor and/or the inverse loss scale, so neither needs its own pass.
"""

import functools

import numba
import numpy as np

from ._backend import cpu_threads_for, is_cupy


def _check_flat(arrays, function_name):
    first_name, first = arrays[0]
    for name, array in arrays:
        if array.ndim != 1 or array.shape != first.shape or array.dtype != first.dtype:
            raise ValueError(
                f"{function_name}: every array must be 1-D with the shape and dtype of "
                f"{first_name} {first.dtype}{tuple(first.shape)}; {name} is "
                f"{array.dtype}{tuple(array.shape)}"
            )
        if array.dtype not in (np.float32, np.float64):
            raise TypeError(
                f"{function_name}: expected float32 or float64 buffers, found {array.dtype}; "
                "keep fp32 master weights when training in float16"
            )
        if is_cupy(array) != is_cupy(first):
            raise TypeError(f"{function_name}: {name} is on a different backend than {first_name}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{function_name}: {name} must be contiguous (a flat buffer slice)")


def adamw_update(params, grads, exp_avg, exp_avg_sq, *, lr, beta1, beta2, eps,
                 weight_decay, step, grad_scale=1.0):
    """AdamW step (Loshchilov & Hutter 2019, decoupled weight decay), in place.

    For ``g = grad_scale * grads`` and step count ``t = step`` (1-based)::

        params     *= 1 - lr * weight_decay
        exp_avg     = beta1 * exp_avg + (1 - beta1) * g
        exp_avg_sq  = beta2 * exp_avg_sq + (1 - beta2) * g**2
        params     -= lr / (1 - beta1**t) * exp_avg
                      / (sqrt(exp_avg_sq) / sqrt(1 - beta2**t) + eps)

    (PyTorch's ``torch.optim.AdamW``). All arrays are 1-D, same length, dtype
    and backend. Returns None.
    """
    _check_flat([("params", params), ("grads", grads), ("exp_avg", exp_avg),
                 ("exp_avg_sq", exp_avg_sq)], "adamw_update")
    if step < 1:
        raise ValueError(f"adamw_update: expected step >= 1 (1-based count), found {step}")
    bias_correction1 = 1.0 - beta1 ** step
    sqrt_bias_correction2 = float(np.sqrt(1.0 - beta2 ** step))
    if is_cupy(params):
        _cupy_adamw_kernel()(
            grads, float(grad_scale), float(lr), float(beta1), float(beta2), float(eps),
            float(weight_decay), float(bias_correction1), sqrt_bias_correction2,
            params, exp_avg, exp_avg_sq,
        )
        return None
    with cpu_threads_for(params.size):
        _adamw_cpu(params, grads, exp_avg, exp_avg_sq, float(grad_scale), float(lr),
                   float(beta1), float(beta2), float(eps), float(weight_decay),
                   float(bias_correction1), sqrt_bias_correction2)
    return None


def sgd_update(params, grads, momentum_buffer, *, lr, momentum, weight_decay,
               nesterov=False, grad_scale=1.0):
    """SGD with momentum and L2 weight decay (PyTorch ``torch.optim.SGD``), in place.

    For ``g = grad_scale * grads``::

        d = g + weight_decay * params
        momentum_buffer = momentum * momentum_buffer + d
        d = d + momentum * momentum_buffer   if nesterov else momentum_buffer
        params -= lr * d

    With a zero-initialised buffer the first step gives ``buffer = d``, as in
    PyTorch. Returns None.
    """
    _check_flat([("params", params), ("grads", grads), ("momentum_buffer", momentum_buffer)],
                "sgd_update")
    if is_cupy(params):
        _cupy_sgd_kernel()(
            grads, float(grad_scale), float(lr), float(momentum), float(weight_decay),
            int(bool(nesterov)), params, momentum_buffer,
        )
        return None
    with cpu_threads_for(params.size):
        _sgd_cpu(params, grads, momentum_buffer, float(grad_scale), float(lr),
                 float(momentum), float(weight_decay), bool(nesterov))
    return None


# ---------------------------------------------------------------- CPU (Numba) --

@numba.njit(parallel=True, cache=True)
def _adamw_cpu(params, grads, exp_avg, exp_avg_sq, grad_scale, lr, beta1, beta2, eps,
               weight_decay, bias_correction1, sqrt_bias_correction2):
    step_size = lr / bias_correction1
    decay = 1.0 - lr * weight_decay
    for i in numba.prange(params.shape[0]):
        g = grads[i] * grad_scale
        m = beta1 * exp_avg[i] + (1.0 - beta1) * g
        v = beta2 * exp_avg_sq[i] + (1.0 - beta2) * g * g
        exp_avg[i] = m
        exp_avg_sq[i] = v
        params[i] = params[i] * decay - step_size * m / (np.sqrt(v) / sqrt_bias_correction2 + eps)


@numba.njit(parallel=True, cache=True)
def _sgd_cpu(params, grads, momentum_buffer, grad_scale, lr, momentum, weight_decay, nesterov):
    for i in numba.prange(params.shape[0]):
        d = grads[i] * grad_scale + weight_decay * params[i]
        if momentum != 0.0:
            buffer = momentum * momentum_buffer[i] + d
            momentum_buffer[i] = buffer
            if nesterov:
                d = d + momentum * buffer
            else:
                d = buffer
        params[i] = params[i] - lr * d


# ----------------------------------------------------------------- GPU (CuPy) --

_ADAMW_BODY = r"""
    // arithmetic in double: scalars arrive as double, buffers are float or double
    const double g = (double)grads * grad_scale;
    const double m = beta1 * (double)exp_avg + (1.0 - beta1) * g;
    const double v = beta2 * (double)exp_avg_sq + (1.0 - beta2) * g * g;
    exp_avg = (T)m;
    exp_avg_sq = (T)v;
    const double step_size = lr / bias_correction1;
    params = (T)((double)params * (1.0 - lr * weight_decay)
                 - step_size * m / (sqrt(v) / sqrt_bias_correction2 + eps));
"""

_SGD_BODY = r"""
    double d = (double)grads * grad_scale + weight_decay * (double)params;
    if (momentum != 0.0) {
        const double buffer = momentum * (double)momentum_buffer + d;
        momentum_buffer = (T)buffer;
        d = nesterov ? d + momentum * buffer : buffer;
    }
    params = (T)((double)params - lr * d);
"""


@functools.lru_cache(maxsize=None)
def _cupy_adamw_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "T grads, float64 grad_scale, float64 lr, float64 beta1, float64 beta2, "
        "float64 eps, float64 weight_decay, float64 bias_correction1, "
        "float64 sqrt_bias_correction2",
        "T params, T exp_avg, T exp_avg_sq", _ADAMW_BODY, "hpcgpu_train_adamw",
    )


@functools.lru_cache(maxsize=None)
def _cupy_sgd_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "T grads, float64 grad_scale, float64 lr, float64 momentum, float64 weight_decay, "
        "int32 nesterov",
        "T params, T momentum_buffer", _SGD_BODY, "hpcgpu_train_sgd",
    )
