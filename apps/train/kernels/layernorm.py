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
instead of twice (:class:`apps.train.nn.sequential.Sequential` fuses such pairs).

GPU: rows of up to 16 x 1024 features are held in registers, 16 values per thread
in 16-byte packs where the rows allow it, so the forward reads ``x`` once and the
backward reads ``x`` and the gradient once: one block per row for the forward; for
the backward one block per resident slot, each taking every k-th row, computing
``grad_x`` and accumulating its share of the parameter gradients in registers, then a
fixed-order sum of the per-block partials adds them into the gradient views. Longer
rows use one block per row that re-reads the row from cache, and 64-row chunks for
the parameter gradients. Statistics and sums in float32 (float64 for float64 data);
deterministic, no atomics. CPU: the NumPy expressions (statistics in float32 for
float16 or bfloat16 input), which are also the reference of the GPU parity tests.
"""

import functools

import numpy as np

from .backend import array_module, check_float_array, is_cupy, upcast_half
from .cuda_source import VECTOR_WIDTH, math_dtype
from .gelu import gelu_backward, gelu_forward
from .layernorm_cuda import ELEMENTS_PER_THREAD, MAX_THREADS, layer_norm_kernel

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
    work = upcast_half(x)
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
    if input_bias is not None:
        x = x + input_bias
    work = upcast_half(x)
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
    threads_needed = -(-n_cols // ELEMENTS_PER_THREAD)
    threads = 32 * max(1, -(-threads_needed // 32))
    if threads > MAX_THREADS:
        return None
    return width, threads


@functools.lru_cache(maxsize=None)
def _resident_blocks(kernel_name, dtype_name, width, gelu, threads, device_id):
    """Blocks of the backward rows kernel that fit on the device at once (registers, threads)."""
    import cupy

    kernel = layer_norm_kernel(kernel_name, dtype_name, width, gelu)
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
            layer_norm_kernel("hpcgpu_train_layer_norm_forward_rows", x.dtype, width, gelu)(
                (n_rows,), (threads,), arguments)
        else:
            layer_norm_kernel("hpcgpu_train_layer_norm_forward", x.dtype, gelu)(
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
        layer_norm_kernel("hpcgpu_train_layer_norm_backward_rows", x.dtype, width, gelu)(
            (n_chunks,), (threads,),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, grad_input,
             partial_weight, partial_bias, np.int64(n_rows), np.int32(n_cols)))
    else:
        layer_norm_kernel("hpcgpu_train_layer_norm_backward_input", x.dtype, gelu)(
            (n_rows,), (_row_block_size(n_cols),),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, grad_input,
             np.int32(n_cols)))
        # at most 65535 chunks (the grid's y limit); 64 rows each up to 4M rows
        rows_per_chunk = max(ROWS_PER_CHUNK, -(-n_rows // 65535))
        n_chunks = (n_rows + rows_per_chunk - 1) // rows_per_chunk
        partial_weight = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        partial_bias = cupy.empty((n_chunks, n_cols), dtype=statistics_dtype)
        layer_norm_kernel("hpcgpu_train_layer_norm_backward_params_partial", x.dtype, gelu)(
            ((n_cols + 31) // 32, n_chunks), (32, 8),
            (grad_2d, x_2d, input_bias, weight, bias, mean_1d, inverse_std_1d, partial_weight,
             partial_bias, np.int64(n_rows), np.int32(n_cols), np.int32(rows_per_chunk)))
    layer_norm_kernel("hpcgpu_train_layer_norm_backward_params_final", x.dtype)(
        ((n_cols + 31) // 32,), (32, 8),
        (partial_weight, partial_bias, grad_weight, grad_bias, np.int32(n_chunks),
         np.int32(n_cols)))
    return grad_input.reshape(grad_out.shape)
