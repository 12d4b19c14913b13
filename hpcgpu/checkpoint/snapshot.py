"""A rank's share of one checkpoint, copied to host memory.

Taking the snapshot is the only part of a save that must happen while the state is still the
state of ``step``: once it is taken, stepping may continue and the files are written from the
copies. On a GPU the owned cells of each field (no ghost cells) are first copied into a private
device buffer on the compute stream (fast: device memory bandwidth), then into *pinned* host
buffers by an asynchronous copy on a side stream, so the compute stream goes on with the next
kernels at once; the writer waits on a CUDA event before touching the buffers. Host buffers
(pinned on a GPU) are kept between saves (allocating page-locked memory is slow, and fresh memory
costs page faults).
"""

from __future__ import annotations

from dataclasses import dataclass, field as dataclass_field

import numpy as np

from hpcgpu.arch import is_device_array
from hpcgpu.errors import CheckpointError


@dataclass
class FieldBlock:
    """The owned block of one field on this rank."""

    data: np.ndarray          # shape local_shape, host memory
    start: tuple              # global index of data[0, 0, ...]
    global_shape: tuple
    dims: tuple
    periodic: tuple
    attributes: dict = dataclass_field(default_factory=dict)   # units, grid location (Field.attributes)


@dataclass
class Snapshot:
    step: int
    fields: dict              # name -> FieldBlock
    particles: dict           # name -> numpy array, shape (n_local, ...)
    replicated: dict
    metadata: dict
    units: dict = dataclass_field(default_factory=dict)   # {"particles": {name: unit}, "replicated": {key: unit}}
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
    """Host buffers reused between saves, one per (name, shape, dtype), and the copy stream.

    Device arrays go to page-locked (pinned) buffers: ``cudaHostAlloc`` is slow, and only pinned
    memory lets a device-to-host copy run asynchronously. Host arrays (CPU runs) go to ordinary
    buffers, reused because first-touching fresh memory costs page faults (a 1 GiB copy into new
    memory takes ~20x longer than into a reused buffer). Reuse is safe because a save waits for the
    previous write before it takes the next snapshot.
    """

    def __init__(self):
        self._buffers = {}
        self._copy_stream = None

    def get(self, key, shape, dtype, pinned: bool = True) -> np.ndarray:
        key = (key, tuple(shape), np.dtype(dtype).str, pinned)
        if key not in self._buffers:
            if pinned:
                import cupyx

                self._buffers[key] = cupyx.empty_pinned(tuple(shape), dtype=dtype)
            else:
                self._buffers[key] = np.empty(tuple(shape), dtype=dtype)
        return self._buffers[key]

    def copy_stream(self):
        """A non-blocking side stream for the device-to-host copies (created on first use)."""
        if self._copy_stream is None:
            import cupy

            self._copy_stream = cupy.cuda.Stream(non_blocking=True)
        return self._copy_stream


def _to_host(array, name, copy: bool, pool: PinnedPool | None, stream, keep_alive: list, pending: list) -> np.ndarray:
    """Host copy of ``array`` (NumPy or CuPy). ``copy=False`` may return a view of a NumPy array.

    Device arrays with a ``pool``: a private device copy is made on the compute ``stream`` (so the
    next steps may overwrite the state at once), and ``(device copy, pinned buffer)`` is appended to
    ``pending``; :func:`take_snapshot` copies them to the host on the side stream.
    """
    if not is_device_array(array):
        if not copy:
            # Synchronous saves write straight from the (possibly strided) interior view.
            return np.asarray(array)
        if pool is None:
            return np.array(array, copy=True, order="C")
        out = pool.get(name, array.shape, array.dtype, pinned=False)
        np.copyto(out, array)
        return out
    import cupy

    if pool is None:
        return cupy.asnumpy(cupy.ascontiguousarray(array), stream=stream)
    # ascontiguousarray packs a strided interior into a new array; a contiguous one must still be
    # copied, because the side stream reads it while the compute stream moves on.
    with stream or cupy.cuda.get_current_stream():  # ordered after the kernels that made the state
        private = cupy.ascontiguousarray(array)
        if private is array or private.data.ptr == array.data.ptr:
            private = array.copy()
    out = pool.get(name, private.shape, private.dtype)
    pending.append((private, out))
    keep_alive.append(private)  # the device buffer must live until the copy has run
    return out


def check_units(units: dict | None, particles: dict, replicated: dict) -> dict:
    """``units`` checked against what is saved: every named particle array and top-level replicated
    key must exist, and every unit is a string (a UDUNITS-style text such as ``"m s-1"``).

    Raises
    ------
    CheckpointError
        For an unknown part, an unknown name or a unit that is not a string.
    """
    checked = {}
    for part, names in (units or {}).items():
        known = {"particles": particles, "replicated": replicated}.get(part)
        if known is None:
            raise CheckpointError(f"units[{part!r}]: expected 'particles' or 'replicated'")
        for name, unit in names.items():
            if name not in known or not isinstance(unit, str):
                raise CheckpointError(f"units[{part!r}][{name!r}] = {unit!r}: expected a unit string for one of "
                                      f"the saved {part} {sorted(known)}")
        checked[part] = dict(names)
    return checked


def take_snapshot(step: int, fields: dict, particles: dict | None, replicated: dict, metadata: dict,
                  copy: bool, pool: PinnedPool | None = None, units: dict | None = None) -> Snapshot:
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
    units : dict, optional
        ``{"particles": {name: unit}, "replicated": {key: unit}}``: written as ``units`` attributes.
    """
    stream, keep_alive, pending, blocks, host_particles = None, [], [], {}, {}
    for name, field in fields.items():
        grid = field.decomposition
        if field.arch.is_gpu:
            stream = field.arch.compute_stream
        blocks[name] = FieldBlock(
            data=_to_host(field.interior, f"fields/{name}", copy, pool, stream, keep_alive, pending),
            start=tuple(int(s) for s in grid.local_start), global_shape=tuple(grid.global_shape),
            dims=tuple(grid.dims), periodic=tuple(bool(p) for p in grid.periodic),
            attributes=dict(getattr(field, "attributes", None) or {}))
    counts = set()
    for name, array in (particles or {}).items():
        host = _to_host(array, f"particles/{name}", copy, pool, stream, keep_alive, pending)
        if host.ndim == 0:
            raise CheckpointError(f"particles[{name!r}] must have one row per particle, got a 0-d array")
        counts.add(host.shape[0])
        host_particles[name] = host
    if len(counts) > 1:
        shapes = {name: a.shape for name, a in host_particles.items()}
        raise CheckpointError(f"particle arrays must all have one row per local particle; got shapes {shapes}")
    snapshot = Snapshot(step=int(step), fields=blocks, particles=host_particles,
                        replicated=_host_tree(replicated or {}, copy), metadata=dict(metadata or {}),
                        units=check_units(units, host_particles, replicated or {}))
    if pending:
        snapshot.ready_event = _copy_on_side_stream(pending, pool.copy_stream(), stream)
        snapshot.keep_alive = keep_alive
    return snapshot


def _copy_on_side_stream(pending: list, side, compute):
    """Queue the device-to-host copies of ``pending`` on the ``side`` stream, after the private device
    copies made on ``compute``; return the event the writer waits on.

    The compute stream never waits for these copies, so the next steps' kernels overlap them.
    """
    import cupy

    compute = compute or cupy.cuda.get_current_stream()
    produced = cupy.cuda.Event(disable_timing=True)
    produced.record(compute)
    side.wait_event(produced)
    for private, out in pending:
        try:
            cupy.asnumpy(private, stream=side, out=out, blocking=False)
        except TypeError:  # CuPy < 13 has no ``blocking``: a synchronous copy into the pinned buffer
            cupy.asnumpy(private, stream=side, out=out)
    ready = cupy.cuda.Event(disable_timing=True)
    ready.record(side)
    return ready


def _host_tree(values, copy: bool):
    """Replicated values with device arrays moved to the host; with ``copy``, NumPy arrays copied too
    (an asynchronous save must not see later in-place updates of the optimizer state)."""
    if isinstance(values, dict):
        return {key: _host_tree(value, copy) for key, value in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_host_tree(value, copy) for value in values)
    if is_device_array(values):
        return values.get()
    if isinstance(values, np.ndarray) and copy:
        return values.copy()
    return values
