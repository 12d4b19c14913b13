"""JSON files of a run (``environment.json``, the ``--summary``): plain values, written on rank 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hpcgpu.output.atomic import write_atomic


def plain(value):
    """JSON-safe: NumPy scalars to Python, NaN/Inf to strings (recursively through dicts and lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_json(path, record: dict) -> None:
    """Write ``record`` as indented JSON (call on rank 0 only); creates the parent directory.

    The file is replaced atomically (:func:`hpcgpu.output.atomic.write_atomic`); a failed write raises
    :class:`hpcgpu.errors.OutputError`.
    """
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(plain(record), indent=2) + "\n")
