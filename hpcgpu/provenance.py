"""Where a result came from: the hpcgpu version and the git commit of the checkout in use.

Recorded in summaries, environment files and checkpoints. A module of its own so that the checkpoint
layer and the app layer both read it without importing each other.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from hpcgpu import __version__


@functools.cache
def git_commit() -> str | None:
    """The commit of the hpcgpu checkout in use (``$HPCGPU_GIT_COMMIT`` if set; None outside git); read
    once per process."""
    if os.environ.get("HPCGPU_GIT_COMMIT"):
        # Set by job scripts that run a copy of the tree without .git (e.g. on a remote GPU machine).
        return os.environ["HPCGPU_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def provenance() -> dict:
    """``{"hpcgpu_version": ..., "git_commit": ...}`` of this process."""
    return {"hpcgpu_version": __version__, "git_commit": git_commit()}
