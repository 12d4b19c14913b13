"""Matrix products into existing buffers, optionally accumulating (cuBLAS ``gemmEx`` on GPU).

``gemm(a, b, out, accumulate=True)`` computes ``out += op(a) @ op(b)`` in ONE
cuBLAS call with ``beta = 1``: the weight gradient of a Linear layer goes straight
into its view of the flat gradient buffer, with no temporary product and no
separate addition pass (``grads += g.T @ x`` allocates a 64 MB float32 temporary
for a 4096 x 4096 layer and reads/writes the gradient once more).

Compute types (documented choice, same as CuPy's own matmul and PyTorch's
defaults): float16 operands -> ``CUBLAS_COMPUTE_32F`` (tensor cores, float32
accumulation, as ``torch.autocast``); float32 -> ``CUBLAS_COMPUTE_32F`` (plain
IEEE float32, no TF32 -- ``torch.backends.cuda.matmul.allow_tf32`` is False by
default and the benchmark keeps it so); float64 -> ``CUBLAS_COMPUTE_64F``.
bfloat16 (CPU: ``ml_dtypes.bfloat16`` arrays; GPU: ``uint16`` arrays of bit patterns,
as CuPy has no bfloat16) -> ``CUDA_R_16BF`` with ``CUBLAS_COMPUTE_32F`` (tensor cores,
float32 accumulation, one rounding of ``alpha op(a) op(b) + beta out`` to bfloat16);
the CPU computes the same in float32.

Row-major/column-major: cuBLAS is column-major, and a C-contiguous ``(r, c)``
array is the column-major ``(c, r)`` matrix, its transpose. So ``out = A B``
(row-major) is computed as ``out^T = B^T A^T`` (column-major), i.e. cuBLAS gets
``b`` first and ``a`` second, with no copies.
"""

import numpy as np

from .backend import check_float_array, is_bfloat16, is_cupy

_DTYPES = ("float16", "bfloat16", "uint16", "float32", "float64")

#: cudaDataType_t of bfloat16 (library_types.h), for CuPy versions that do not export it.
_CUDA_R_16BF = 14


def gemm(a, b, out, *, transpose_a=False, transpose_b=False, accumulate=False):
    """``out = op(a) @ op(b)``, or ``out += op(a) @ op(b)`` with ``accumulate``; returns None.

    Parameters
    ----------
    a, b : ndarray, 2-D
        Same backend and dtype (float16, bfloat16 -- ``uint16`` bit patterns on the GPU --,
        float32 or float64) as ``out``.
        ``op(a) = a.T`` when ``transpose_a`` (likewise for ``b``).
    out : ndarray, shape ``(op(a).shape[0], op(b).shape[1])``
        C-contiguous (e.g. a view of a flat gradient buffer); written in place.
    """
    for name, array in (("a", a), ("b", b), ("out", out)):
        check_float_array(array, f"gemm: {name}", ndim=2)
        if array.dtype != out.dtype or array.dtype.name not in _DTYPES:
            raise TypeError(
                f"gemm: a, b and out must share one of the dtypes {_DTYPES}; found "
                f"{a.dtype}, {b.dtype}, {out.dtype} -- cast the operands first"
            )
        if is_cupy(array) != is_cupy(out):
            raise TypeError(f"gemm: {name} is on a different backend than out")
        if array.dtype.name == "uint16" and not is_cupy(array):
            raise TypeError("gemm: uint16 (bfloat16 bit patterns) is the GPU's bfloat16; on the CPU "
                            "use ml_dtypes.bfloat16 arrays")
    rows, inner_a = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    inner_b, columns = (b.shape[1], b.shape[0]) if transpose_b else b.shape
    if inner_a != inner_b or out.shape != (rows, columns):
        raise ValueError(
            f"gemm: op(a) is {rows}x{inner_a}, op(b) is {inner_b}x{columns}, out is "
            f"{tuple(out.shape)}; expected matching inner sizes and out ({rows}, {columns})"
        )
    if not out.flags.c_contiguous:
        raise ValueError("gemm: out must be C-contiguous (a flat-buffer view or a new array)")
    if is_cupy(out):
        _gemm_cupy(a, b, out, transpose_a, transpose_b, accumulate)
        return None
    op_a = a.T if transpose_a else a
    op_b = b.T if transpose_b else b
    if is_bfloat16(out.dtype):
        # float32 products and sum, one rounding to bfloat16 (cuBLAS 16BF data, 32F compute)
        product = op_a.astype(np.float32) @ op_b.astype(np.float32)
        if accumulate:
            product += out.astype(np.float32)
        out[...] = product
        return None
    if accumulate:
        out += op_a @ op_b
    else:
        np.matmul(op_a, op_b, out=out)
    return None


# ----------------------------------------------------------------- GPU (CuPy) --

# alpha / beta live on the host (cuBLAS pointer mode HOST); float32 for the 32F compute
# type (float16 and float32 data), float64 for 64F.
_SCALARS = {
    "float32": (np.zeros((), np.float32), np.ones((), np.float32)),
    "float64": (np.zeros((), np.float64), np.ones((), np.float64)),
}


def _gemm_cupy(a, b, out, transpose_a, transpose_b, accumulate):
    import cupy
    from cupy.cuda import device
    from cupy_backends.cuda.api import runtime
    from cupy_backends.cuda.libs import cublas

    a = cupy.ascontiguousarray(a)
    b = cupy.ascontiguousarray(b)
    n_rows, n_columns = out.shape
    inner = a.shape[0] if transpose_a else a.shape[1]
    if n_rows == 0 or n_columns == 0:
        return
    if inner == 0:
        if not accumulate:
            out.fill(0)
        return
    dtype = out.dtype.name
    data_type = {"float16": runtime.CUDA_R_16F, "uint16": getattr(runtime, "CUDA_R_16BF", _CUDA_R_16BF),
                 "float32": runtime.CUDA_R_32F, "float64": runtime.CUDA_R_64F}[dtype]
    if dtype == "float64":
        compute_type, scalars = cublas.CUBLAS_COMPUTE_64F, _SCALARS["float64"]
    else:
        compute_type, scalars = cublas.CUBLAS_COMPUTE_32F, _SCALARS["float32"]
    # float16/bfloat16: let cuBLAS pick tensor-core kernels (what CuPy's matmul does); float32 stays IEEE
    algorithm = (cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP if dtype in ("float16", "uint16")
                 else cublas.CUBLAS_GEMM_DEFAULT)
    alpha, beta = scalars[1], scalars[1 if accumulate else 0]
    handle = device.get_cublas_handle()
    # CuPy shares this handle; make sure it runs on the current stream and reads host scalars
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    if cublas.getPointerMode(handle) != cublas.CUBLAS_POINTER_MODE_HOST:
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    op_a = cublas.CUBLAS_OP_T if transpose_a else cublas.CUBLAS_OP_N
    op_b = cublas.CUBLAS_OP_T if transpose_b else cublas.CUBLAS_OP_N
    # column-major out^T (n_columns x n_rows) = op(b)^T (n_columns x inner) @ op(a)^T
    cublas.gemmEx(
        handle, op_b, op_a, n_columns, n_rows, inner,
        alpha.ctypes.data, b.data.ptr, data_type, b.shape[1],
        a.data.ptr, data_type, a.shape[1],
        beta.ctypes.data, out.data.ptr, data_type, n_columns,
        compute_type, algorithm)
