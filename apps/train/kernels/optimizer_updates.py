"""Fused, in-place optimiser updates on flat (shards of) buffers.

One pass over memory per step instead of the ~10 passes of an expression built
from array operations -- the update is memory bound, so this is the whole speed
story on GPU. Each public function validates its arrays and dispatches to a CuPy
kernel (AdamW: a RawKernel with 16-byte accesses when the buffers are aligned; SGD:
an ElementwiseKernel) or a Numba CPU loop; the tests hold plain NumPy references of
the published update rules.

``grad_scale`` multiplies the gradient on the fly: it carries the gradient
clipping factor and/or the inverse loss scale, so neither needs its own pass.
"""

import functools

import numba
import numpy as np

from .backend import cpu_threads_for, is_cupy
from .cuda_source import CUDA_HELPERS, STORAGE_TYPES


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
    and backend. Arithmetic: GPU in the buffer dtype (float32 for float32
    buffers, as PyTorch's fused AdamW; float64 for float64); CPU in float64 (the
    reference). Returns None.
    """
    _check_flat([("params", params), ("grads", grads), ("exp_avg", exp_avg),
                 ("exp_avg_sq", exp_avg_sq)], "adamw_update")
    scalars = _adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, "adamw_update")
    if is_cupy(params):
        _adamw_cupy(params, grads, exp_avg, exp_avg_sq, None, 1.0, grad_scale, scalars)
        return None
    with cpu_threads_for(params.size):
        _adamw_cpu(params, grads, exp_avg, exp_avg_sq, float(grad_scale), *scalars)
    return None


def adamw_update_mixed(master_params, compute_grads, exp_avg, exp_avg_sq, compute_params, *,
                       lr, beta1, beta2, eps, weight_decay, step, inverse_loss_scale,
                       grad_scale=1.0):
    """Mixed-precision AdamW in ONE pass: unscale, update the masters, refresh the fp16 copy.

    Equivalent to (and on CPU computed as)::

        master_grads = float32(compute_grads) * float32(inverse_loss_scale)
        adamw_update(master_params, master_grads, exp_avg, exp_avg_sq, ..., grad_scale)
        compute_params[...] = master_params            # round to float16

    On a GPU one kernel reads the float16 gradient, the float32 master weight and
    moments, and writes the master, the moments and the float16 copy: 28 bytes
    per parameter instead of the ~50 of three separate passes, and no float32
    gradient buffer. Call it only for a step that is applied (the caller checks
    the gradients for inf/nan first, through their sum of squares).

    Parameters
    ----------
    master_params, exp_avg, exp_avg_sq : ndarray of float32, shape (n,)
    compute_grads : ndarray of float16, shape (n,)
        Loss-scaled gradients.
    compute_params : ndarray of float16, shape (n,)
        Receives the updated masters rounded to float16.
    inverse_loss_scale : float
        ``1 / loss_scale`` of the step that produced the gradients (rounded to float32).
    grad_scale : float
        Further factor on the unscaled gradient (the clipping factor).
    """
    _check_flat([("master_params", master_params), ("exp_avg", exp_avg),
                 ("exp_avg_sq", exp_avg_sq)], "adamw_update_mixed")
    for name, array in (("compute_grads", compute_grads), ("compute_params", compute_params)):
        if (array.ndim != 1 or array.shape != master_params.shape or array.dtype != np.float16
                or is_cupy(array) != is_cupy(master_params) or not array.flags.c_contiguous):
            raise ValueError(
                f"adamw_update_mixed: {name} must be a contiguous float16 buffer of shape "
                f"{tuple(master_params.shape)} on the masters' backend, found "
                f"{array.dtype}{tuple(array.shape)}"
            )
    if master_params.dtype != np.float32:
        raise TypeError(f"adamw_update_mixed: master weights must be float32, found "
                        f"{master_params.dtype}")
    scalars = _adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, "adamw_update_mixed")
    unscale = float(np.float32(inverse_loss_scale))
    if is_cupy(master_params):
        _adamw_cupy(master_params, compute_grads, exp_avg, exp_avg_sq, compute_params, unscale,
                    grad_scale, scalars)
        return None
    master_grads = compute_grads.astype(np.float32)
    master_grads *= np.float32(unscale)
    with cpu_threads_for(master_params.size):
        _adamw_cpu(master_params, master_grads, exp_avg, exp_avg_sq, float(grad_scale), *scalars)
    compute_params[...] = master_params
    return None


def _adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, function_name):
    """(lr, beta1, beta2, eps, weight_decay, bias_correction1, sqrt_bias_correction2)."""
    if step < 1:
        raise ValueError(f"{function_name}: expected step >= 1 (1-based count), found {step}")
    bias_correction1 = 1.0 - beta1 ** step
    sqrt_bias_correction2 = float(np.sqrt(1.0 - beta2 ** step))
    return (float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
            float(bias_correction1), sqrt_bias_correction2)


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
def _cupy_sgd_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "T grads, float64 grad_scale, float64 lr, float64 momentum, float64 weight_decay, "
        "int32 nesterov",
        "T params, T momentum_buffer", _SGD_BODY, "hpcgpu_train_sgd",
    )


_ADAMW_SOURCE = CUDA_HELPERS + r"""
// S: storage of the masters and moments, G: storage of the gradients (float16 gradients with
// float32 masters in mixed precision), arithmetic in M = float for float32 masters (PyTorch's
// fused AdamW) and double for float64. copy: the float16 compute copy of the masters, or null.
template <typename M>
struct AdamWConstants {
    M grad_scale, step_size, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, sqrt_bc2;
    float unscale;
};

// One element: updates param and the moments in place and returns the new parameter.
template <typename M, typename S, typename G>
__device__ __forceinline__ M adamw_element(const AdamWConstants<M>& c, const G* grads, long long i,
                                           S& param, S& exp_avg, S& exp_avg_sq) {
    // unscale in float32 first (exact: a power of two), as the unfused path's copy
    const M unscaled = (M)(load_math(grads, i) * c.unscale);
    const M g = unscaled * c.grad_scale;
    const M m = c.beta1 * (M)exp_avg + c.one_minus_beta1 * g;
    const M v = c.beta2 * (M)exp_avg_sq + c.one_minus_beta2 * g * g;
    exp_avg = (S)m;
    exp_avg_sq = (S)v;
    const M p = (M)param * c.decay - c.step_size * m / (math_sqrt(v) / c.sqrt_bc2 + c.eps);
    param = (S)p;
    return p;
}

// Grid-stride over packs of VEC elements (one 16-byte access per float32 array when VEC = 4;
// the host picks VEC = 1 unless every buffer is aligned for it), then the n % VEC tail.
template <typename S, typename G, int VEC>
__global__ void hpcgpu_train_adamw(
        S* params, const G* grads, S* exp_avg, S* exp_avg_sq, unsigned short* copy,
        long long n, float unscale, double grad_scale, double step_size, double decay,
        double beta1, double beta2, double one_minus_beta1, double one_minus_beta2, double eps,
        double sqrt_bias_correction2) {
    typedef typename MathType<S>::type M;
    // 1 - beta in double on the host, then rounded: in float32, 1 - (float)0.999 is off by 1.3e-5.
    const AdamWConstants<M> c = {(M)grad_scale, (M)step_size, (M)decay, (M)beta1, (M)beta2,
                                 (M)one_minus_beta1, (M)one_minus_beta2, (M)eps,
                                 (M)sqrt_bias_correction2, unscale};
    const long long n_packs = n / VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long pack = first; pack < n_packs; pack += stride) {
        Pack<S, VEC> p = reinterpret_cast<Pack<S, VEC>*>(params)[pack];
        Pack<S, VEC> m = reinterpret_cast<Pack<S, VEC>*>(exp_avg)[pack];
        Pack<S, VEC> v = reinterpret_cast<Pack<S, VEC>*>(exp_avg_sq)[pack];
        const Pack<G, VEC> g = reinterpret_cast<const Pack<G, VEC>*>(grads)[pack];
        Pack<unsigned short, VEC> half;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const M updated = adamw_element(c, g.value, k, p.value[k], m.value[k], v.value[k]);
            store_math(half.value, k, (float)updated);
        }
        reinterpret_cast<Pack<S, VEC>*>(params)[pack] = p;
        reinterpret_cast<Pack<S, VEC>*>(exp_avg)[pack] = m;
        reinterpret_cast<Pack<S, VEC>*>(exp_avg_sq)[pack] = v;
        if (copy != nullptr) {
            reinterpret_cast<Pack<unsigned short, VEC>*>(copy)[pack] = half;
        }
    }
    for (long long i = n_packs * VEC + first; i < n; i += stride) {
        const M updated = adamw_element(c, grads, i, params[i], exp_avg[i], exp_avg_sq[i]);
        if (copy != nullptr) {
            store_math(copy, i, (float)updated);
        }
    }
}
"""

#: (storage of masters/moments, storage of gradients, elements per access) instantiated.
_ADAMW_TYPES = (("float", "float", 1), ("float", "float", 4), ("double", "double", 1),
                ("float", "unsigned short", 1), ("float", "unsigned short", 4))
_THREADS = 256


@functools.lru_cache(maxsize=None)
def _adamw_module():
    import cupy

    return cupy.RawModule(code=_ADAMW_SOURCE, name_expressions=[
        f"hpcgpu_train_adamw<{s}, {g}, {v}>" for s, g, v in _ADAMW_TYPES])


@functools.lru_cache(maxsize=4)
def _max_blocks(device_id):
    """Grid of the grid-stride loop: 8 blocks of 256 threads per SM (queried once per device)."""
    import cupy

    return 8 * cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


def _vector_width(params, grads, exp_avg, exp_avg_sq, copy):
    """4 when float32 masters and every buffer allow 4-element accesses (16 bytes for float32,
    8 for float16), else 1 (ZeRO shards and other views may start anywhere)."""
    if params.dtype.name != "float32":
        return 1
    arrays = [params, grads, exp_avg, exp_avg_sq] + ([copy] if copy is not None else [])
    if any(int(a.data.ptr) % (4 * a.dtype.itemsize) for a in arrays):
        return 1
    return 4


def _adamw_cupy(params, grads, exp_avg, exp_avg_sq, copy, unscale, grad_scale, scalars):
    import cupy

    lr, beta1, beta2, eps, weight_decay, bias_correction1, sqrt_bias_correction2 = scalars
    n = int(params.size)
    if n == 0:
        return
    width = _vector_width(params, grads, exp_avg, exp_avg_sq, copy)
    kernel = _adamw_module().get_function(
        f"hpcgpu_train_adamw<{STORAGE_TYPES[params.dtype.name]}, "
        f"{STORAGE_TYPES[grads.dtype.name]}, {width}>")
    n_threads_needed = max(1, n // width)
    n_blocks = int(min((n_threads_needed + _THREADS - 1) // _THREADS, _max_blocks(cupy.cuda.Device().id)))
    kernel((n_blocks,), (_THREADS,),
           (params, grads, exp_avg, exp_avg_sq, copy if copy is not None else np.uintp(0),
            np.int64(n), np.float32(unscale), np.float64(grad_scale),
            np.float64(lr / bias_correction1), np.float64(1.0 - lr * weight_decay),
            np.float64(beta1), np.float64(beta2), np.float64(1.0 - beta1), np.float64(1.0 - beta2),
            np.float64(eps), np.float64(sqrt_bias_correction2)))
