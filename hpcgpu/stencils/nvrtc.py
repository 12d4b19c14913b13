"""Compile generated CUDA source with NVRTC on a machine without a GPU (no CUDA driver needed).

NVRTC is a plain library: compiling CUDA C to PTX needs no device. This module loads it with
:mod:`ctypes` from the ``nvidia-cuda-nvrtc-cu12`` (or ``-cu13``) wheel, or from the system, so that a
stencil's GPU kernel is compiled for the target architecture (``sm_90``: H100/H200) wherever the
tests run. :func:`compile_to_ptx` returns the PTX; an error carries NVRTC's log.
"""

from __future__ import annotations

import ctypes
import glob
import os

from hpcgpu.errors import BackendError

_library = None


def _candidates() -> list[str]:
    paths = []
    try:
        import nvidia

        for root in nvidia.__path__:
            paths += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*")))
            paths += sorted(glob.glob(os.path.join(root, "cu13", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    return [p for p in paths if "builtins" not in p and ".alt." not in p] + ["libnvrtc.so.13", "libnvrtc.so.12",
                                                                              "libnvrtc.so"]


def library():
    """The NVRTC library (ctypes); raises :class:`BackendError` where none can be loaded."""
    global _library
    if _library is None:
        errors = []
        for candidate in _candidates():
            try:
                _library = ctypes.CDLL(candidate)
                break
            except OSError as error:
                errors.append(str(error))
        else:
            raise BackendError("NVRTC was not found; expected libnvrtc from the nvidia-cuda-nvrtc-cu12 wheel "
                               "(pip install nvidia-cuda-nvrtc-cu12) or a CUDA toolkit")
    return _library


def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_to_ptx(source: str, options=(), architecture: str = "sm_90", name: str = "stencil.cu") -> str:
    """Compile CUDA C ``source`` for ``architecture`` with ``options``; returns the PTX text.

    Raises
    ------
    BackendError
        NVRTC is missing, or the compilation failed (the message holds NVRTC's log).
    """
    nvrtc = library()
    program = ctypes.c_void_p()
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        arguments = [f"--gpu-architecture={architecture.replace('sm_', 'compute_')}", *options]
        array = (ctypes.c_char_p * len(arguments))(*[a.encode() for a in arguments])
        result = nvrtc.nvrtcCompileProgram(program, len(arguments), array)
        if result != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise BackendError(f"NVRTC could not compile {name} for {architecture}:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _check(nvrtc, nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _check(nvrtc, nvrtc.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _check(nvrtc, result: int, what: str) -> None:
    if result != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise BackendError(f"{what} failed: {nvrtc.nvrtcGetErrorString(result).decode()}")
