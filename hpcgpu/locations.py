"""Where in the user's own files something was written: ``gray_scott.py:27``.

Errors about a model name the user's file and line, not hpcgpu's: the line of the user's code that
called into hpcgpu (:func:`caller_site`: the innermost frame of the call stack outside the ``hpcgpu``
package), the line that declared an option, or the ``def`` line of a stencil
(:attr:`StencilDefinition.site <hpcgpu.stencils.definition.StencilDefinition>`). Paths are shown relative to the working directory when they lie below it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The hpcgpu package directory: frames inside it are the framework's, not the user's.
PACKAGE_DIRECTORY = str(Path(__file__).resolve().parent) + os.sep


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else as given."""
    try:
        relative = os.path.relpath(path)
    except ValueError:   # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


def site(path: str, line: int) -> str:
    """``"file.py:12"``."""
    return f"{shown_path(path)}:{line}"


def is_framework_file(path: str) -> bool:
    """True for a file of the hpcgpu package (and of Python itself: ``<frozen ...>``, ``<string>``)."""
    return path.startswith("<") or os.path.abspath(path).startswith(PACKAGE_DIRECTORY)


def caller_site(skip: int = 1) -> str | None:
    """``"file.py:LINE"`` of the innermost frame outside hpcgpu on the current call stack, or None.

    ``skip`` frames (this function's caller by default) are passed over before looking.
    """
    frame = sys._getframe(skip)
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_framework_file(path):
            return site(path, frame.f_lineno)
        frame = frame.f_back
    return None
