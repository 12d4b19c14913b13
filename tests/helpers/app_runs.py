"""Run an app (``python -m MODULE ...``) on CPU ranks under ``run_mpi`` and read its ``--summary``."""

import json
import os
import sys
from pathlib import Path

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]


def run_app_summary(n_ranks: int, module_args: list[str], out: Path, env: dict | None = None) -> tuple[dict, str]:
    """Run ``module_args`` on ``n_ranks`` ranks (one Numba thread each) writing to ``out``; ``env``: variables to
    set, a value of None removes the variable. Returns the summary and the job's output; a failed run fails
    the test with the tail of that output."""
    environment = dict(os.environ, NUMBA_NUM_THREADS="1")
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    summary = out / "summary.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", *module_args, "--output", str(out), "--summary", str(summary)],
                     timeout=240, env=environment, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    return json.loads(summary.read_text()), result.output
