"""The JSON summary every app writes with ``--summary`` (schema in docs/app-contract.md)."""

from __future__ import annotations

import hpcgpu
from hpcgpu.provenance import git_commit
from hpcgpu.app.jsonio import plain, write_json

__all__ = ["make_summary", "write_json"]


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
    return plain(record)
