"""Compile generated stencil source: Numba for CPUs, NVRTC (CuPy ``RawModule``) for GPUs.

CPU kernels are written to a module file in a cache directory and imported from there, so that
Numba's own cache (``cache=True``) keeps the machine code between runs and between the ranks of a job:
a second run, or the second rank, loads the kernel instead of compiling it again. The directory is
``$HPCGPU_CACHE_DIR/stencil`` (default ``~/.cache/hpcgpu/stencil``); when it cannot be written the
module is executed from memory and compiled in every process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

_loaded: dict = {}


def cache_directory() -> Path:
    """Where generated CPU modules are kept (see the module docstring)."""
    root = os.environ.get("HPCGPU_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hpcgpu")
    return Path(root) / "stencil"


def cpu_function(source: str, function_name: str):
    """The function ``function_name`` of the generated module ``source`` (imported once per process)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    key = (digest, function_name)
    if key in _loaded:
        return _loaded[key]
    module = None
    path = _write_module(source, f"hpcgpu_stencil_{digest}")
    if path is not None:
        spec = importlib.util.spec_from_file_location(f"hpcgpu_stencil_{digest}", path)
        module = importlib.util.module_from_spec(spec)
        # Registered by name: Numba's cache finds the module again when it loads a cached kernel.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        function = getattr(module, function_name)
    else:
        namespace: dict = {}
        exec(compile(source.replace("cache=True", "cache=False"), f"<stencil {function_name}>", "exec"), namespace)
        function = namespace[function_name]
    _loaded[key] = function
    return function


def _write_module(source: str, name: str) -> Path | None:
    """The module file holding ``source`` (written atomically if missing); None where it cannot be."""
    directory = cache_directory()
    path = directory / f"{name}.py"
    try:
        if path.is_file() and path.read_text() == source:
            return path
        directory.mkdir(parents=True, exist_ok=True)
        # Several ranks may write the same module at once: each writes its own temporary file and
        # renames it into place (atomic), so an importer never sees half a file.
        handle, temporary = tempfile.mkstemp(prefix=f".{name}-", suffix=".py", dir=directory)
        with os.fdopen(handle, "w") as stream:
            stream.write(source)
        os.replace(temporary, path)
        return path
    except OSError:
        return None


def gpu_function(source: str, function_name: str, options):
    """The kernel ``function_name`` of CUDA ``source`` compiled by NVRTC with ``options`` (CuPy caches it)."""
    import cupy

    key = (source, function_name, tuple(options))
    if key not in _loaded:
        module = cupy.RawModule(code=source, options=tuple(options))
        _loaded[key] = module.get_function(function_name)
    return _loaded[key]
