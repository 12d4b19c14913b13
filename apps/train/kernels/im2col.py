"""im2col / col2im for 1-D convolution and pooling.

A 1-D convolution over ``x`` of shape ``(batch, channels, length)`` with
``kernel_size`` K, ``stride`` S and zero ``padding`` P becomes one matrix multiply
once every receptive field is copied into a row ("im2col")::

    out_length = (length + 2 P - K) // S + 1
    cols[b, o, c * K + j] = x[b, c, o * S - P + j]     (0 outside [0, length))

``col2im`` is the adjoint: it sums every column entry back to the input position it
came from. It is written as a *gather* over input positions (each output element
loops over the <= K columns that touch it) so it needs no atomics and is
deterministic on both backends.

Public functions validate and dispatch: CuPy ElementwiseKernel on GPU, Numba
``njit(parallel=True)`` on CPU. ``im2col`` is a pure copy, so it runs on the bit
pattern (viewed as a same-size integer type) and works for every float dtype,
float16 included; ``col2im`` adds, and supports float32/float64 (the layers upcast
float16 to float32 around it).
"""

import functools

import numba
import numpy as np

from .backend import check_float_array, cpu_threads_for, is_cupy


def conv_output_length(length, kernel_size, stride, padding):
    """Number of output positions of a 1-D convolution/pooling window."""
    return (length + 2 * padding - kernel_size) // stride + 1


def _check_geometry(length, kernel_size, stride, padding):
    if kernel_size < 1 or stride < 1 or padding < 0:
        raise ValueError(
            f"im2col: expected kernel_size >= 1, stride >= 1, padding >= 0, found "
            f"kernel_size={kernel_size}, stride={stride}, padding={padding}"
        )
    out_length = conv_output_length(length, kernel_size, stride, padding)
    if out_length < 1:
        raise ValueError(
            f"im2col: input length {length} is shorter than the kernel ({kernel_size}) "
            f"plus padding ({padding} per side); use a smaller kernel or more padding"
        )
    return out_length


_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def im2col(x, kernel_size, stride=1, padding=0):
    """Copy the receptive fields of a 1-D convolution into rows.

    Parameters
    ----------
    x : ndarray, shape (batch, channels, length)
        Floating-point input (NumPy or CuPy).
    kernel_size, stride, padding : int
        Window geometry; padding adds zeros on both sides.

    Returns
    -------
    ndarray, shape (batch, out_length, channels * kernel_size)
        Same dtype and backend as ``x``.
    """
    check_float_array(x, "im2col input", ndim=3)
    batch, channels, length = (int(s) for s in x.shape)
    out_length = _check_geometry(length, kernel_size, stride, padding)
    int_type = _SAME_SIZE_INT[x.dtype.itemsize]
    if is_cupy(x):
        import cupy

        source = cupy.ascontiguousarray(x).view(int_type)
        cols = cupy.zeros((batch, out_length, channels * kernel_size), dtype=int_type)
        _cupy_im2col_kernel()(
            source, channels, length, out_length, kernel_size, stride, padding, cols,
            size=cols.size,
        )
        return cols.view(x.dtype)
    source = np.ascontiguousarray(x).view(int_type)
    cols = np.empty((batch, out_length, channels * kernel_size), dtype=int_type)
    with cpu_threads_for(cols.size):
        _im2col_cpu(source, cols, kernel_size, stride, padding)
    return cols.view(x.dtype)


def col2im(cols, length, kernel_size, stride=1, padding=0):
    """Adjoint of :func:`im2col`: scatter-add columns back onto the input grid.

    Parameters
    ----------
    cols : ndarray, shape (batch, out_length, channels * kernel_size)
        float32 or float64 (NumPy or CuPy).
    length : int
        Length of the original input.
    kernel_size, stride, padding : int
        Same geometry as the forward :func:`im2col`.

    Returns
    -------
    ndarray, shape (batch, channels, length)
    """
    check_float_array(cols, "col2im input", ndim=3)
    if cols.dtype not in (np.float32, np.float64):
        raise TypeError(
            f"col2im: expected float32 or float64 columns, found {cols.dtype}; "
            "upcast float16 to float32 before calling"
        )
    batch, out_length, width = (int(s) for s in cols.shape)
    if width % kernel_size:
        raise ValueError(
            f"col2im: column width {width} is not a multiple of kernel_size {kernel_size}"
        )
    channels = width // kernel_size
    expected = _check_geometry(length, kernel_size, stride, padding)
    if expected != out_length:
        raise ValueError(
            f"col2im: geometry gives {expected} output positions for length {length}, "
            f"but the columns have {out_length}; pass the same geometry as im2col"
        )
    if is_cupy(cols):
        import cupy

        cols = cupy.ascontiguousarray(cols)
        out = cupy.empty((batch, channels, length), dtype=cols.dtype)
        _cupy_col2im_kernel()(
            cols, channels, length, out_length, kernel_size, stride, padding, out,
            size=out.size,
        )
        return out
    out = np.empty((batch, channels, length), dtype=cols.dtype)
    with cpu_threads_for(cols.size):
        _col2im_cpu(np.ascontiguousarray(cols), out, kernel_size, stride, padding)
    return out


# ---------------------------------------------------------------- CPU (Numba) --

@numba.njit(parallel=True, cache=True)
def _im2col_cpu(x, cols, kernel_size, stride, padding):
    batch, channels, length = x.shape
    out_length = cols.shape[1]
    for row in numba.prange(batch * out_length):
        b = row // out_length
        o = row % out_length
        start = o * stride - padding
        for c in range(channels):
            for j in range(kernel_size):
                position = start + j
                if 0 <= position < length:
                    cols[b, o, c * kernel_size + j] = x[b, c, position]
                else:
                    cols[b, o, c * kernel_size + j] = 0


@numba.njit(parallel=True, cache=True)
def _col2im_cpu(cols, out, kernel_size, stride, padding):
    batch, channels, length = out.shape
    out_length = cols.shape[1]
    for row in numba.prange(batch * channels):
        b = row // channels
        c = row % channels
        for position in range(length):
            total = 0.0
            for j in range(kernel_size):
                shifted = position + padding - j
                if shifted >= 0 and shifted % stride == 0:
                    o = shifted // stride
                    if o < out_length:
                        total += cols[b, o, c * kernel_size + j]
            out[b, c, position] = total


# ----------------------------------------------------------------- GPU (CuPy) --

_IM2COL_BODY = r"""
    // i indexes cols laid out as (batch, out_length, channels, kernel_size)
    const long long j = i % kernel_size;
    long long rest = i / kernel_size;
    const long long c = rest % channels;
    rest /= channels;
    const long long o = rest % out_length;
    const long long b = rest / out_length;
    const long long position = o * stride - padding + j;
    if (position >= 0 && position < length) {
        cols[i] = x[(b * channels + c) * length + position];
    }
"""

_COL2IM_BODY = r"""
    // i indexes out laid out as (batch, channels, length); gather, no atomics
    const long long position = i % length;
    long long rest = i / length;
    const long long c = rest % channels;
    const long long b = rest / channels;
    double total = 0.0;
    for (long long j = 0; j < kernel_size; ++j) {
        const long long shifted = position + padding - j;
        if (shifted >= 0 && shifted % stride == 0) {
            const long long o = shifted / stride;
            if (o < out_length) {
                total += (double)cols[((b * out_length + o) * channels + c) * kernel_size + j];
            }
        }
    }
    out[i] = (T)total;
"""

_GEOMETRY_PARAMS = (
    "int64 channels, int64 length, int64 out_length, int64 kernel_size, "
    "int64 stride, int64 padding"
)


@functools.lru_cache(maxsize=None)
def _cupy_im2col_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "raw T x, " + _GEOMETRY_PARAMS, "raw T cols", _IM2COL_BODY,
        "hpcgpu_train_im2col",
    )


@functools.lru_cache(maxsize=None)
def _cupy_col2im_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "raw T cols, " + _GEOMETRY_PARAMS, "raw T out", _COL2IM_BODY,
        "hpcgpu_train_col2im",
    )
