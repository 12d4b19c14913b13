"""Array-module dispatch shared by the training kernels and layers.

Everything in :mod:`apps.train` is written once against an ``xp`` module (NumPy on
CPU, CuPy on GPU). The helpers here find that module from an array *without*
importing CuPy, so the package imports and runs on machines that do not have it.
"""

import contextlib
import os

import numpy as np

from hpcgpu.arch import array_module  # noqa: F401 - re-exported for the training kernels
from hpcgpu.arch import is_device_array as is_cupy  # the one "is this a CuPy array?" test
from hpcgpu.errors import ConfigurationError

#: 16-bit floating-point storage dtypes whose arithmetic runs in float32 ("opmath").
HALF_DTYPE_NAMES = ("float16", "bfloat16")

#: Names of the bfloat16 dtypes: ``ml_dtypes.bfloat16`` on the CPU; on the GPU (CuPy has no
#: bfloat16) ``uint16`` arrays of bit patterns -- the training code has no other uint16 arrays.
BFLOAT16_NAMES = ("bfloat16", "uint16")


def bfloat16_dtype():
    """NumPy's bfloat16 dtype (from ``ml_dtypes``: 8 exponent bits, 7 mantissa bits).

    Raises
    ------
    ConfigurationError
        When ``ml_dtypes`` is not installed.
    """
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ConfigurationError(
            f"bf16 needs the ml_dtypes package ({exc}); install it with `pip install ml_dtypes` "
            "(it is a dependency of hpcgpu: `pip install -e .` installs it)") from exc
    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype):
    """True for a bfloat16 dtype: ``ml_dtypes.bfloat16`` (tested by name: no import of ml_dtypes
    needed) or the ``uint16`` bit patterns that hold bfloat16 on the GPU."""
    return np.dtype(dtype).name in BFLOAT16_NAMES


def to_float32(array):
    """A float32 copy of a float array; bfloat16 (either form) is widened exactly."""
    if is_cupy(array) and array.dtype.name == "uint16":
        import cupy

        return (array.astype(cupy.uint32) << 16).view(cupy.float32)
    return array.astype(np.float32)


def is_half(dtype):
    """True for the 16-bit float storage dtypes (float16, bfloat16)."""
    return np.dtype(dtype).name in HALF_DTYPE_NAMES


def upcast_half(array):
    """``array`` as float32 when it is float16/bfloat16 (the arithmetic type), else itself."""
    return array.astype(np.float32) if is_half(array.dtype) else array


def to_numpy(array):
    """Copy ``array`` to a host NumPy array (no copy when it already is one)."""
    if is_cupy(array):
        return array.get()
    return np.asarray(array)


def check_float_array(array, name, ndim=None):
    """Validate that ``array`` is a floating-point NumPy/CuPy array (bfloat16 counts as one).

    Raises
    ------
    TypeError
        When ``array`` is not an ndarray or not floating point.
    ValueError
        When ``ndim`` is given and does not match.
    """
    if not hasattr(array, "dtype") or not hasattr(array, "shape"):
        raise TypeError(
            f"{name}: expected a NumPy or CuPy array, found {type(array).__name__}; "
            "convert it with xp.asarray first"
        )
    if array.dtype.kind != "f" and not is_bfloat16(array.dtype):
        raise TypeError(
            f"{name}: expected a floating-point array, found dtype {array.dtype}; "
            "cast it with .astype(float32) (or float64 for gradient checks)"
        )
    if ndim is not None and array.ndim != ndim:
        raise ValueError(
            f"{name}: expected {ndim} dimensions, found shape {tuple(array.shape)}"
        )


# Below this many elements a Numba kernel runs on one thread. Waking the worker
# pool costs ~10 us on a quiet HPC node but several milliseconds on some
# virtualised machines (measured: 4-12 ms on a shared 2-vCPU development box), which would dwarf a
# small optimiser update. Override with HPCGPU_NUMBA_PARALLEL_MIN_ELEMENTS.
_PARALLEL_MIN_ELEMENTS_DEFAULT = 1 << 22


def parallel_min_elements():
    """Work size (elements) from which CPU kernels use all Numba threads."""
    value = os.environ.get("HPCGPU_NUMBA_PARALLEL_MIN_ELEMENTS")
    return int(value) if value else _PARALLEL_MIN_ELEMENTS_DEFAULT


@contextlib.contextmanager
def cpu_threads_for(n_elements):
    """Run the enclosed Numba kernel on one thread when ``n_elements`` is small.

    Usage: ``with cpu_threads_for(array.size): _kernel_cpu(...)``.
    """
    if n_elements >= parallel_min_elements():
        yield
        return
    import numba

    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(saved)
