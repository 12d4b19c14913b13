"""The slab driver's plan: which decompositions it runs, the device words and sizes its kernels share.

:func:`slab_axis` and :func:`slab_problems` decide whether :mod:`apps.md.resident_slab` can run a state
(the same verdict on every rank); the ``W_*`` indices name the words of the control array ``words`` (the
``#define``s of :mod:`apps.md.resident_slab_kernels`), ``F_*`` the peer exchange's flags; :func:`slab_kernel`
loads a kernel of that module.
"""

from __future__ import annotations

import math

import numpy as np

from hpcgpu.transport import collectives

from . import resident_slab_kernels
from ._arrays import raw_kernel

#: Device words (``words`` array; the kernels' #defines): see resident_slab_kernels.
W_BUILDS, W_NEIGHBORS_NEEDED, W_CELL_NEEDED, W_OWNED_NEEDED, W_GHOSTS_NEEDED, W_MIGRANTS_NEEDED, W_LOST, \
    W_PEER_TIMEOUT = range(8)
W_OWNED, W_STAY, W_SEND, W_LEAVE, W_LEAVE_ALL, W_RECEIVED = 8, 9, 10, 12, 14, 16
N_WORDS = 20
#: Doubles per migrant record (x y z vx vy vz m ix iy iz id type).
MIGRANT_WORDS = 12
#: Threads per block of the compaction kernels (their TILE) and the most blocks they use.
TILE, MAX_BLOCKS = 256, 1024
#: Peer exchange: a wait kernel gives up after this many seconds without its neighbours' signal.
PEER_TIMEOUT_SECONDS = 60.0
#: Peer exchange flags and sequence numbers (uint64 words): migrants from low / high, ghosts from low / high;
#: sequences: migrants sent / expected, ghosts sent / expected.
F_MIGRANTS, F_GHOSTS = 0, 2


def slab_axis(domain) -> int | None:
    """The axis the ranks divide (dims ``P`` there and 1 on the others), or None if not slabs."""
    divided = [axis for axis, d in enumerate(domain.dims) if d > 1]
    return divided[0] if len(divided) == 1 else None


def slab_problems(state, config) -> list:
    """Why the slab driver cannot run ``state`` on several ranks (an empty list: it can). Same on every rank.

    Collective on a GPU (the job's device collectives are built on first use)."""
    domain = state.domain
    problems = []
    axis = slab_axis(domain)
    if axis is None:
        problems.append(f"several ranks need a slab decomposition (ranks on one axis only, e.g. --dims "
                        f"{domain.comm.size},1,1); this one is {'x'.join(map(str, domain.dims))}")
    if state.is_gpu:
        movers = collectives(domain.comm, on_device=True)
        if not movers.capturable:   # its steps are CUDA graphs that hold the exchanges and the flag's allreduce
            problems.append(f"several GPUs need the nccl transport (this job's is {movers.name})")
    width = config.ghost_width
    for other in range(3):
        if other == axis:
            continue
        if math.floor(state.box[other] / width) < 3:
            problems.append(f"the box must span at least 3 cells of cutoff + skin = {width:g} sigma on the undivided "
                            f"axes (minimum image); axis {'xyz'[other]} is {state.box[other]:g} sigma")
    if axis is not None and state.box[axis] / domain.dims[axis] < width:
        problems.append(f"each slab must be at least cutoff + skin = {width:g} sigma thick; it is "
                        f"{state.box[axis] / domain.dims[axis]:g}")
    return problems


def slab_kernel(name, dtype=None):
    """The slab driver's kernel ``name`` (templated on the real type of ``dtype`` when given), loaded once."""
    source, names = resident_slab_kernels._CUDA_SOURCE, resident_slab_kernels._NAMES
    if dtype is None:
        return raw_kernel(source, names, name)
    real = "float" if np.dtype(dtype) == np.float32 else "double"
    return raw_kernel(source, names, f"{name}<{real}>")


def real_name(dtype) -> str:
    """The CUDA type of a float32/float64 dtype: ``"float"`` or ``"double"``."""
    return "float" if np.dtype(dtype) == np.float32 else "double"
