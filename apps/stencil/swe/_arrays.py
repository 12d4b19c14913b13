"""Array-library dispatch shared by the shallow-water modules (no CuPy import on CPU)."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_cupy(array: Any) -> bool:
    """True for a CuPy array (checked by module name, so CuPy need not be importable)."""
    return type(array).__module__.startswith("cupy")


def array_module(array: Any) -> Any:
    """``cupy`` for a CuPy array, else ``numpy`` (CuPy is imported only when needed)."""
    if is_cupy(array):
        import cupy

        return cupy
    return np
