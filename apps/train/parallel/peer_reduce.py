"""Gradient buckets summed by the GPUs' copy engines (CUDA IPC), for 2 ranks on one node.

NCCL's allreduce runs as thread blocks that share the SMs with the backward GEMMs it
overlaps, and slows them. Here the bytes move with ``cudaMemcpyAsync`` between buffers
that each rank has mapped from its peer (CUDA IPC): over NVLink such a copy runs on a
*copy engine*, not on the SMs. Only a one-thread signal kernel, a one-warp wait kernel
and one elementwise add per bucket touch the SMs.

Per bucket ``(lo, hi)`` with ``mid = (lo + hi) // 2``, rank 0 owns ``[lo, mid)`` and rank 1
owns ``[mid, hi)``. Each rank holds a receive buffer ``received`` as long as the gradient
buffer and two rows of flags in its own memory, ``scattered[bucket]`` and
``gathered[bucket]``, which only the peer writes. On the communication stream, after the
compute stream's *ready* event of the bucket (:class:`apps.train.parallel.reducers.StreamBucketReducer`)::

    a. copy my bucket's NON-owned half into the peer's ``received`` (same element range);
       signal the peer's scattered[bucket] := epoch
    b. wait until my scattered[bucket] >= epoch;  grads[owned] += received[owned]
    c. copy my reduced owned half into the peer's ``grads`` (same range);
       signal the peer's gathered[bucket] := epoch

and at the end of the step (``wait``) one kernel waits until every gathered[bucket] >=
epoch, then the compute stream waits for an event recorded after it. ``epoch`` is a host
counter raised once per round (the first ``start`` after a ``wait``: once per training step,
and once per round of :meth:`DataParallel.measure_allreduce_alone`), passed to the kernels
as an argument. A signal kernel stores it with a volatile store after
``__threadfence_system``; the wait kernel spins on volatile loads with ``__nanosleep``
(both :mod:`hpcgpu.transport.peer_memory`'s, which also maps the peer's buffers).

Result: for two ranks the sum of an element is one addition ``a + b`` in the gradient
dtype, rounded to nearest (inline PTX ``add.rn``, no flush of subnormals), as NCCL's
reduction computes it: the buffers are **bitwise equal** to NCCL's ``allreduce(sum)``.
As with NCCL, this is a SUM (the trainer divides the loss by the global batch).

Why no buffer is overwritten too early (step k; "my"/"peer" are the two ranks)
------------------------------------------------------------------------------
* my ``grads[peer's half]``: my backward writes it before the ready event, my copy (a)
  reads it, the peer's copy (c) overwrites it with the sum. The peer issues (c) only after
  its wait for scattered >= k, which my stream signals after (a), after the ready event.
  Backward never touches a bucket again once it has reported it complete.
* my ``received[my half]``: the peer's copy (a) writes it; my add reads it after my wait
  for scattered >= k. The peer's NEXT copy (a), of step k + 1, comes after the peer's
  optimiser step k (the compute stream's ready event of step k + 1 follows it), which waited
  for the peer's end-of-step wait for gathered >= k of every bucket -- signals my stream
  raises after (c), hence after my add. (The peer's communication stream also runs its
  end-of-step wait before any of its step k + 1 copies, in stream order.) So the receive
  buffer is reused only after it was consumed.
* my ``grads[my half]``: only my own streams touch it (add after the ready event; the
  optimiser after the end-of-step wait).
* my whole ``grads`` in step k + 1: my compute stream zeroes it only after the end-of-step
  wait of step k, which saw every gathered >= k, signalled by the peer after its copy (c):
  no write of step k is still in flight. The peer's copies of step k + 1 into my buffers
  need my signals of step k + 1, which come after my ready events of step k + 1.
* flags: each is written by one rank only, with increasing epochs; a wait for ``>= k``
  cannot be satisfied early by a step k + 1 signal, because that signal follows the
  signalling rank's end-of-step wait of step k, which needed this rank's signals of step k,
  which come after this rank's waits of step k.

Gradient accumulation needs nothing extra: only the last micro-batch's backward reports
buckets (:func:`apps.train.training.trainer.compute_gradients`), so one optimiser step is one round.
``measure_allreduce_alone`` starts every bucket and waits, several times: each is a round
with its own epoch and the same chain of signals.

Requirements (:func:`check_peer_reduce`, the same verdict on every rank): GPUs, exactly 2
ranks, one node (CUDA IPC maps memory of GPUs of one node only), ZeRO stage 0.
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.arch import on_stream
from hpcgpu.errors import ConfigurationError
from hpcgpu.transport.peer_memory import (
    FLAG_BYTES,
    export_addresses,
    flag_kernels,
    open_addresses,
    pointer_arg,
    ready_for_peer_stores,
    signal_flag,
    wait_flags,
)

from .reducers import StreamBucketReducer

_SOURCE = r"""
// a + b rounded to nearest in the storage type, as NCCL's sum: inline PTX so that no
// compiler flag (CuPy compiles with -ftz=true) flushes subnormals or fuses anything.
__device__ __forceinline__ unsigned short add_rn(unsigned short a, unsigned short b) {
    unsigned short sum;
    asm("add.rn.f16 %0, %1, %2;" : "=h"(sum) : "h"(a), "h"(b));
    return sum;
}
__device__ __forceinline__ float add_rn(float a, float b) {
    float sum;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
}
__device__ __forceinline__ double add_rn(double a, double b) {
    double sum;
    asm("add.rn.f64 %0, %1, %2;" : "=d"(sum) : "d"(a), "d"(b));
    return sum;
}

template <typename T>
__device__ __forceinline__ void add_received(T* grads, const T* received, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        grads[i] = add_rn(grads[i], received[i]);
    }
}

// grads[i] += received[i] for i < n (float16 travels as its 16-bit pattern)
extern "C" __global__ void peer_reduce_add_float16(unsigned short* grads, const unsigned short* received,
                                                   long long n) {
    add_received(grads, received, n);
}
extern "C" __global__ void peer_reduce_add_float32(float* grads, const float* received, long long n) {
    add_received(grads, received, n);
}
extern "C" __global__ void peer_reduce_add_float64(double* grads, const double* received, long long n) {
    add_received(grads, received, n);
}
"""

#: Gradient dtypes the add kernel handles.
DTYPES = ("float16", "float32", "float64")

_ADD_THREADS = 256
_ADD_MAX_BLOCKS = 1024   # grid-stride beyond: a short kernel that never fills the GPU for long


@functools.cache
def _add_kernels():
    """The per-dtype add kernels, compiled and loaded once per process (the signal and wait kernels are
    :mod:`hpcgpu.transport.peer_memory`'s)."""
    import cupy

    module = cupy.RawModule(code=_SOURCE)
    return {dtype: module.get_function(f"peer_reduce_add_{dtype}") for dtype in DTYPES}


def owned_range(lo, hi, rank):
    """The half of bucket ``[lo, hi)`` that ``rank`` (0 or 1) sums: ``[lo, mid)`` or ``[mid, hi)``."""
    mid = (lo + hi) // 2
    return (lo, mid) if rank == 0 else (mid, hi)


def check_peer_reduce(comm, is_gpu=None, zero_stage=0):
    """Raise ConfigurationError (the same verdict on every rank) unless ``--allreduce peer`` applies.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        Only ``size`` and ``n_nodes`` are read (the same on every rank).
    is_gpu : bool or None
        Whether the backend is the GPU; None when not chosen yet (the check is skipped).
    zero_stage : int
        ZeRO-1 reduce-scatters once after backward with its own collectives.
    """
    problems = []
    if is_gpu is False:
        problems.append("it needs GPUs (--backend cupy), the backend is the CPU")
    if comm.size != 2:
        problems.append(f"it needs exactly 2 ranks, found {comm.size} (use --allreduce nccl for other counts)")
    if comm.n_nodes != 1:
        problems.append(f"CUDA IPC reaches GPUs of one node only; the job spans {comm.n_nodes} nodes")
    if zero_stage != 0:
        problems.append(f"it reduces the DDP buckets of --zero 0 only, found --zero {zero_stage} "
                        "(ZeRO-1 uses NCCL's reduce-scatter)")
    if problems:
        raise ConfigurationError("--allreduce peer cannot be used: " + "; ".join(problems))


class PeerBucketReducer(StreamBucketReducer):
    """Copy-engine bucket sums between 2 GPUs of one node (module docstring).

    Same interface as the NCCL reducer: ``mark_backward_start()``, ``start(grads, lo, hi)``,
    ``progress()``, ``wait()``, ``_resolve()`` and ``totals``.

    Parameters
    ----------
    comm : hpcgpu.Communicator -- 2 ranks, one node
    arch : hpcgpu.arch.GPU
    grads : cupy.ndarray, shape (n_params,), float16/float32/float64
        The flat gradient buffer; it is mapped by the peer, so it must not be replaced later
        (bind a new reducer for a new buffer).
    buckets : list of (int, int)
        The planned buckets (identical on both ranks); ``start`` accepts exactly these.

    Collective over the communicator (IPC handles travel by MPI once).
    """

    def __init__(self, comm, arch, grads, buckets):
        check_peer_reduce(comm, arch.is_gpu)
        import cupy

        dtype = np.dtype(grads.dtype)
        if dtype.name not in DTYPES:
            raise ConfigurationError(f"--allreduce peer sums {', '.join(DTYPES)} gradients, found {dtype}")
        if grads.ndim != 1 or not grads.flags.c_contiguous:
            raise ValueError(f"the gradient buffer must be flat and contiguous, found shape {grads.shape}")
        super().__init__(arch)
        flag_kernels()   # compile and load now, not while a wait kernel spins on the device
        self._add = _add_kernels()[dtype.name]
        self.rank, self.grads, self.buckets = comm.rank, grads, [tuple(b) for b in buckets]
        self._bucket_index = {bucket: index for index, bucket in enumerate(self.buckets)}
        n_buckets = len(self.buckets)
        self.received = cupy.empty_like(grads)   # the peer's half of each bucket lands here
        # row 0: scattered[bucket], row 1: gathered[bucket]; written by the peer only
        self.flags = cupy.zeros((2, max(1, n_buckets)), dtype=cupy.uint64)
        self._scratch_flag = cupy.zeros(1, dtype=cupy.uint64)
        mine = {"window": export_addresses({"grads": grads.data.ptr, "received": self.received.data.ptr,
                                            "flags": self.flags.data.ptr}),
                "n_params": int(grads.shape[0]), "dtype": dtype.name, "buckets": self.buckets}
        everyone = comm.mpi.allgather(mine)
        # both ranks compare the same two records: the same verdict everywhere
        for key in ("n_params", "dtype", "buckets"):
            if everyone[0][key] != everyone[1][key]:
                raise ConfigurationError(f"--allreduce peer: the ranks' gradient buffers differ ({key}: "
                                         f"{everyone[0][key]} on rank 0, {everyone[1][key]} on rank 1); "
                                         "every replica must hold the same model")
        peer = everyone[1 - comm.rank]
        row_bytes = self.flags.shape[1] * FLAG_BYTES
        window = open_addresses(peer["window"])
        self._peer_grads, self._peer_received, peer_flags = window["grads"], window["received"], window["flags"]
        self._peer_scattered, self._peer_gathered = peer_flags, peer_flags + row_bytes
        self._my_scattered, self._my_gathered = self.flags.data.ptr, self.flags.data.ptr + row_bytes
        self._epoch = 0
        self._started = None   # per bucket: started in the open round; None between rounds
        # Launch every kernel once (lazy module loading must not happen while a wait kernel spins).
        with on_stream(self.comm_stream):
            signal_flag(self._scratch_flag, 0)
            wait_flags(self._scratch_flag, 1, 0)
            self._add((1,), (_ADD_THREADS,), (grads, self.received, np.int64(0)))
        ready_for_peer_stores(comm)   # every mapping is open and every flag zeroed before anyone signals

    def _copy_to_peer(self, peer_address, lo, hi):
        """Queue a copy-engine copy of my ``grads[lo:hi]`` to ``peer_address`` on the communication stream."""
        import cupy

        n_bytes = (hi - lo) * self.grads.itemsize
        if n_bytes:
            runtime = cupy.cuda.runtime
            runtime.memcpyAsync(peer_address + lo * self.grads.itemsize,
                                self.grads.data.ptr + lo * self.grads.itemsize, n_bytes,
                                runtime.memcpyDeviceToDevice, self.comm_stream.ptr)

    def _reduce(self, grads, lo, hi):
        index = self._bucket_index.get((lo, hi))
        if index is None or grads.data.ptr != self.grads.data.ptr:
            raise ValueError(f"--allreduce peer reduces the planned buckets of the buffer it was built for; "
                             f"got ({lo}, {hi}) of a buffer at {grads.data.ptr:#x}")
        if self._started is None:   # the first bucket of a round: a new epoch
            self._epoch += 1
            self._started = [False] * len(self.buckets)
        if self._started[index]:
            raise RuntimeError(f"bucket {index} ({lo}, {hi}) started twice in one step")
        self._started[index] = True
        epoch = self._epoch
        itemsize = self.grads.itemsize
        own_lo, own_hi = owned_range(lo, hi, self.rank)
        sent_lo, sent_hi = owned_range(lo, hi, 1 - self.rank)
        flag_offset = index * FLAG_BYTES
        with on_stream(self.comm_stream):
            # a. the peer's half of my bucket -> its receive buffer; tell it
            self._copy_to_peer(self._peer_received, sent_lo, sent_hi)
            signal_flag(self._peer_scattered + flag_offset, epoch)
            # b. the peer's copy of my half has arrived: add it
            wait_flags(self._my_scattered + flag_offset, 1, epoch)
            n_owned = own_hi - own_lo
            if n_owned:
                blocks = min(_ADD_MAX_BLOCKS, -(-n_owned // _ADD_THREADS))
                self._add((blocks,), (_ADD_THREADS,),
                          (pointer_arg(self.grads.data.ptr + own_lo * itemsize),
                           pointer_arg(self.received.data.ptr + own_lo * itemsize), np.int64(n_owned)))
            # c. my reduced half -> the peer's gradient buffer (the peer already sent that range
            #    out: it signalled scattered before we got past the wait); tell it
            self._copy_to_peer(self._peer_grads, own_lo, own_hi)
            signal_flag(self._peer_gathered + flag_offset, epoch)

    def _round_done(self):
        if self._started is None or not all(self._started):
            # waiting for a bucket nobody started would hang both GPUs
            missing = [i for i, started in enumerate(self._started or []) if not started]
            raise RuntimeError(f"--allreduce peer: wait() before every bucket was started (missing {missing})")
        self._started = None
        with on_stream(self.comm_stream):
            wait_flags(self._my_gathered, len(self.buckets), self._epoch)
        done = self._event()
        done.record(self.comm_stream)
        self._round_events.append(done)
        return done
