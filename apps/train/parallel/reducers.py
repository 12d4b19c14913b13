"""Bucket reducers: how one gradient bucket is summed over ranks, and shared helpers of the synchronisers.

Every byte moves through the job's transport (:func:`hpcgpu.transport.collectives`):
:class:`MpiBucketReducer` (host buffers: a non-blocking MPI allreduce in place per bucket),
:class:`StreamBucketReducer` (the GPU base: a reduction queued on the communication stream between CUDA
events) and :class:`DeviceBucketReducer` (the transport's device allreduce on that stream: NCCL queues
it and the host never blocks; the MPI device transports synchronise the stream first). The copy-engine
reducer of ``--allreduce peer`` (:class:`apps.train.parallel.peer_reduce.PeerBucketReducer`) is a
:class:`StreamBucketReducer` too. :func:`mpi_supports` and :func:`load_optimizer_slices` serve both data
parallelism (:mod:`apps.train.parallel.distributed`) and ZeRO-1 (:mod:`apps.train.parallel.zero`).

Element types: float32 and float64 gradients are reduced as they are; float16 too where the transport
can (NCCL; MPI libraries with ``MPIX_C_FLOAT16``), else as float32 copies; bfloat16 gradients are
always summed as float32 copies and rounded back once (MPI has no bfloat16, and NCCL's bfloat16 sum
would round the partial sums between ranks).
"""

import time

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.transport import collectives
from hpcgpu.transport.host_collectives import mpi_datatype

from apps.train.kernels.backend import is_bfloat16, is_cupy
from apps.train.kernels.buffers import round_to_bfloat16, scaled_copy


def mpi_supports(dtype):
    """True when the MPI library reduces ``dtype`` natively (float16 is optional in MPI)."""
    try:
        return mpi_datatype(dtype, reducing=True) is not None
    except (BackendError, KeyError, ValueError, TypeError):
        return False


class MpiBucketReducer:
    """Non-blocking MPI allreduce of host buffer slices (the CPU path), through the transport's
    :meth:`~hpcgpu.transport.host_collectives.HostCollectives.allreduce_start`.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    dtype : numpy.dtype
        Of the gradients: without a native MPI type (bfloat16; float16 in some MPI libraries) the
        buckets travel as float32 copies.
    """

    def __init__(self, comm, dtype):
        self.movers = collectives(comm, on_device=False)
        self.staged = not mpi_supports(dtype)
        self.handles = []
        self.staging = []
        self.exposed_seconds = 0.0

    def start(self, grads, lo, hi):
        target = grads[lo:hi]
        if self.staged:
            buffer = target.astype(np.float32)
            self.staging.append((target, buffer))
            target = buffer
        self.handles.append(self.movers.allreduce_start(target, out=target))
        self.progress()

    def progress(self):
        """Let MPI progress the started buckets (MPICH does so only inside MPI calls); never blocks."""
        for handle in self.handles:
            handle.test()

    def wait(self):
        started = time.perf_counter()
        for handle in self.handles:
            handle.wait()
        for target, buffer in self.staging:
            target[...] = buffer
        self.handles, self.staging = [], []
        self.exposed_seconds = time.perf_counter() - started


class StreamBucketReducer:
    """Bucket reductions queued on the communication stream, timed with CUDA events (GPU reducers).

    Per bucket: the communication stream waits for a *ready* event of the compute stream,
    then :meth:`_reduce` queues the reduction between a *start* and a *done* event. The host
    never blocks; :meth:`wait` makes the compute stream wait for :meth:`_round_done`. The
    events of a step are turned into seconds lazily, at the next step (:meth:`_resolve`),
    into ``totals`` (``steps``, ``exposed``, ``busy``, ``backward``; seconds summed over steps).
    """

    def __init__(self, arch):
        self.compute_stream, self.comm_stream = arch.compute_stream, arch.comm_stream
        self._free_events = []
        self._launched = []        # (start event, done event) of this step's buckets
        self._round_events = []    # other events of this step, recycled with them
        self._unresolved = None    # events of the previous step, read lazily
        self._backward_start = None
        self.totals = {"steps": 0, "exposed": 0.0, "busy": 0.0, "backward": 0.0}

    def _event(self):
        import cupy

        return self._free_events.pop() if self._free_events else cupy.cuda.Event()

    def mark_backward_start(self):
        self._resolve()
        self._backward_start = self._event()
        self._backward_start.record(self.compute_stream)

    def start(self, grads, lo, hi):
        self._resolve()
        ready, start, done = self._event(), self._event(), self._event()
        # The communication stream may only read this slice once backward has written it.
        ready.record(self.compute_stream)
        self.comm_stream.wait_event(ready)
        start.record(self.comm_stream)
        self._reduce(grads, lo, hi)
        done.record(self.comm_stream)
        self._free_events.append(ready)   # reusable once recorded: nothing reads it later
        self._launched.append((start, done))

    def _reduce(self, grads, lo, hi):
        """Queue the sum over ranks of ``grads[lo:hi]`` (in place) on the communication stream."""
        raise NotImplementedError

    def _round_done(self):
        """The event after which every bucket of this step is reduced."""
        return self._launched[-1][1]   # one communication stream: the last done covers all

    def progress(self):
        """The reductions progress on the device; nothing to do on the host."""

    def wait(self):
        if not self._launched:
            return
        round_done = self._round_done()
        backward_end, synced = self._event(), self._event()
        backward_end.record(self.compute_stream)
        self.compute_stream.wait_event(round_done)
        synced.record(self.compute_stream)
        self._unresolved = (self._backward_start, backward_end, synced, self._launched, self._round_events)
        self._launched, self._round_events, self._backward_start = [], [], None

    def _resolve(self):
        """Turn the previous step's events into seconds (they completed long ago)."""
        import cupy

        if self._unresolved is None:
            return
        backward_start, backward_end, synced, launched, round_events = self._unresolved
        self._unresolved = None
        synced.synchronize()
        elapsed = cupy.cuda.get_elapsed_time
        self.totals["steps"] += 1
        self.totals["exposed"] += elapsed(backward_end, synced) / 1e3
        self.totals["busy"] += sum(elapsed(start, done) for start, done in launched) / 1e3
        if backward_start is not None:
            self.totals["backward"] += elapsed(backward_start, backward_end) / 1e3
            self._free_events.append(backward_start)
        self._free_events += [backward_end, synced, *round_events]
        for start, done in launched:
            self._free_events += [start, done]


class DeviceBucketReducer(StreamBucketReducer):
    """The transport's allreduce of device buffer slices on the communication stream (the GPU path).

    With ``nccl`` the call is queued on the communication stream and the host goes on; the MPI device
    transports (``mpi-cuda``, ``mpi-staged``) synchronise that stream first and land the result on it.

    bfloat16 gradients (``uint16`` bit patterns) are summed in float32, like the CPU's MPI
    staging: on the communication stream each bucket is widened into a float32 staging
    buffer (allocated once, the gradients' length), allreduced, and rounded back to
    bfloat16 once -- twice the bytes on the wire of a bfloat16 allreduce, and no
    bfloat16 rounding between the ranks' partial sums.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        Its device collectives are built here (collective the first time: NCCL's communicator).
    arch : hpcgpu.arch.GPU
    dtype : dtype of the gradients
    """

    def __init__(self, comm, arch, dtype):
        super().__init__(arch)
        self.movers = collectives(comm, on_device=True)
        self.bfloat16 = is_bfloat16(dtype)
        self.staged = not self.bfloat16 and self.movers.name != "nccl" and not mpi_supports(dtype)
        self.staging = None

    def _reduce(self, grads, lo, hi):
        if self.bfloat16 or self.staged:
            self._reduce_in_float32(grads, lo, hi)
            return
        bucket = grads[lo:hi]
        self.movers.allreduce(bucket, out=bucket, stream=self.comm_stream)

    def _reduce_in_float32(self, grads, lo, hi):
        import cupy

        if self.staging is None or self.staging.shape != grads.shape:
            # allocated on the compute stream before the communication stream uses it
            self.staging = cupy.empty(grads.shape, dtype=cupy.float32)
            self.compute_stream.synchronize()
        staged = self.staging[lo:hi]
        with self.comm_stream:
            if self.bfloat16:
                scaled_copy(grads[lo:hi], staged, 1.0)
            else:   # float16 through an MPI library without float16
                staged[...] = grads[lo:hi]
            self.movers.allreduce(staged, out=staged, stream=self.comm_stream)
            if self.bfloat16:
                round_to_bfloat16(staged, grads[lo:hi])
            else:
                grads[lo:hi] = staged


def load_optimizer_slices(optimizer_state, full_state, lo, hi):
    """Fill ``optimizer_state`` in place from the slice ``[lo, hi)`` of full host arrays; returns None.

    Parameters
    ----------
    optimizer_state : dict of str -> array
        This rank's state: arrays of shape ``(hi - lo,)`` (NumPy or CuPy) and 0-d counters.
    full_state : dict of str -> numpy.ndarray
        The checkpoint's arrays over the whole flat buffer.
    lo, hi : int or None
        The slice this rank holds (``0, None``: all of it).
    """
    for key, value in optimizer_state.items():
        if key not in full_state:
            raise ValueError(f"checkpoint has no optimizer state {key!r} (it holds "
                             f"{sorted(full_state)}); it was written with another optimizer")
        saved = np.asarray(full_state[key])
        if saved.ndim == 0:
            optimizer_state[key] = np.asarray(saved, dtype=np.int64)
            continue
        piece = saved[lo:hi]
        if piece.shape != value.shape:
            raise ValueError(f"optimizer state {key!r}: checkpoint slice has shape {piece.shape}, "
                             f"this rank expects {tuple(value.shape)}")
        value[...] = piece if not is_cupy(value) else _to_device(value, piece)


def _to_device(like, host):
    import cupy

    return cupy.asarray(host, dtype=like.dtype)
