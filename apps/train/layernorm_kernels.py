"""Layer normalisation over the last axis: forward and backward kernels.

For a row ``x`` of ``n`` features::

    mean = sum(x) / n,   inverse_std = 1 / sqrt(sum((x - mean)**2) / n + eps)
    x_hat = (x - mean) * inverse_std,   y = x_hat * weight + bias

and for ``g = grad_y * weight``::

    grad_x      = inverse_std * (g - mean(g) - x_hat * mean(g * x_hat))
    grad_weight += sum over rows of grad_y * x_hat
    grad_bias   += sum over rows of grad_y

Forward saves ``mean`` and ``inverse_std`` (one value per row); backward recomputes
``x_hat`` from the input instead of storing it (one read of ``x`` is cheaper than
writing and re-reading a float32 copy). An optional ``input_bias`` is added to
``x`` on the fly in both directions (the bias of a preceding Linear layer, which
then skips its own pass over the output). ``activation="gelu"`` applies GELU to
``y`` in the same pass; backward recomputes ``y`` and takes ``gelu'(y)`` before the
LayerNorm gradient -- a LayerNorm -> GELU pair reads and writes each activation once
instead of twice (:class:`apps.train.sequential.Sequential` fuses such pairs).

GPU: rows of up to 16 x 1024 features are held in registers, 16 values per thread
in 16-byte packs where the rows allow it, so the forward reads ``x`` once and the
backward reads ``x`` and the gradient once: one block per row for the forward; for
the backward one block per resident slot, each taking every k-th row, computing
``grad_x`` and accumulating its share of the parameter gradients in registers, then a
fixed-order sum of the per-block partials adds them into the gradient views. Longer
rows use one block per row that re-reads the row from cache, and 64-row chunks for
the parameter gradients. Statistics and sums in float32 (float64 for float64 data);
deterministic, no atomics. CPU: the NumPy expressions (statistics in float32 for
float16 input), which are also the reference of the GPU parity tests.
"""

import functools

import numpy as np

from ._backend import array_module, check_float_array, is_cupy
from ._cuda_source import CUDA_HELPERS, GELU_FUNCTIONS, STORAGE_TYPES, VECTOR_WIDTH, math_dtype
from .gelu_kernels import gelu_backward, gelu_forward

#: Activations a LayerNorm can apply to its own output (``activation=``).
ACTIVATIONS = (None, "gelu")

#: Rows per chunk (at least) of the first stage of the parameter-gradient reduction.
ROWS_PER_CHUNK = 64


def layer_norm_forward(x, weight, bias, eps, input_bias=None, activation=None):
    """Normalise the last axis of ``x``, then scale by ``weight`` and shift by ``bias``.

    Parameters
    ----------
    x : ndarray, shape (..., n_features)
        float16, float32 or float64 (NumPy or CuPy).
    weight, bias : ndarray, shape (n_features,)
        Same backend and dtype as ``x``.
    eps : float
        Added to the variance.
    input_bias : ndarray, shape (n_features,), optional
        Added to ``x`` first (rounded to its dtype): the bias of a preceding Linear
        layer, folded in here instead of a separate pass over its output.
    activation : {None, "gelu"}
        ``"gelu"``: return ``gelu(y)`` (tanh approximation) instead of ``y``, as the
        separate GELU kernels would compute it from the stored ``y`` (bitwise on the
        GPU), without writing and re-reading ``y``.

    Returns
    -------
    y : ndarray, shape of ``x``, dtype of ``x``
        The normalised output, or its activation.
    mean, inverse_std : ndarray, shape ``x.shape[:-1] + (1,)``
        Row statistics, float32 (float64 for float64 input); pass them to
        :func:`layer_norm_backward`.
    """
    _check(x, weight, bias, "layer_norm_forward")
    _check_input_bias(x, input_bias, "layer_norm_forward")
    _check_activation(activation, "layer_norm_forward")
    if is_cupy(x):
        return _forward_cupy(x, weight, bias, float(eps), input_bias, activation)
    xp = array_module(x)
    if input_bias is not None:
        x = x + input_bias
    work = x.astype(xp.float32) if x.dtype == xp.float16 else x
    mean = work.mean(axis=-1, keepdims=True)
    centred = work - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    inverse_std = 1.0 / xp.sqrt(variance + eps)
    normalised = centred * inverse_std
    y = normalised * weight.astype(work.dtype, copy=False) + bias.astype(work.dtype, copy=False)
    y = y.astype(x.dtype, copy=False)
    if activation == "gelu":
        y = gelu_forward(y)
    return y, mean, inverse_std


def layer_norm_backward(grad_out, x, mean, inverse_std, weight, grad_weight, grad_bias,
                        input_bias=None, bias=None, activation=None):
    """Gradient of :func:`layer_norm_forward`; ADDS the parameter gradients.

    Parameters
    ----------
    grad_out : ndarray, shape of ``x``
        Gradient with respect to the forward's result (``y`` or its activation).
    x, mean, inverse_std : ndarray
        The forward input and the statistics it returned.
    weight : ndarray, shape (n_features,)
    grad_weight, grad_bias : ndarray, shape (n_features,)
        Gradient views, updated in place (``+=``).
    input_bias : ndarray, optional
        The forward's ``input_bias`` (the returned gradient is also the one with
        respect to ``x + input_bias``).
    bias : ndarray, shape (n_features,), optional
        The LayerNorm bias; needed (only) with an activation, to recompute ``y``.
    activation : {None, "gelu"}
        The forward's ``activation``.

    Returns
    -------
    ndarray, shape and dtype of ``grad_out``
        Gradient with respect to ``x``.
    """
    _check(x, weight, grad_weight, "layer_norm_backward")
    if grad_out.shape != x.shape or grad_bias.shape != grad_weight.shape:
        raise ValueError(
            f"layer_norm_backward: grad_out {tuple(grad_out.shape)} must match x "
            f"{tuple(x.shape)}, grad_bias {tuple(grad_bias.shape)} must match grad_weight "
            f"{tuple(grad_weight.shape)}"
        )
    _check_input_bias(x, input_bias, "layer_norm_backward")
    _check_activation(activation, "layer_norm_backward")
    if activation is not None:
        _check(x, weight, bias, "layer_norm_backward")
    if is_cupy(x) and grad_out.dtype == x.dtype and grad_bias.dtype == x.dtype:
        return _backward_cupy(grad_out, x, mean, inverse_std, weight, bias, grad_weight, grad_bias,
                              input_bias, activation)
    xp = array_module(x)
    if input_bias is not None:
        x = x + input_bias
    work = x.astype(xp.float32) if x.dtype == xp.float16 else x
    normalised = (work - mean) * inverse_std    # bitwise the forward's x_hat
    if activation == "gelu":
        y = normalised * weight.astype(work.dtype, copy=False) + bias.astype(work.dtype, copy=False)
        grad_out = gelu_backward(y.astype(x.dtype, copy=False), grad_out)
    work_grad = grad_out.astype(normalised.dtype, copy=False)
    reduce_axes = tuple(range(grad_out.ndim - 1))
    grad_weight += (work_grad * normalised).sum(axis=reduce_axes).astype(
        grad_weight.dtype, copy=False)
    grad_bias += work_grad.sum(axis=reduce_axes).astype(grad_bias.dtype, copy=False)
    grad_normalised = work_grad * weight.astype(normalised.dtype, copy=False)
    grad_input = inverse_std * (
        grad_normalised
        - grad_normalised.mean(axis=-1, keepdims=True)
        - normalised * (grad_normalised * normalised).mean(axis=-1, keepdims=True)
    )
    return grad_input.astype(grad_out.dtype, copy=False)


def _check_activation(activation, function_name):
    if activation not in ACTIVATIONS:
        raise ValueError(f"{function_name}: activation must be one of {ACTIVATIONS}, found {activation!r}")


def _check_input_bias(x, input_bias, function_name):
    if input_bias is None:
        return
    check_float_array(input_bias, f"{function_name}: input_bias", ndim=1)
    if input_bias.shape != (x.shape[-1],) or input_bias.dtype != x.dtype:
        raise ValueError(
            f"{function_name}: input_bias must have shape ({x.shape[-1]},) and dtype {x.dtype}, "
            f"found {input_bias.dtype}{tuple(input_bias.shape)}"
        )
    if is_cupy(input_bias) != is_cupy(x):
        raise TypeError(f"{function_name}: input_bias is on a different backend than x")


def _check(x, weight, other, function_name):
    check_float_array(x, f"{function_name}: x")
    if x.ndim < 1:
        raise ValueError(f"{function_name}: x must have at least one axis, found a scalar")
    n_features = x.shape[-1]
    for name, array in (("weight", weight), ("second parameter", other)):
        check_float_array(array, f"{function_name}: {name}", ndim=1)
        if array.shape != (n_features,):
            raise ValueError(
                f"{function_name}: {name} has shape {tuple(array.shape)}, expected "
                f"({n_features},) to match the last axis of x {tuple(x.shape)}"
            )
        if is_cupy(array) != is_cupy(x):
            raise TypeError(f"{function_name}: {name} is on a different backend than x")


# ----------------------------------------------------------------- GPU (CuPy) --

_LAYER_NORM_SOURCE = CUDA_HELPERS + GELU_FUNCTIONS + r"""
// Values per thread of the row-in-registers kernels (PACKS = ELEMENTS / VEC packs each).
#define HPCGPU_LN_ELEMENTS 16

// Two block-wide sums at once (one round of barriers); scratch: 66 elements.
template <typename M>
__device__ void block_sum_pair(M& a, M& b, M* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        scratch[warp] = a;
        scratch[33 + warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        M partial_a = lane < n_warps ? scratch[lane] : (M)0;
        M partial_b = lane < n_warps ? scratch[33 + lane] : (M)0;
        partial_a = warp_sum(partial_a);
        partial_b = warp_sum(partial_b);
        if (lane == 0) {
            scratch[32] = partial_a;
            scratch[65] = partial_b;
        }
    }
    __syncthreads();
    a = scratch[32];
    b = scratch[65];
    __syncthreads();
}

// The LayerNorm output x_hat * weight + bias, then (GELU) the activation of it rounded like a
// stored tensor: the fused output is bitwise the GELU kernel applied to the stored LayerNorm output.
template <bool GELU, typename S>
__device__ __forceinline__ typename MathType<S>::type output_value(
        const S* storage, typename MathType<S>::type x_hat, const S* weight, const S* bias,
        long long column) {
    typedef typename MathType<S>::type M;
    const M y = x_hat * load_math(weight, column) + load_math(bias, column);
    return GELU ? gelu_value(round_to_storage(storage, y)) : y;
}

// Gradient with respect to the LayerNorm output: the incoming gradient itself, or (GELU) the
// incoming gradient times gelu'(y) with y recomputed, rounded like the GELU kernel's stored result.
template <bool GELU, typename S>
__device__ __forceinline__ typename MathType<S>::type output_grad(
        const S* storage, typename MathType<S>::type grad, typename MathType<S>::type x_hat,
        const S* weight, const S* bias, long long column) {
    typedef typename MathType<S>::type M;
    if (!GELU) {
        return grad;
    }
    const M y = round_to_storage(storage, x_hat * load_math(weight, column) + load_math(bias, column));
    return round_to_storage(storage, grad * gelu_derivative(y));
}

// ---- row in registers (n_cols <= ELEMENTS * blockDim.x, a multiple of VEC, 16-byte aligned rows):
// thread t holds packs t, t + blockDim.x, ... of the row, so x is read from memory once.

template <typename S, int VEC, bool GELU>
__global__ void hpcgpu_train_layer_norm_forward_rows(
        const S* x, const S* input_bias, const S* weight, const S* bias, S* y,
        typename MathType<S>::type* mean_out, typename MathType<S>::type* inverse_std_out,
        int n_cols, double eps) {
    typedef typename MathType<S>::type M;
    typedef Pack<S, VEC> P;
    constexpr int PACKS = HPCGPU_LN_ELEMENTS / VEC;
    __shared__ M scratch[33];
    const int n_packs = n_cols / VEC;
    const long long offset = (long long)blockIdx.x * n_cols;
    const P* x_row = reinterpret_cast<const P*>(x + offset);
    P* y_row = reinterpret_cast<P*>(y + offset);
    M v[PACKS][VEC];
    M sum = 0;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
            const P loaded = x_row[pack];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                v[p][k] = load_biased(loaded.value, input_bias, k, (long long)pack * VEC + k);
                sum += v[p][k];
            }
        }
    }
    const M mean = block_sum(sum, scratch) / (M)n_cols;
    M squares = 0;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        if (p * blockDim.x + threadIdx.x < n_packs) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const M centred = v[p][k] - mean;
                squares += centred * centred;
            }
        }
    }
    const M variance = block_sum(squares, scratch) / (M)n_cols;
    const M inverse_std = (M)1 / math_sqrt(variance + (M)eps);
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
            P out;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const M x_hat = (v[p][k] - mean) * inverse_std;
                store_math(out.value, k, output_value<GELU>(y, x_hat, weight, bias, (long long)pack * VEC + k));
            }
            y_row[pack] = out;
        }
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        inverse_std_out[blockIdx.x] = inverse_std;
    }
}

// grad_x of rows blockIdx.x, blockIdx.x + gridDim.x, ... and this block's partial sums of the
// parameter gradients over those rows (one row of partial_weight / partial_bias per block).
template <typename S, int VEC, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_rows(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        S* grad_input, typename MathType<S>::type* partial_weight,
        typename MathType<S>::type* partial_bias, long long n_rows, int n_cols) {
    typedef typename MathType<S>::type M;
    typedef Pack<S, VEC> P;
    constexpr int PACKS = HPCGPU_LN_ELEMENTS / VEC;
    __shared__ M scratch[66];
    const int n_packs = n_cols / VEC;
    M sum_weight[PACKS][VEC];
    M sum_bias[PACKS][VEC];
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            sum_weight[p][k] = 0;
            sum_bias[p][k] = 0;
        }
    }
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const long long offset = row * n_cols;
        const P* x_row = reinterpret_cast<const P*>(x + offset);
        const P* grad_row = reinterpret_cast<const P*>(grad_out + offset);
        const M row_mean = mean[row];
        const M row_inverse_std = inverse_std[row];
        M x_hat[PACKS][VEC];
        M g[PACKS][VEC];      // times weight: the gradient with respect to x_hat
        M sum_g = 0;
        M sum_g_xhat = 0;
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int pack = p * blockDim.x + threadIdx.x;
            if (pack < n_packs) {
                const P x_pack = x_row[pack];
                const P grad_pack = grad_row[pack];
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const long long column = (long long)pack * VEC + k;
                    x_hat[p][k] = (load_biased(x_pack.value, input_bias, k, column) - row_mean) * row_inverse_std;
                    const M grad_y = output_grad<GELU>(x, load_math(grad_pack.value, k), x_hat[p][k],
                                                       weight, bias, column);
                    sum_weight[p][k] += grad_y * x_hat[p][k];
                    sum_bias[p][k] += grad_y;
                    g[p][k] = grad_y * load_math(weight, column);
                    sum_g += g[p][k];
                    sum_g_xhat += g[p][k] * x_hat[p][k];
                }
            }
        }
        block_sum_pair(sum_g, sum_g_xhat, scratch);
        const M mean_g = sum_g / (M)n_cols;
        const M mean_g_xhat = sum_g_xhat / (M)n_cols;
        P* out_row = reinterpret_cast<P*>(grad_input + offset);
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
            const int pack = p * blockDim.x + threadIdx.x;
            if (pack < n_packs) {
                P out;
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    store_math(out.value, k, row_inverse_std * (g[p][k] - mean_g - x_hat[p][k] * mean_g_xhat));
                }
                out_row[pack] = out;
            }
        }
    }
    const long long base = (long long)blockIdx.x * n_cols;
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
        const int pack = p * blockDim.x + threadIdx.x;
        if (pack < n_packs) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                partial_weight[base + (long long)pack * VEC + k] = sum_weight[p][k];
                partial_bias[base + (long long)pack * VEC + k] = sum_bias[p][k];
            }
        }
    }
}

// ---- any row length: one block per row, the row re-read from L1/L2 on each pass.

template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_forward(
        const S* x, const S* input_bias, const S* weight, const S* bias, S* y,
        typename MathType<S>::type* mean_out, typename MathType<S>::type* inverse_std_out,
        int n_cols, double eps) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[33];
    const long long offset = (long long)blockIdx.x * n_cols;
    M sum = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        sum += load_biased(x, input_bias, offset + j, j);
    }
    const M mean = block_sum(sum, scratch) / (M)n_cols;
    // second pass over the row (from L1/L2): the two-pass variance does not cancel
    M squares = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M centred = load_biased(x, input_bias, offset + j, j) - mean;
        squares += centred * centred;
    }
    const M variance = block_sum(squares, scratch) / (M)n_cols;
    const M inverse_std = (M)1 / math_sqrt(variance + (M)eps);
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - mean) * inverse_std;
        store_math(y, offset + j, output_value<GELU>(y, x_hat, weight, bias, j));
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        inverse_std_out[blockIdx.x] = inverse_std;
    }
}

template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_input(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        S* grad_input, int n_cols) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[66];
    const long long offset = (long long)blockIdx.x * n_cols;
    const M row_mean = mean[blockIdx.x];
    const M row_inverse_std = inverse_std[blockIdx.x];
    M sum_g = 0;
    M sum_g_xhat = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = output_grad<GELU>(x, load_math(grad_out, offset + j), x_hat, weight, bias, j)
                    * load_math(weight, j);
        sum_g += g;
        sum_g_xhat += g * x_hat;
    }
    block_sum_pair(sum_g, sum_g_xhat, scratch);
    const M mean_g = sum_g / (M)n_cols;
    const M mean_g_xhat = sum_g_xhat / (M)n_cols;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = output_grad<GELU>(x, load_math(grad_out, offset + j), x_hat, weight, bias, j)
                    * load_math(weight, j);
        store_math(grad_input, offset + j, row_inverse_std * (g - mean_g - x_hat * mean_g_xhat));
    }
}

// In a (32, 8) block: the 8 row lanes' sums of each of the 32 features, added in lane order;
// the totals land in sum_weight / sum_bias of the threads with threadIdx.y == 0.
template <typename M>
__device__ __forceinline__ void sum_row_lanes(M& sum_weight, M& sum_bias) {
    __shared__ M tile_weight[8][33];
    __shared__ M tile_bias[8][33];
    tile_weight[threadIdx.y][threadIdx.x] = sum_weight;
    tile_bias[threadIdx.y][threadIdx.x] = sum_bias;
    __syncthreads();
    if (threadIdx.y == 0) {
        sum_weight = 0;
        sum_bias = 0;
        for (int lane = 0; lane < 8; ++lane) {
            sum_weight += tile_weight[lane][threadIdx.x];
            sum_bias += tile_bias[lane][threadIdx.x];
        }
    }
}

// Parameter-gradient partial sums over chunks of rows: block (32, 8) covers 32 features of one
// chunk; threadIdx.y strides over the chunk's rows, then the 8 row lanes are summed in order.
template <typename S, bool GELU>
__global__ void hpcgpu_train_layer_norm_backward_params_partial(
        const S* grad_out, const S* x, const S* input_bias, const S* weight, const S* bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        typename MathType<S>::type* partial_weight, typename MathType<S>::type* partial_bias,
        long long n_rows, int n_cols, int rows_per_chunk) {
    typedef typename MathType<S>::type M;
    const int column = blockIdx.x * 32 + threadIdx.x;
    const long long row_start = (long long)blockIdx.y * rows_per_chunk;
    long long row_end = row_start + rows_per_chunk;
    if (row_end > n_rows) {
        row_end = n_rows;
    }
    M sum_weight = 0;
    M sum_bias = 0;
    if (column < n_cols) {
        for (long long row = row_start + threadIdx.y; row < row_end; row += 8) {
            const long long index = row * n_cols + column;
            const M x_hat = (load_biased(x, input_bias, index, column) - mean[row]) * inverse_std[row];
            const M g = output_grad<GELU>(x, load_math(grad_out, index), x_hat, weight, bias, column);
            sum_weight += g * x_hat;
            sum_bias += g;
        }
    }
    sum_row_lanes(sum_weight, sum_bias);
    if (threadIdx.y == 0 && column < n_cols) {
        partial_weight[(long long)blockIdx.y * n_cols + column] = sum_weight;
        partial_bias[(long long)blockIdx.y * n_cols + column] = sum_bias;
    }
}

// Sums the (n_chunks, n_cols) partials in a fixed order and ADDS them into the gradients:
// block (32, 8) covers 32 features; lane y takes chunks y, y + 8, ..., then the lanes in order.
template <typename S>
__global__ void hpcgpu_train_layer_norm_backward_params_final(
        const typename MathType<S>::type* partial_weight,
        const typename MathType<S>::type* partial_bias,
        S* grad_weight, S* grad_bias, int n_chunks, int n_cols) {
    typedef typename MathType<S>::type M;
    const int column = blockIdx.x * 32 + threadIdx.x;
    M sum_weight = 0;
    M sum_bias = 0;
    if (column < n_cols) {
        for (int chunk = threadIdx.y; chunk < n_chunks; chunk += 8) {
            sum_weight += partial_weight[(long long)chunk * n_cols + column];
            sum_bias += partial_bias[(long long)chunk * n_cols + column];
        }
    }
    sum_row_lanes(sum_weight, sum_bias);
    if (threadIdx.y == 0 && column < n_cols) {
        store_math(grad_weight, column, load_math(grad_weight, column) + sum_weight);
        store_math(grad_bias, column, load_math(grad_bias, column) + sum_bias);
    }
}
"""

#: Values of a row each thread of the row-in-registers kernels holds (HPCGPU_LN_ELEMENTS).
_ELEMENTS_PER_THREAD = 16
_MAX_THREADS = 1024


def _name_expressions():
    names = []
    for dtype_name, storage in STORAGE_TYPES.items():
        for gelu in ("false", "true"):
            for width in sorted({1, VECTOR_WIDTH[dtype_name]}):
                names += [f"hpcgpu_train_layer_norm_forward_rows<{storage}, {width}, {gelu}>",
                          f"hpcgpu_train_layer_norm_backward_rows<{storage}, {width}, {gelu}>"]
            names += [f"hpcgpu_train_layer_norm_{kernel}<{storage}, {gelu}>"
                      for kernel in ("forward", "backward_input", "backward_params_partial")]
        names.append(f"hpcgpu_train_layer_norm_backward_params_final<{storage}>")
    return names


@functools.lru_cache(maxsize=None)
def _module():
    import cupy

    return cupy.RawModule(code=_LAYER_NORM_SOURCE, name_expressions=_name_expressions())


def _kernel(name, dtype, *template_arguments):
    arguments = ", ".join([STORAGE_TYPES[np.dtype(dtype).name]] + [str(a) for a in template_arguments])
    return _module().get_function(f"{name}<{arguments}>")


def _gelu_flag(activation):
    return "true" if activation == "gelu" else "false"


def _row_block_size(n_cols):
    """Threads per row block of the any-length kernels: a multiple of 32, up to 256."""
    return int(min(256, 32 * ((n_cols + 31) // 32)))


def _rows_layout(n_cols, dtype, arrays):
    """(vector width, threads per block) for the row-in-registers kernels, or None.

    They need a row to fit in ``16 * 1024`` values; rows are moved in 16-byte packs when
    ``n_cols`` is a multiple of the pack and every row array is 16-byte aligned, else one
    value at a time.
    """
    width = VECTOR_WIDTH[np.dtype(dtype).name]
    if n_cols % width or any(int(a.data.ptr) % 16 for a in arrays):
        width = 1
    threads_needed = -(-n_cols // _ELEMENTS_PER_THREAD)
    threads = 32 * max(1, -(-threads_needed // 32))
    if threads > _MAX_THREADS:
        return None
    return width, threads


@functools.lru_cache(maxsize=None)
def _resident_blocks(kernel_name, dtype_name, width, gelu, threads, device_id):
    """Blocks of the backward rows kernel that fit on the device at once (registers, threads)."""
    import cupy

    kernel = _kernel(kernel_name, dtype_name, width, gelu)
    device = cupy.cuda.Device(device_id)
    warps = threads // 32
    # registers per thread as compiled (RawKernel.num_regs); 128 if CuPy cannot say
    registers = int(getattr(kernel, "num_regs", 0) or 128)
    registers_per_warp = 256 * -(-registers * 32 // 256)
    attributes = device.attributes
    by_registers = (attributes.get("MaxRegistersPerMultiprocessor", 65536) // registers_per_warp) // warps
    by_threads = attributes.get("MaxThreadsPerMultiProcessor", 2048) // threads
    per_multiprocessor = max(1, min(by_registers, by_threads, 32))
    return per_multiprocessor * attributes["MultiProcessorCount"]


def _device_bias(input_bias, dtype):
    """The kernel argument for an optional input bias (a null pointer when absent)."""
    import cupy

    if input_bias is None:
        return np.uintp(0)
    return cupy.ascontiguousarray(input_bias, dtype=dtype)


def _forward_cupy(x, weight, bias, eps, input_bias=None, activation=None):
    import cupy

    x_2d = cupy.ascontiguousarray(x).reshape(-1, x.shape[-1])
    n_rows, n_cols = x_2d.shape
    statistics_dtype = math_dtype(x.dtype.name)
    y = cupy.empty_like(x_2d)
    mean = cupy.empty(n_rows, dtype=statistics_dtype)
    inverse_std = cupy.empty(n_rows, dtype=statistics_dtype)
    if n_rows and n_cols:
        gelu = _gelu_flag(activation)
        arguments = (x_2d, _device_bias(input_bias, x.dtype), cupy.ascontiguousarray(weight, dtype=x.dtype),
                     cupy.ascontiguousarray(bias, dtype=x.dtype), y, mean, inverse_std,
                     np.int32(n_cols), np.float64(eps))
        layout = _rows_layout(n_cols, x.dtype, (x_2d, y))
        if layout is not None:
            width, threads = layout
            _kernel("hpcgpu_train_layer_norm_forward_rows", x.dtype, width, gelu)(
                (n_rows,), (threads,), arguments)
        else:
            _kernel("hpcgpu_train_layer_norm_forward", x.dtype, gelu)(
                (n_rows,), (_row_block_size(n_cols),), arguments)
    statistics_shape = tuple(x.shape[:-1]) + (1,)
    return y.reshape(x.shape), mean.reshape(statistics_shape), inverse_std.reshape(statistics_shape)


def _backward_cupy(grad_out, x, mean, inverse_std, weight, bias, grad_weight, grad_bias,
                   input_bias=None, activation=None):
    import cupy

    n_cols = x.shape[-1]
    x_2d = cupy.ascontiguousarray(x).reshape(-1, n_cols)
    grad_2d = cupy.ascontiguousarray(grad_out).reshape(-1, n_cols)
    n_rows = x_2d.shape[0]
    statistics_dtype = math_dtype(x.dtype.name)
    mean_1d = cupy.ascontiguousarray(mean, dtype=statistics_dtype).reshape(-1)
    inverse_std_1d = cupy.ascontiguousarray(inverse_std, dtype=statistics_dtype).reshape(-1)
    weight = cupy.ascontiguousarray(weight, dtype=x.dtype)
    # the LayerNorm bias only enters the gradient through a fused activation
    bias = cupy.ascontiguousarray(bias, dtype=x.dtype) if activation is not None else np.uintp(0)
    input_bias = _device_bias(input_bias, x.dtype)
    grad_input = cupy.empty_like(grad_2d)
    if n_rows == 0 or n_cols == 0:
        return grad_input.reshape(grad_out.shape)
    if not (grad_weight.flags.c_contiguous and grad_bias.flags.c_contiguous):
        raise ValueError("layer_norm_backward: grad_weight and grad_bias must be contiguous views")
    gelu = _gelu_flag(activation)
    layout = _rows_layout(n_cols, x.dtype, (x_2d, grad_2d, grad_input))
    if layout is not None:
        # grad_x and the parameter-gradient partial sums in one pass over grad and x; each
        # resident block takes every n_chunks-th row
        width, threads = layout
        n_chunks = min(n_rows, _resident_blocks("hpcgpu_train_layer_norm_backward_rows", x.dtype.name,
                                                width, gelu, threads, cupy.cuda.Device().id))
        partial_weight = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        partial_bias = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        _kernel("hpcgpu_train_layer_norm_backward_rows", x.dtype, width, gelu)(
            (n_chunks,), (threads,),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, grad_input,
             partial_weight, partial_bias, np.int64(n_rows), np.int32(n_cols)))
    else:
        _kernel("hpcgpu_train_layer_norm_backward_input", x.dtype, gelu)(
            (n_rows,), (_row_block_size(n_cols),),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, grad_input,
             np.int32(n_cols)))
        # at most 65535 chunks (the grid's y limit); 64 rows each up to 4M rows
        rows_per_chunk = max(ROWS_PER_CHUNK, -(-n_rows // 65535))
        n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
        partial_weight = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        partial_bias = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        _kernel("hpcgpu_train_layer_norm_backward_params_partial", x.dtype, gelu)(
            ((n_cols + 31) // 32, n_chunks), (32, 8),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, partial_weight,
             partial_bias, np.int64(n_rows), np.int32(n_cols), np.int32(rows_per_chunk)))
    _kernel("hpcgpu_train_layer_norm_backward_params_final", x.dtype)(
        ((n_cols + 31) // 32,), (32, 8),
        (partial_weight, partial_bias, grad_weight, grad_bias, np.int32(n_chunks),
         np.int32(n_cols)))
    return grad_input.reshape(grad_out.shape)
