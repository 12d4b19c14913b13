"""Exchange the ghost cells of one or several fields with all neighbours.

An exchange is planned once per set of fields (:class:`HaloExchange`) and then started and waited on
every time step::

    pending = hpcgpu.exchange_halos([h, u, v], wait=False)   # pack + send/recv in flight
    update_interior(...)                                       # needs no ghost cells
    pending.wait()                                             # ghosts are now valid
    update_rim(...)

All fields of one exchange travel in one message per neighbour. A message holding a single field
whose region is contiguous in memory (for example whole rows of a 2D field without x ghosts) is sent
straight from the field without packing. A rank that is its own neighbour (a periodic axis with one
block) copies locally; a rank with no other neighbour at all does its whole fill (local copies, then
the boundary conditions) as one gather composed at planning time (:mod:`hpcgpu.halo.ghost_map`),
one kernel on GPUs, without the transport (ordered between the streams as a transport would be).

Ghost cells beyond a non-periodic domain edge are the physical boundary: with ``boundary_conditions``
(one :class:`~hpcgpu.halo.boundaries.BoundaryConditions` per field, see :mod:`hpcgpu.halo.boundaries`)
``wait()`` fills them right after the neighbours' ghosts have arrived, so an edge block's corners are
mirrors of valid ghosts and the application calls nothing else::

    walls = free_slip_channel_walls()                  # (h, u, v) of a C grid, walls across y
    pending = hpcgpu.exchange_halos([h, u, v], wait=False, boundary_conditions=walls)
    update_interior(...)
    pending.wait()                                     # neighbours' ghosts, then the walls

On GPUs the boundary fills are elementwise kernels on the compute (current) stream after the
exchange's completion event: no host synchronisation, capturable in a CUDA graph. Without
``boundary_conditions`` (the default) ghosts beyond a non-periodic edge are left untouched.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field as dataclass_field

import numpy as np

from hpcgpu.errors import HaloError
from hpcgpu.halo.boundaries import BoundaryFill, normalise_conditions
from hpcgpu.halo.ghost_map import GhostMap, SymbolicBuffer
from hpcgpu.halo.packing import indexed_copy
from hpcgpu.halo.regions import directions, flat_indices, is_contiguous, region_slices
from hpcgpu.transport import default_transport
from hpcgpu.transport.events import EventHandle, ExchangeTransportState, exchange_event

_TAG_STRIDE = 27  # 3**3 - 1 directions at most in 3D, plus one spare
_serials = itertools.count()


@dataclass
class Message:
    """One buffer sent to (or received from) one peer."""

    peer: int
    tag: int
    buffer: object  # 1-D view: into the packed buffer, or straight into a field (direct)


@dataclass
class _FieldIndices:
    send_idx: list = dataclass_field(default_factory=list)
    send_pos: list = dataclass_field(default_factory=list)
    recv_idx: list = dataclass_field(default_factory=list)
    recv_pos: list = dataclass_field(default_factory=list)


class HaloExchange:
    """A planned exchange of the ghost cells of ``fields``.

    Parameters
    ----------
    fields : sequence of hpcgpu.Field
        Fields on the same decomposition and architecture, with the same dtype.
    corners : bool
        Exchange edges and corners too (needed by 9- and 27-point stencils); faces only if False.
    transport : hpcgpu.transport.Transport, optional
        Default: the one chosen for this communicator and architecture (NCCL on GPUs where available).
    graph : bool
        NCCL only: capture pack + send/recv + unpack once as a CUDA graph and replay it, which cuts
        the host cost of an exchange to a few microseconds (worth it for small messages).
    boundary_conditions : sequence of BoundaryConditions or None, optional
        One per field (None for a field without any): the physical ghosts ``wait()`` fills after
        the exchange (:mod:`hpcgpu.halo.boundaries`). Default: none, those ghosts are left alone.

    Notes
    -----
    The plan keeps the arrays the fields held when it was built: swap the *fields* of a ping-pong
    scheme (two Field objects), never rebind ``field.data``.
    """

    def __init__(self, fields, corners: bool = True, transport=None, graph: bool = False,
                 boundary_conditions=None):
        fields = list(fields)
        if not fields:
            raise HaloError("exchange_halos needs at least one field")
        grid, arch = fields[0].decomposition, fields[0].arch
        dtype = fields[0].data.dtype
        for f in fields[1:]:
            if f.decomposition is not grid or f.arch is not arch:
                raise HaloError("fields of one exchange must share one Decomposition and one architecture")
            if f.data.dtype != dtype:
                raise HaloError(
                    f"fields of one exchange must share a dtype (one message per neighbour); found {dtype} "
                    f"and {f.data.dtype} ({f.name}). Exchange them in separate calls."
                )
        for f in fields:
            for axis, w in enumerate(f.halo_width):
                if w > grid.min_extent(axis):
                    raise HaloError(
                        f"ghost width {w} of field {f.name!r} on axis {axis} exceeds the smallest block "
                        f"extent {grid.min_extent(axis)} of {grid}: expected width <= extent. Use fewer "
                        "ranks along that axis (dims), a larger grid, or a smaller halo_width."
                    )
        # Checked before any collective: a bad declaration raises the same error on every rank.
        #: The physical boundary fills of this block (empty where it touches no declared edge).
        self.boundary_fill = BoundaryFill.for_fields(fields, normalise_conditions(boundary_conditions, len(fields)))
        if transport is None:
            transport = default_transport(grid.comm, arch)   # the job's choice (collective on first use)
        self.fields, self.grid, self.arch, self.transport = fields, grid, arch, transport
        self.transport_state = ExchangeTransportState()   # filled by the transport on first use
        self.corners = corners
        self.graph = graph
        self._tag_base = (next(_serials) % 1000) * _TAG_STRIDE
        self._plan(dtype)

    # ------------------------------------------------------------------ planning
    def _plan(self, dtype) -> None:
        grid, xp, me = self.grid, self.arch.xp, self.grid.comm.rank
        single = len(self.fields) == 1
        indices = [_FieldIndices() for _ in self.fields]
        send_plan, recv_plan = [], []  # (k, peer, [(field, send idx or recv idx)])
        for k, d in enumerate(directions(grid.ndim, self.corners)):
            to_peer, from_peer = grid.neighbor(d), grid.neighbor(tuple(-x for x in d))
            regions_send = [self._indices("send", d, f) for f in self.fields] if to_peer is not None else None
            regions_recv = [self._indices("recv", tuple(-x for x in d), f) for f in self.fields] if from_peer is not None else None
            if regions_send and any(r is not None for r in regions_send):
                send_plan.append((k, to_peer, regions_send))
            if regions_recv and any(r is not None for r in regions_recv):
                recv_plan.append((k, from_peer, regions_recv))

        def layout(plan, kind):
            messages, offset = [], 0
            for k, peer, regions in plan:
                if single and is_contiguous(regions[0]):
                    start = int(regions[0][0])
                    messages.append((k, peer, ("direct", start, start + regions[0].size)))
                    continue
                begin = offset
                for fi, idx in enumerate(regions):
                    if idx is None:
                        continue
                    pos = np.arange(offset, offset + idx.size, dtype=np.int64)
                    target = indices[fi]
                    (target.send_idx if kind == "send" else target.recv_idx).append(idx)
                    (target.send_pos if kind == "send" else target.recv_pos).append(pos)
                    offset += idx.size
                messages.append((k, peer, ("packed", begin, offset)))
            return messages, offset

        send_layout, send_size = layout(send_plan, "send")
        recv_layout, recv_size = layout(recv_plan, "recv")
        self.send_buffer = xp.empty(send_size, dtype=dtype)
        self.recv_buffer = xp.empty(recv_size, dtype=dtype)

        def to_device(parts):
            return xp.asarray(np.concatenate(parts)) if parts else None

        self._field_indices = [
            tuple(to_device(p) for p in (ix.send_idx, ix.send_pos, ix.recv_idx, ix.recv_pos)) for ix in indices
        ]
        flat = self.fields[0].data.reshape(-1) if single else None

        def view(kind, begin, end, buffer):
            return flat[begin:end] if kind == "direct" else buffer[begin:end]

        self.sends, self.recvs, self._local_copies = [], [], []
        recv_by_k = {k: (peer, view(kind, b, e, self.recv_buffer)) for k, peer, (kind, b, e) in recv_layout}
        recv_spec = {k: spec for k, _, spec in recv_layout}
        local_specs = []   # (send (kind, begin, end), receive (kind, begin, end)) of each local copy
        for k, peer, (kind, b, e) in send_layout:
            buffer = view(kind, b, e, self.send_buffer)
            if peer == me:
                # A periodic axis with one block: our own message comes back to us. Copy locally
                # instead of asking MPI/NCCL to talk to ourselves.
                self._local_copies.append((buffer, recv_by_k.pop(k)[1]))
                local_specs.append(((kind, b, e), recv_spec[k]))
            else:
                self.sends.append(Message(peer, self._tag_base + k, buffer))
        self.recvs = [Message(peer, self._tag_base + k, buffer) for k, (peer, buffer) in recv_by_k.items()]
        self.bytes_per_exchange = sum(m.buffer.nbytes for m in self.sends)
        self._prepare_copies()
        #: Without remote neighbours: the whole fill (local copies, then the boundary conditions)
        #: composed into one gather (:mod:`hpcgpu.halo.ghost_map`), or None.
        self.local_map = None
        if not self.sends and not self.recvs:
            self.local_map = self._compose_local(indices, local_specs, send_size, recv_size, dtype)

    def _compose_local(self, indices, local_specs, send_size, recv_size, dtype):
        """The :class:`GhostMap` of pack, local copies, unpack and boundary fills, run symbolically."""
        arrays = [f.data for f in self.fields]
        stride = max(a.size for a in arrays)
        fields = [SymbolicBuffer(a.size, dtype, first_id=k * stride) for k, a in enumerate(arrays)]
        send, receive = SymbolicBuffer(send_size, dtype), SymbolicBuffer(recv_size, dtype)
        for symbol, ix in zip(fields, indices):
            if ix.send_idx:
                send.assign(np.concatenate(ix.send_pos), symbol, np.concatenate(ix.send_idx), negate=False)
        for (send_kind, b, e), (recv_kind, rb, re) in local_specs:
            source = fields[0] if send_kind == "direct" else send
            target = fields[0] if recv_kind == "direct" else receive
            target.assign(np.arange(rb, re), source, np.arange(b, e), negate=False)
        for symbol, ix in zip(fields, indices):
            if ix.recv_idx:
                symbol.assign(np.concatenate(ix.recv_idx), receive, np.concatenate(ix.recv_pos), negate=False)
        if self.boundary_fill:
            self.boundary_fill.record(fields)
        return GhostMap.compose(arrays, fields, stride)

    def _indices(self, kind, d, f):
        slices = region_slices(kind, d, f.interior.shape, f.halo_width)
        return None if slices is None else flat_indices(slices, f.data.shape)

    # ------------------------------------------------------------------ running
    def _prepare_copies(self) -> None:
        """Resolve the pack / unpack copies once (flat views are fixed: a plan keeps the arrays it saw)."""
        self._pack_copies, self._unpack_copies = [], []
        for f, (send_idx, send_pos, recv_idx, recv_pos) in zip(self.fields, self._field_indices):
            flat = f.data.reshape(-1)
            if send_idx is not None:
                self._pack_copies.append((self.send_buffer, send_pos, flat, send_idx))
            if recv_idx is not None:
                self._unpack_copies.append((flat, recv_idx, self.recv_buffer, recv_pos))
        #: False when every message goes straight from and into the fields (no kernels to launch).
        self.needs_kernels = bool(self._pack_copies or self._unpack_copies or self._local_copies)

    def pack(self) -> None:
        """Copy owned cells into the send buffer and perform local (self-neighbour) copies."""
        for copy in self._pack_copies:
            indexed_copy(*copy)
        for source, target in self._local_copies:
            target[...] = source

    def unpack(self) -> None:
        """Copy the receive buffer into ghost cells."""
        for copy in self._unpack_copies:
            indexed_copy(*copy)

    def start(self) -> "PendingExchange":
        """Begin the exchange; returns immediately with a handle whose ``wait()`` completes it.

        Without remote neighbours the ghosts are filled here by one gather (:attr:`local_map`), and
        the handle's :attr:`PendingExchange.is_local` is True: there is nothing to overlap.
        """
        if self.arch.is_gpu:
            # Every GPU transport orders itself after the compute stream: the kernels that produced
            # the fields must be there, or packing races with them.
            self.arch.check_compute_stream("a halo exchange")
        if self.local_map is not None:
            return PendingExchange(self._start_local(), local=True)
        return PendingExchange(self.transport.start(self), self.boundary_fill or None, self.arch)

    def _start_local(self):
        """Apply :attr:`local_map`; on GPUs ordered like a transport (:class:`~hpcgpu.transport.events.EventHandle`)."""
        if not self.arch.is_gpu:
            self.local_map.apply()
            return None
        arch = self.arch
        stream = arch.comm_stream
        stream.wait_event(exchange_event(self, "ready", arch.compute_stream))
        with arch.on_stream(stream):
            self.local_map.apply()
        return EventHandle(arch.compute_stream, exchange_event(self, "done", stream))

    def run(self) -> None:
        """Exchange and wait (boundary conditions included)."""
        if self.local_map is not None:
            PendingExchange(self._start_local(), local=True).wait()
            return
        PendingExchange(self.transport.start(self), self.boundary_fill or None, self.arch).wait()


class PendingExchange:
    """An exchange in flight. ``wait()`` makes the ghost cells valid (on GPUs: for the compute stream).

    ``wait()`` completes the transport's messages, then fills the physical boundary ghosts (if the
    exchange has boundary conditions); a second ``wait()`` does nothing.

    Attributes
    ----------
    is_local : bool
        No message leaves this rank (one block along every axis with neighbours): the fill is one
        gather already queued (GPU: on the communication stream, after the compute stream's work
        so far, like a transport's pack) and there is nothing for computation to overlap.
    """

    __slots__ = ("_handle", "_boundary_fill", "_arch", "is_local")

    def __init__(self, handle, boundary_fill=None, arch=None, local: bool = False):
        self._handle, self._boundary_fill, self._arch = handle, boundary_fill, arch
        self.is_local = local

    def wait(self) -> None:
        if self._handle is not None:
            self._handle.wait()
            self._handle = None
        if self._boundary_fill is not None:
            # After the transport's wait the compute stream waits for the unpack: the fills must go
            # to that stream (CuPy's current one) to read neighbour ghosts that have arrived.
            if self._arch is not None and self._arch.is_gpu:
                self._arch.check_compute_stream("filling boundary conditions after a halo exchange")
            self._boundary_fill.apply()
            self._boundary_fill = None


def _plan_for(fields, corners, transport, graph=False, boundary_conditions=None) -> HaloExchange:
    owner = fields[0]
    conditions = normalise_conditions(boundary_conditions, len(fields))
    key = (tuple(id(f) for f in fields), corners, id(transport), graph)
    if any(c is not None for c in conditions):
        key += (conditions,)   # no conditions: the key (and plan) of before
    plan = owner._halo_plans.get(key)
    if plan is None:
        plan = HaloExchange(fields, corners=corners, transport=transport, graph=graph,
                            boundary_conditions=conditions)
        owner._halo_plans[key] = plan
    return plan


def exchange_halos(fields, wait: bool = True, corners: bool = True, transport=None, graph: bool = False,
                   boundary_conditions=None):
    """Fill the ghost cells of ``fields`` from their neighbours (one message per neighbour).

    Parameters
    ----------
    fields : Field or sequence of Field
    wait : bool
        If False, return a :class:`PendingExchange` to ``wait()`` on after overlapping work.
    corners : bool
        Include edge and corner neighbours (default) or faces only.
    transport : optional
        Override the job's default transport (see :mod:`hpcgpu.transport`).
    graph : bool
        Replay the exchange as a CUDA graph (NCCL transport; see :class:`HaloExchange`).
    boundary_conditions : BoundaryConditions or sequence of them, optional
        One per field (None entries allowed; a single one for a single field): the physical ghosts
        to fill after the exchange, see :mod:`hpcgpu.halo.boundaries`. Default: left untouched.

    Returns
    -------
    None or PendingExchange
    """
    if not isinstance(fields, (list, tuple)):
        fields = [fields]
    pending = _plan_for(list(fields), corners, transport, graph, boundary_conditions).start()
    if wait:
        pending.wait()
        return None
    return pending
