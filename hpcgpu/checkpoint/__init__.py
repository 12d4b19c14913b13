"""HDF5 checkpoint/restart: atomic, verified, elastic, optionally asynchronous (``docs/checkpoint.md``).

>>> from hpcgpu.checkpoint import CheckpointManager, Preemption, EXIT_REQUEUE     # doctest: +SKIP
>>> ckpt = CheckpointManager(comm, "output/checkpoints", app="apps.stencil", keep=3)
>>> ckpt.save(step, fields={"h": h, "u": u}, replicated={"time": t, "config": vars(options)})
>>> state = ckpt.load("latest", fields={"h": h, "u": u})      # any rank count
>>> step, t = state.step, state.replicated["time"]
>>> pre = Preemption(comm, wall_time_limit=options.wall_time_limit)
>>> if pre.should_stop(step):                                  # one allreduce, same answer everywhere
...     ckpt.save(step, ...); ckpt.wait(); raise SystemExit(EXIT_REQUEUE)

Nothing is imported at package import time beyond this module's names (h5py loads on first use).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "CheckpointManager": "hpcgpu.checkpoint.manager",
    "CheckpointWarning": "hpcgpu.checkpoint.manager",
    "RestoredState": "hpcgpu.checkpoint.manager",
    "CheckpointInfo": "hpcgpu.checkpoint.reader",
    "read_master": "hpcgpu.checkpoint.reader",
    "Preemption": "hpcgpu.checkpoint.preemption",
    "EXIT_REQUEUE": "hpcgpu.checkpoint.preemption",
    "slurm_seconds_left": "hpcgpu.checkpoint.preemption",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'hpcgpu.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
