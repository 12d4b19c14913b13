"""The JSON summary every app writes with ``--summary`` (schema in docs/app-contract.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import hpcgpu
from hpcgpu.app.environment import git_commit


def _plain(value):
    """JSON-safe: NumPy scalars to Python, NaN/Inf to strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def make_summary(*, app: str, backend: str, comm, decomposition, steps: int, wall_seconds: float,
                 throughput: float, unit: str, timers: dict, diagnostics: dict, checksum: str,
                 extra: dict | None = None) -> dict:
    """The app-contract summary record (keys documented in docs/app-contract.md)."""
    record = {
        "app": app,
        "version": hpcgpu.__version__,
        "git_commit": git_commit(),
        "backend": backend,
        "n_ranks": comm.size,
        "n_nodes": comm.n_nodes,
        "decomposition": decomposition,
        "steps": steps,
        "wall_seconds": wall_seconds,
        "throughput": throughput,
        "unit": unit,
        "timers": timers,
        "diagnostics": diagnostics,
        "checksum": checksum,
    }
    record.update(extra or {})
    return _plain(record)


def write_json(path, record: dict) -> None:
    """Write ``record`` as indented JSON (call on rank 0 only)."""
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(record), indent=2) + "\n")
