"""Softmax cross-entropy normalised by the GLOBAL batch size.

Data parallelism splits one global batch of ``B`` samples over ranks and
micro-batches. If each piece divided its loss by its *own* size, the pieces'
gradients would not add up to the full-batch gradient. Here every piece divides by
the global ``B`` it is given, so::

    sum over pieces of grad(piece)  ==  grad(full batch)      (up to rounding)

and the data-parallel gradient is a plain SUM-allreduce (plus the sum over
accumulated micro-batches), with no rescaling afterwards.

GPU: one fused RawKernel, one thread block per row (max, sum of exponentials,
per-row loss and the gradient row in one launch; arithmetic in float32 for
float16/float32 logits, float64 for float64) instead of ~10 array expressions.
CPU: the NumPy expressions, the reference of the GPU parity test.
"""

import functools

import numpy as np

from apps.train.kernels.backend import array_module, check_float_array, is_cupy, to_float32, upcast_half
from apps.train.kernels.cuda_source import CUDA_HELPERS, STORAGE_TYPES, math_dtype


def softmax_cross_entropy(logits, labels, global_batch_size, grad_scale=1.0):
    """Loss and gradient of softmax cross-entropy for one (micro-)batch.

    Parameters
    ----------
    logits : ndarray, shape (batch, n_classes)
        Unnormalised scores (float16/bfloat16 logits are upcast to float32).
    labels : ndarray of int, shape (batch,)
        Class indices in ``[0, n_classes)``, same backend as ``logits``.
    global_batch_size : int
        Number of samples in the whole optimiser step (all ranks, all
        micro-batches); the loss and gradient are divided by it.
    grad_scale : float
        Multiplies the returned gradient (the loss scale of mixed precision).

    Returns
    -------
    loss : 0-d ndarray (float32 or float64)
        ``sum_i -log softmax(logits_i)[labels_i] / global_batch_size`` -- this
        piece's contribution to the global mean loss.
    grad_logits : ndarray, shape (batch, n_classes), dtype of ``logits``
        ``grad_scale * (softmax(logits) - onehot(labels)) / global_batch_size``.
    """
    check_float_array(logits, "logits", ndim=2)
    xp = array_module(logits)
    batch, n_classes = logits.shape
    if labels.shape != (batch,) or labels.dtype.kind not in "iu":
        raise ValueError(
            f"labels: expected integer array of shape ({batch},), found dtype "
            f"{labels.dtype} and shape {tuple(labels.shape)}"
        )
    if int(global_batch_size) < batch:
        raise ValueError(
            f"global_batch_size={global_batch_size} is smaller than this batch ({batch}); "
            "pass the number of samples of the whole step across ranks and micro-batches"
        )
    # Range check on the host only: on a GPU, int(labels.min()) would stall the stream
    # every micro-batch (the loader validates labels once when the data is opened).
    if batch and not is_cupy(labels) and (int(labels.min()) < 0 or int(labels.max()) >= n_classes):
        raise ValueError(
            f"labels: expected values in [0, {n_classes}), found range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    if is_cupy(logits):
        return _softmax_cross_entropy_cupy(logits, labels, int(global_batch_size), float(grad_scale))
    work = upcast_half(logits)
    shifted = work - work.max(axis=1, keepdims=True)
    log_normaliser = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    log_probs = shifted - log_normaliser
    rows = xp.arange(batch)
    loss = -log_probs[rows, labels].sum() / global_batch_size
    grad = xp.exp(log_probs)
    grad[rows, labels] -= 1.0
    grad *= grad_scale / global_batch_size
    return loss, grad.astype(logits.dtype, copy=False)


def count_correct(logits, labels):
    """Number of samples whose arg-max logit equals the label (a Python int)."""
    if is_cupy(logits) and logits.dtype.name == "uint16":   # bfloat16 bit patterns: compare values
        logits = to_float32(logits)
    return int((logits.argmax(axis=1) == labels).sum())


# ----------------------------------------------------------------- GPU (CuPy) --

_SOFTMAX_SOURCE = CUDA_HELPERS + r"""
__device__ __forceinline__ float math_exp(float value) { return expf(value); }
__device__ __forceinline__ double math_exp(double value) { return exp(value); }
__device__ __forceinline__ float math_log(float value) { return logf(value); }
__device__ __forceinline__ double math_log(double value) { return log(value); }
__device__ __forceinline__ float math_nan(float) { return nanf(""); }
__device__ __forceinline__ double math_nan(double) { return nan(""); }

template <typename M>
__device__ M block_max(M value, M* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) {
        value = fmax(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        value = lane < n_warps ? scratch[lane] : scratch[0];
        for (int offset = 16; offset > 0; offset >>= 1) {
            value = fmax(value, __shfl_xor_sync(0xffffffffu, value, offset));
        }
        if (lane == 0) {
            scratch[32] = value;
        }
    }
    __syncthreads();
    value = scratch[32];
    __syncthreads();
    return value;
}

// One block per row: row_loss = log(sum exp(x - max)) - (x[label] - max) and
// grad = (softmax(x) - onehot(label)) * grad_factor. An out-of-range label gives a NaN loss.
template <typename S>
__global__ void hpcgpu_train_softmax_cross_entropy(
        const S* logits, const long long* labels, S* grad,
        typename MathType<S>::type* row_loss, int n_classes, double grad_factor) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[33];
    const long long offset = (long long)blockIdx.x * n_classes;
    M local_max = load_math(logits, offset);
    for (int j = threadIdx.x; j < n_classes; j += blockDim.x) {
        local_max = fmax(local_max, load_math(logits, offset + j));
    }
    const M row_max = block_max(local_max, scratch);
    M sum = 0;
    for (int j = threadIdx.x; j < n_classes; j += blockDim.x) {
        sum += math_exp(load_math(logits, offset + j) - row_max);
    }
    const M log_normaliser = math_log(block_sum(sum, scratch));
    const long long label = labels[blockIdx.x];
    const bool valid = label >= 0 && label < n_classes;
    if (threadIdx.x == 0) {
        row_loss[blockIdx.x] = valid
            ? log_normaliser - (load_math(logits, offset + label) - row_max) : math_nan((M)0);
    }
    const M factor = (M)grad_factor;
    for (int j = threadIdx.x; j < n_classes; j += blockDim.x) {
        M probability = math_exp(load_math(logits, offset + j) - row_max - log_normaliser);
        if (j == label) {
            probability -= (M)1;
        }
        store_math(grad, offset + j, probability * factor);
    }
}
"""


@functools.lru_cache(maxsize=None)
def _softmax_module():
    import cupy

    return cupy.RawModule(code=_SOFTMAX_SOURCE, name_expressions=[
        f"hpcgpu_train_softmax_cross_entropy<{storage}>" for storage in STORAGE_TYPES.values()])


def _softmax_cross_entropy_cupy(logits, labels, global_batch_size, grad_scale):
    import cupy

    logits = cupy.ascontiguousarray(logits)
    batch, n_classes = logits.shape
    row_loss = cupy.empty(batch, dtype=math_dtype(logits.dtype.name))
    grad = cupy.empty_like(logits)
    if batch and n_classes:
        kernel = _softmax_module().get_function(
            f"hpcgpu_train_softmax_cross_entropy<{STORAGE_TYPES[logits.dtype.name]}>")
        kernel((batch,), (int(min(256, 32 * ((n_classes + 31) // 32))),),
               (logits, cupy.ascontiguousarray(labels, dtype=cupy.int64), grad, row_loss,
                np.int32(n_classes), np.float64(grad_scale / global_batch_size)))
    return row_loss.sum() / global_batch_size, grad
