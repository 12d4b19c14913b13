"""1-D convolution and pooling layers built on im2col + matrix multiply.

Shapes follow PyTorch: inputs are ``(batch, channels, length)``. Each layer turns
its receptive fields into rows with :func:`apps.train.kernels.im2col.im2col`, so the
convolution is a single GEMM (cuBLAS / BLAS do the heavy lifting) and pooling is
a reduction over the kernel axis; backward goes through the adjoint
:func:`apps.train.kernels.im2col.col2im`.
"""

import numpy as np

from apps.train.kernels.backend import array_module, is_bfloat16, is_half
from apps.train.kernels.im2col import col2im, conv_output_length, im2col
from .layers import Layer
from .params import ParamSpec


def _col2im_any_dtype(cols, length, kernel_size, stride, padding):
    """col2im in float32 for float16/bfloat16 columns (the kernel adds, 16 bits would lose bits)."""
    if is_half(cols.dtype):
        return col2im(cols.astype(np.float32), length, kernel_size, stride, padding).astype(
            cols.dtype)
    return col2im(cols, length, kernel_size, stride, padding)


def _product(a, b):
    """``a @ b``; bfloat16 operands are multiplied in float32 and the product rounded once
    (NumPy's bfloat16 matmul would return float32)."""
    if is_bfloat16(a.dtype):
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)
    return a @ b


def _add_into(target, addend_float32):
    """``target += addend`` with the sum in float32 and one rounding (bfloat16 targets); returns None."""
    target[...] = target.astype(np.float32) + addend_float32


class Conv1d(Layer):
    """1-D cross-correlation with zero padding (PyTorch ``nn.Conv1d`` semantics).

    ``y[b, o, t] = bias[o] + sum_{c, j} weight[o, c, j] * x[b, c, t * stride - padding + j]``

    Parameters: ``weight`` (out_channels, in_channels, kernel_size) and ``bias``
    (out_channels), initialised ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with
    ``fan_in = in_channels * kernel_size``. Input (batch, in_channels, length),
    output (batch, out_channels, out_length) with
    ``out_length = (length + 2 padding - kernel_size) // stride + 1``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = int(kernel_size)
        self.stride = int(stride)
        self.padding = int(padding)
        self.use_bias = bool(bias)

    def param_specs(self):
        fan_in = self.in_channels * self.kernel_size
        specs = [ParamSpec("weight", (self.out_channels, self.in_channels, self.kernel_size),
                           "uniform_fan_in", fan_in)]
        if self.use_bias:
            specs.append(ParamSpec("bias", (self.out_channels,), "uniform_fan_in", fan_in))
        return specs

    def output_length(self, length):
        return conv_output_length(length, self.kernel_size, self.stride, self.padding)

    def forward(self, x, ctx):
        if x.ndim != 3 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{self.name}: expected input (batch, {self.in_channels}, length), found "
                f"shape {tuple(x.shape)}; insert Reshape((channels, length)) before it"
            )
        xp = array_module(x)
        cols = im2col(x, self.kernel_size, self.stride, self.padding)
        self._saved_cols = cols
        self._saved_length = int(x.shape[2])
        weight_2d = self.params["weight"].reshape(self.out_channels, -1)
        y = _product(cols, weight_2d.T)                 # (batch, out_length, out_channels)
        if self.use_bias:
            y += self.params["bias"]
        return xp.ascontiguousarray(y.transpose(0, 2, 1))

    def backward(self, grad_out):
        cols = self._saved_cols
        batch, out_length, width = cols.shape
        grad_rows = grad_out.transpose(0, 2, 1).reshape(batch * out_length, self.out_channels)
        cols_2d = cols.reshape(batch * out_length, width)
        weight_2d = self.params["weight"].reshape(self.out_channels, -1)
        if is_bfloat16(grad_rows.dtype):
            rows_32 = grad_rows.astype(np.float32)
            _add_into(self.grads["weight"], (rows_32.T @ cols_2d.astype(np.float32)).reshape(
                self.grads["weight"].shape))
            if self.use_bias:
                _add_into(self.grads["bias"], rows_32.sum(axis=0))
            grad_cols = _product(grad_rows, weight_2d).reshape(batch, out_length, width)
            return _col2im_any_dtype(grad_cols, self._saved_length, self.kernel_size,
                                     self.stride, self.padding)
        self.grads["weight"] += (grad_rows.T @ cols_2d).reshape(self.grads["weight"].shape)
        if self.use_bias:
            self.grads["bias"] += grad_rows.sum(axis=0)
        grad_cols = (grad_rows @ weight_2d).reshape(batch, out_length, width)
        return _col2im_any_dtype(grad_cols, self._saved_length, self.kernel_size,
                                 self.stride, self.padding)

    def __repr__(self):
        return (f"Conv1d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding})")


class _Pool1d(Layer):
    """Shared geometry for pooling windows (no padding; stride defaults to the kernel)."""

    def __init__(self, kernel_size, stride=None):
        super().__init__()
        self.kernel_size = int(kernel_size)
        self.stride = int(stride) if stride is not None else self.kernel_size

    def _windows(self, x):
        """Windows as (batch, out_length, channels, kernel_size)."""
        if x.ndim != 3:
            raise ValueError(
                f"{self.name}: expected input (batch, channels, length), found shape "
                f"{tuple(x.shape)}"
            )
        batch, channels, length = x.shape
        self._saved_geometry = (int(channels), int(length))
        cols = im2col(x, self.kernel_size, self.stride, 0)
        return cols.reshape(batch, cols.shape[1], channels, self.kernel_size)

    def _to_input(self, grad_windows):
        batch, out_length, channels, kernel_size = grad_windows.shape
        grad_cols = grad_windows.reshape(batch, out_length, channels * kernel_size)
        return _col2im_any_dtype(grad_cols, self._saved_geometry[1], self.kernel_size,
                                 self.stride, 0)

    def __repr__(self):
        return f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride})"


class MaxPool1d(_Pool1d):
    """Maximum over windows; the gradient goes to the first maximal element."""

    def forward(self, x, ctx):
        xp = array_module(x)
        windows = self._windows(x)
        winner = windows.argmax(axis=-1)                  # (batch, out_length, channels)
        self._saved_winner = winner
        y = xp.take_along_axis(windows, winner[..., None], axis=-1)[..., 0]
        return xp.ascontiguousarray(y.transpose(0, 2, 1))

    def backward(self, grad_out):
        xp = array_module(grad_out)
        winner = self._saved_winner
        one_hot = xp.arange(self.kernel_size) == winner[..., None]
        grad_windows = xp.where(one_hot, grad_out.transpose(0, 2, 1)[..., None],
                                xp.zeros((), dtype=grad_out.dtype))
        return self._to_input(grad_windows)


class AvgPool1d(_Pool1d):
    """Mean over windows."""

    def forward(self, x, ctx):
        xp = array_module(x)
        # bfloat16: the mean in float32, rounded once
        accumulate = np.float32 if is_bfloat16(x.dtype) else x.dtype
        y = self._windows(x).mean(axis=-1, dtype=accumulate).astype(x.dtype, copy=False)
        return xp.ascontiguousarray(y.transpose(0, 2, 1))

    def backward(self, grad_out):
        xp = array_module(grad_out)
        batch, channels, out_length = grad_out.shape
        share = grad_out.transpose(0, 2, 1)[..., None] / self.kernel_size
        grad_windows = xp.broadcast_to(share, (batch, out_length, channels, self.kernel_size))
        return self._to_input(xp.ascontiguousarray(grad_windows).astype(grad_out.dtype, copy=False))
