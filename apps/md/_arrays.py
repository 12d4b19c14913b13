"""Small helpers shared by the MD kernels: backend detection and input validation.

CuPy is never imported here: an array is recognised as a CuPy array by its type's module, so the CPU
path runs on machines without CuPy.
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.arch import array_module  # noqa: F401 - re-exported for the MD kernels
from hpcgpu.arch import is_device_array as _is_cupy  # the one "is this a CuPy array?" test
from hpcgpu.errors import ConfigurationError

#: Threads per block of every MD RawKernel (one thread per atom).
THREADS_PER_BLOCK = 128


def to_numpy(array) -> np.ndarray:
    """Return a NumPy copy (CuPy) or the array itself (NumPy)."""
    if _is_cupy(array):
        return array.get()
    return np.asarray(array)


def blocks_for(n_items: int) -> int:
    """Number of blocks of :data:`THREADS_PER_BLOCK` threads covering ``n_items`` (at least 1)."""
    return max(1, (int(n_items) + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)


def check_array(name: str, array, *, shape=None, dtypes=None, like=None) -> None:
    """Validate one kernel argument, raising :class:`ConfigurationError` with the fix.

    Parameters
    ----------
    name : str
        Argument name used in the message.
    array : numpy.ndarray or cupy.ndarray
        The array to check; it must be C-contiguous.
    shape : tuple, optional
        Expected shape; ``None`` entries match any extent.
    dtypes : sequence of numpy dtypes, optional
        Accepted dtypes.
    like : array, optional
        Another argument that must live on the same backend (NumPy vs CuPy).
    """
    if not (isinstance(array, np.ndarray) or _is_cupy(array)):
        raise ConfigurationError(
            f"{name}: expected a numpy or cupy array, found {type(array).__name__}; "
            "convert it with numpy.asarray or cupy.asarray"
        )
    if like is not None and _is_cupy(array) != _is_cupy(like):
        raise ConfigurationError(
            f"{name}: expected a {'cupy' if _is_cupy(like) else 'numpy'} array like the positions, "
            f"found a {'cupy' if _is_cupy(array) else 'numpy'} array; keep all state on one backend"
        )
    if shape is not None:
        if len(shape) != array.ndim or any(s is not None and s != a for s, a in zip(shape, array.shape)):
            expected = tuple("any" if s is None else s for s in shape)
            raise ConfigurationError(f"{name}: expected shape {expected}, found {tuple(array.shape)}")
    if dtypes is not None and np.dtype(array.dtype) not in [np.dtype(d) for d in dtypes]:
        raise ConfigurationError(
            f"{name}: expected dtype in {[np.dtype(d).name for d in dtypes]}, found {np.dtype(array.dtype).name}; "
            "convert with .astype(...)"
        )
    if not array.flags.c_contiguous:
        raise ConfigurationError(f"{name}: expected a C-contiguous array; pass numpy/cupy.ascontiguousarray({name})")


@functools.lru_cache(maxsize=None)
def raw_module(source: str, name_expressions: tuple):
    """Compile (once per process and device) a CuPy RawModule holding ``name_expressions``.

    Kernel sources are module-level constants; templated kernels are instantiated through
    ``name_expressions`` such as ``"md_forces<float>"`` instead of formatting CUDA source strings.
    """
    import cupy

    # Template instantiations go through NVRTC name expressions; non-template kernels are declared
    # extern "C" and found by their plain name.
    templates = tuple(name for name in name_expressions if "<" in name)
    return cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=templates or None)


@functools.lru_cache(maxsize=None)
def raw_kernel(source: str, name_expressions: tuple, name: str):
    """Return kernel ``name`` (one of ``name_expressions``) from :func:`raw_module`.

    Cached: a launch in the hot loop costs a dictionary look-up, not a module function query.
    """
    return raw_module(source, name_expressions).get_function(name)
