"""A rank's share of one checkpoint, copied to host memory.

Taking the snapshot is the only part of a save that must happen while the state is still the
state of ``step``: once it is taken, stepping may continue and the files are written from the
copies. On a GPU the owned cells of each field (no ghost cells) are copied into *pinned* host
buffers with an asynchronous copy on the compute stream, so the copy itself overlaps the next
kernels; the writer waits on a CUDA event before touching the buffers. Pinned buffers are kept
between saves (allocating page-locked memory is slow).
"""

from __future__ import annotations

from dataclasses import dataclass, field as dataclass_field

import numpy as np

from hpcgpu.errors import CheckpointError


def _is_cupy(array) -> bool:
    return type(array).__module__.startswith("cupy")


@dataclass
class FieldBlock:
    """The owned block of one field on this rank."""

    data: np.ndarray          # shape local_shape, host memory
    start: tuple              # global index of data[0, 0, ...]
    global_shape: tuple
    dims: tuple
    periodic: tuple


@dataclass
class Snapshot:
    step: int
    fields: dict              # name -> FieldBlock
    particles: dict           # name -> numpy array, shape (n_local, ...)
    replicated: dict
    metadata: dict
    ready_event: object = None                     # cupy Event the writer waits on (GPU, asynchronous)
    keep_alive: list = dataclass_field(default_factory=list)  # device temporaries of pending copies

    def wait_ready(self) -> None:
        """Block until the device-to-host copies have landed (no-op on the CPU)."""
        if self.ready_event is not None:
            self.ready_event.synchronize()
            self.ready_event = None
            self.keep_alive.clear()

    @property
    def n_bytes(self) -> int:
        return sum(b.data.nbytes for b in self.fields.values()) + sum(a.nbytes for a in self.particles.values())


class PinnedPool:
    """Page-locked host buffers reused between saves, one per (name, shape, dtype)."""

    def __init__(self):
        self._buffers = {}

    def get(self, key, shape, dtype) -> np.ndarray:
        import cupyx

        key = (key, tuple(shape), np.dtype(dtype).str)
        if key not in self._buffers:
            self._buffers[key] = cupyx.empty_pinned(tuple(shape), dtype=dtype)
        return self._buffers[key]


def _to_host(array, name, copy: bool, pool: PinnedPool | None, stream, keep_alive: list) -> np.ndarray:
    """Host copy of ``array`` (NumPy or CuPy). ``copy=False`` may return a view of a NumPy array."""
    if not _is_cupy(array):
        # Synchronous saves write straight from the (possibly strided) interior view, tile by tile.
        return np.array(array, copy=True, order="C") if copy else np.asarray(array)
    import cupy

    contiguous = cupy.ascontiguousarray(array)  # a strided interior view is packed on the device first
    if pool is None:
        return cupy.asnumpy(contiguous, stream=stream)
    out = pool.get(name, contiguous.shape, contiguous.dtype)
    try:
        cupy.asnumpy(contiguous, stream=stream, out=out, blocking=False)
        keep_alive.append(contiguous)  # the device buffer must live until the copy has run
    except TypeError:  # CuPy < 13 has no ``blocking``: a synchronous copy into the pinned buffer
        cupy.asnumpy(contiguous, stream=stream, out=out)
    return out


def take_snapshot(step: int, fields: dict, particles: dict | None, replicated: dict, metadata: dict,
                  copy: bool, pool: PinnedPool | None = None) -> Snapshot:
    """Copy this rank's share of the state to host memory.

    Parameters
    ----------
    fields : dict of name -> hpcgpu.Field
        Only the owned cells (``field.interior``) are copied.
    particles : dict of name -> array of shape (n_local, ...), or None
        Every array must have the same first extent (this rank's particle count).
    copy : bool
        True when the caller keeps stepping while the snapshot is written (asynchronous saves): host
        arrays are copied, device arrays go to pinned buffers from ``pool``.
    """
    stream, keep_alive, blocks, host_particles = None, [], {}, {}
    for name, field in fields.items():
        grid = field.decomposition
        if field.arch.is_gpu:
            stream = field.arch.compute_stream
        blocks[name] = FieldBlock(
            data=_to_host(field.interior, f"fields/{name}", copy, pool if field.arch.is_gpu else None, stream, keep_alive),
            start=tuple(int(s) for s in grid.local_start), global_shape=tuple(grid.global_shape),
            dims=tuple(grid.dims), periodic=tuple(bool(p) for p in grid.periodic))
    counts = set()
    for name, array in (particles or {}).items():
        gpu_pool = pool if _is_cupy(array) else None
        host = _to_host(array, f"particles/{name}", copy, gpu_pool, stream, keep_alive)
        if host.ndim == 0:
            raise CheckpointError(f"particles[{name!r}] must have one row per particle, got a 0-d array")
        counts.add(host.shape[0])
        host_particles[name] = host
    if len(counts) > 1:
        shapes = {name: a.shape for name, a in host_particles.items()}
        raise CheckpointError(f"particle arrays must all have one row per local particle; got shapes {shapes}")
    snapshot = Snapshot(step=int(step), fields=blocks, particles=host_particles,
                        replicated=_host_tree(replicated or {}, copy), metadata=dict(metadata or {}))
    if keep_alive:
        import cupy

        snapshot.ready_event = cupy.cuda.Event(disable_timing=True)
        snapshot.ready_event.record(stream or cupy.cuda.get_current_stream())
        snapshot.keep_alive = keep_alive
    return snapshot


def _host_tree(values, copy: bool):
    """Replicated values with device arrays moved to the host; with ``copy``, NumPy arrays copied too
    (an asynchronous save must not see later in-place updates of the optimizer state)."""
    if isinstance(values, dict):
        return {key: _host_tree(value, copy) for key, value in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_host_tree(value, copy) for value in values)
    if _is_cupy(values):
        return values.get()
    if isinstance(values, np.ndarray) and copy:
        return values.copy()
    return values
