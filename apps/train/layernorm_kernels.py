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
then skips its own pass over the output).

GPU: one CUDA block per row for the forward pass and for ``grad_x`` (warp-shuffle
reductions, statistics in float32 -- float64 for float64 data), and a two-stage,
fixed-order column reduction for the parameter gradients (partial sums over chunks
of 64 rows, then one thread per feature sums the chunks and adds into the gradient
views) -- deterministic, no atomics. CPU: the NumPy expressions (statistics in
float32 for float16 input), which are also the reference of the GPU parity tests.
"""

import functools

import numpy as np

from ._backend import array_module, check_float_array, is_cupy
from ._cuda_source import CUDA_HELPERS, STORAGE_TYPES, math_dtype

#: Rows per chunk (at least) of the first stage of the parameter-gradient reduction.
ROWS_PER_CHUNK = 64


def layer_norm_forward(x, weight, bias, eps, input_bias=None):
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

    Returns
    -------
    y : ndarray, shape of ``x``, dtype of ``x``
    mean, inverse_std : ndarray, shape ``x.shape[:-1] + (1,)``
        Row statistics, float32 (float64 for float64 input); pass them to
        :func:`layer_norm_backward`.
    """
    _check(x, weight, bias, "layer_norm_forward")
    _check_input_bias(x, input_bias, "layer_norm_forward")
    if is_cupy(x):
        return _forward_cupy(x, weight, bias, float(eps), input_bias)
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
    return y.astype(x.dtype, copy=False), mean, inverse_std


def layer_norm_backward(grad_out, x, mean, inverse_std, weight, grad_weight, grad_bias,
                        input_bias=None):
    """Gradient of :func:`layer_norm_forward`; ADDS the parameter gradients.

    Parameters
    ----------
    grad_out : ndarray, shape of ``x``
        Gradient with respect to ``y``.
    x, mean, inverse_std : ndarray
        The forward input and the statistics it returned.
    weight : ndarray, shape (n_features,)
    grad_weight, grad_bias : ndarray, shape (n_features,)
        Gradient views, updated in place (``+=``).
    input_bias : ndarray, optional
        The forward's ``input_bias`` (the returned gradient is also the one with
        respect to ``x + input_bias``).

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
    if is_cupy(x) and grad_out.dtype == x.dtype and grad_bias.dtype == x.dtype:
        return _backward_cupy(grad_out, x, mean, inverse_std, weight, grad_weight, grad_bias,
                              input_bias)
    xp = array_module(x)
    if input_bias is not None:
        x = x + input_bias
    work = x.astype(xp.float32) if x.dtype == xp.float16 else x
    normalised = (work - mean) * inverse_std    # bitwise the forward's x_hat
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

_LAYER_NORM_SOURCE = CUDA_HELPERS + r"""
template <typename S>
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
        const M normalised = (load_biased(x, input_bias, offset + j, j) - mean) * inverse_std;
        store_math(y, offset + j, normalised * load_math(weight, j) + load_math(bias, j));
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        inverse_std_out[blockIdx.x] = inverse_std;
    }
}

template <typename S>
__global__ void hpcgpu_train_layer_norm_backward_input(
        const S* grad_out, const S* x, const S* input_bias, const S* weight,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        S* grad_input, int n_cols) {
    typedef typename MathType<S>::type M;
    __shared__ M scratch[33];
    const long long offset = (long long)blockIdx.x * n_cols;
    const M row_mean = mean[blockIdx.x];
    const M row_inverse_std = inverse_std[blockIdx.x];
    M sum_g = 0;
    M sum_g_xhat = 0;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = load_math(grad_out, offset + j) * load_math(weight, j);
        sum_g += g;
        sum_g_xhat += g * x_hat;
    }
    const M mean_g = block_sum(sum_g, scratch) / (M)n_cols;
    const M mean_g_xhat = block_sum(sum_g_xhat, scratch) / (M)n_cols;
    for (int j = threadIdx.x; j < n_cols; j += blockDim.x) {
        const M x_hat = (load_biased(x, input_bias, offset + j, j) - row_mean) * row_inverse_std;
        const M g = load_math(grad_out, offset + j) * load_math(weight, j);
        store_math(grad_input, offset + j, row_inverse_std * (g - mean_g - x_hat * mean_g_xhat));
    }
}

// Stage 1 of the parameter gradients: block (32, 8) covers 32 features of one chunk of
// rows; threadIdx.y strides over the chunk's rows, then the 8 row lanes are summed in order.
template <typename S>
__global__ void hpcgpu_train_layer_norm_backward_params_partial(
        const S* grad_out, const S* x, const S* input_bias,
        const typename MathType<S>::type* mean, const typename MathType<S>::type* inverse_std,
        typename MathType<S>::type* partial_weight, typename MathType<S>::type* partial_bias,
        long long n_rows, int n_cols, int rows_per_chunk) {
    typedef typename MathType<S>::type M;
    __shared__ M tile_weight[8][33];
    __shared__ M tile_bias[8][33];
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
            const M g = load_math(grad_out, index);
            const M x_hat = (load_biased(x, input_bias, index, column) - mean[row]) * inverse_std[row];
            sum_weight += g * x_hat;
            sum_bias += g;
        }
    }
    tile_weight[threadIdx.y][threadIdx.x] = sum_weight;
    tile_bias[threadIdx.y][threadIdx.x] = sum_bias;
    __syncthreads();
    if (threadIdx.y == 0 && column < n_cols) {
        M total_weight = 0;
        M total_bias = 0;
        for (int lane = 0; lane < 8; ++lane) {
            total_weight += tile_weight[lane][threadIdx.x];
            total_bias += tile_bias[lane][threadIdx.x];
        }
        partial_weight[(long long)blockIdx.y * n_cols + column] = total_weight;
        partial_bias[(long long)blockIdx.y * n_cols + column] = total_bias;
    }
}

// Stage 2: one thread per feature sums the chunks in order and ADDS into the gradients.
template <typename S>
__global__ void hpcgpu_train_layer_norm_backward_params_final(
        const typename MathType<S>::type* partial_weight,
        const typename MathType<S>::type* partial_bias,
        S* grad_weight, S* grad_bias, int n_chunks, int n_cols) {
    typedef typename MathType<S>::type M;
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= n_cols) {
        return;
    }
    M total_weight = 0;
    M total_bias = 0;
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        total_weight += partial_weight[(long long)chunk * n_cols + column];
        total_bias += partial_bias[(long long)chunk * n_cols + column];
    }
    store_math(grad_weight, column, load_math(grad_weight, column) + total_weight);
    store_math(grad_bias, column, load_math(grad_bias, column) + total_bias);
}
"""

_KERNEL_NAMES = ("hpcgpu_train_layer_norm_forward", "hpcgpu_train_layer_norm_backward_input",
                 "hpcgpu_train_layer_norm_backward_params_partial",
                 "hpcgpu_train_layer_norm_backward_params_final")


@functools.lru_cache(maxsize=None)
def _module():
    import cupy

    expressions = [f"{name}<{storage}>" for name in _KERNEL_NAMES
                   for storage in STORAGE_TYPES.values()]
    return cupy.RawModule(code=_LAYER_NORM_SOURCE, name_expressions=expressions)


def _kernel(name, dtype):
    return _module().get_function(f"{name}<{STORAGE_TYPES[np.dtype(dtype).name]}>")


def _row_block_size(n_cols):
    """Threads per row block: a multiple of 32, up to 256 (16 features per thread at 4096)."""
    return int(min(256, 32 * ((n_cols + 31) // 32)))


def _device_bias(input_bias, dtype):
    """The kernel argument for an optional input bias (a null pointer when absent)."""
    import cupy

    if input_bias is None:
        return np.uintp(0)
    return cupy.ascontiguousarray(input_bias, dtype=dtype)


def _forward_cupy(x, weight, bias, eps, input_bias=None):
    import cupy

    x_2d = cupy.ascontiguousarray(x).reshape(-1, x.shape[-1])
    n_rows, n_cols = x_2d.shape
    statistics_dtype = math_dtype(x.dtype.name)
    y = cupy.empty_like(x_2d)
    mean = cupy.empty(n_rows, dtype=statistics_dtype)
    inverse_std = cupy.empty(n_rows, dtype=statistics_dtype)
    if n_rows and n_cols:
        _kernel("hpcgpu_train_layer_norm_forward", x.dtype)(
            (n_rows,), (_row_block_size(n_cols),),
            (x_2d, _device_bias(input_bias, x.dtype), cupy.ascontiguousarray(weight, dtype=x.dtype),
             cupy.ascontiguousarray(bias, dtype=x.dtype), y, mean, inverse_std,
             np.int32(n_cols), np.float64(eps)))
    statistics_shape = tuple(x.shape[:-1]) + (1,)
    return y.reshape(x.shape), mean.reshape(statistics_shape), inverse_std.reshape(statistics_shape)


def _backward_cupy(grad_out, x, mean, inverse_std, weight, grad_weight, grad_bias, input_bias=None):
    import cupy

    n_cols = x.shape[-1]
    x_2d = cupy.ascontiguousarray(x).reshape(-1, n_cols)
    grad_2d = cupy.ascontiguousarray(grad_out).reshape(-1, n_cols)
    n_rows = x_2d.shape[0]
    statistics_dtype = math_dtype(x.dtype.name)
    mean_1d = cupy.ascontiguousarray(mean, dtype=statistics_dtype).reshape(-1)
    inverse_std_1d = cupy.ascontiguousarray(inverse_std, dtype=statistics_dtype).reshape(-1)
    weight = cupy.ascontiguousarray(weight, dtype=x.dtype)
    input_bias = _device_bias(input_bias, x.dtype)
    grad_input = cupy.empty_like(grad_2d)
    if n_rows == 0 or n_cols == 0:
        return grad_input.reshape(grad_out.shape)
    _kernel("hpcgpu_train_layer_norm_backward_input", x.dtype)(
        (n_rows,), (_row_block_size(n_cols),),
        (grad_2d, x_2d, input_bias, weight, mean_1d, inverse_std_1d, grad_input,
         np.int32(n_cols)))
    # at most 65535 chunks (the grid's y limit); 64 rows each up to 4M rows
    rows_per_chunk = max(ROWS_PER_CHUNK, -(-n_rows // 65535))
    n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
    partial_weight = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
    partial_bias = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
    _kernel("hpcgpu_train_layer_norm_backward_params_partial", x.dtype)(
        ((n_cols + 31) // 32, n_chunks), (32, 8),
        (grad_2d, x_2d, input_bias, mean_1d, inverse_std_1d, partial_weight, partial_bias,
         np.int64(n_rows), np.int32(n_cols), np.int32(rows_per_chunk)))
    if not (grad_weight.flags.c_contiguous and grad_bias.flags.c_contiguous):
        raise ValueError("layer_norm_backward: grad_weight and grad_bias must be contiguous views")
    _kernel("hpcgpu_train_layer_norm_backward_params_final", x.dtype)(
        ((n_cols + 255) // 256,), (256,),
        (partial_weight, partial_bias, grad_weight, grad_bias, np.int32(n_chunks),
         np.int32(n_cols)))
    return grad_input.reshape(grad_out.shape)
