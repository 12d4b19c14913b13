"""Data parallelism: bucketed gradient allreduce overlapped with the backward pass.

Every rank holds a full replica of the model and computes gradients on its shard of
the global batch; the gradients are then SUMMED over ranks (the loss is already
divided by the global batch size, see :mod:`apps.train.nn.loss`), so every replica
takes the same optimiser step as one process on the whole batch.

Buckets
-------
The flat gradient buffer is laid out in backward order (:mod:`apps.train.nn.params`):
backward finalises it from offset 0 upwards and reports each finished layer
through ``on_grads_ready(lo, hi)``. :func:`plan_buckets` cuts the buffer into
contiguous buckets of about ``bucket_mb`` MB (25 MB by default, as PyTorch DDP);
as soon as a reported ``hi`` reaches the end of a bucket, that bucket's allreduce
starts -- while backward continues with the earlier layers.

Every bucket moves through the job's transport (:func:`hpcgpu.transport.collectives`):

* GPU: record an event on the compute stream, make the high-priority
  communication stream wait for it, the transport's allreduce (sum, in place) of
  the bucket's slice on the communication stream, record a *done* event. With
  ``nccl`` the host never blocks; :meth:`DataParallel.finish_gradients` makes the
  compute stream wait for the last done event (one stream, so it covers all
  buckets), so the optimiser kernels queue behind exactly the reductions they need.
  (``mpi-cuda`` and ``mpi-staged`` synchronise the communication stream per bucket.)
* GPU with ``allreduce="peer"`` (2 GPUs of one node): the same events and streams,
  but the bytes move with the copy engines between CUDA-IPC-mapped buffers and one
  small add kernel sums each half (:mod:`apps.train.parallel.peer_reduce`): no NCCL kernels
  occupy SMs beside the backward GEMMs. Bitwise NCCL's result.
* CPU: a non-blocking MPI allreduce (``MPI_Iallreduce`` in place, the transport's
  ``allreduce_start``) per bucket; every hook call also tests the outstanding
  requests, which drives MPI's progress engine (MPICH makes progress only inside
  MPI calls), and ``finish_gradients`` waits for all of them.

Overlap accounting (:meth:`DataParallel.overlap_stats`)
--------------------------------------------------------
``backward``: time from the start of the last micro-batch's backward to its end;
``exposed``: time the compute stream (CPU: the host) waited in
``finish_gradients``; ``alone``: the same bucketed allreduce with no compute,
measured by :meth:`DataParallel.measure_allreduce_alone`. The fraction of the
allreduce hidden behind backward is ``1 - exposed / alone`` (clipped to [0, 1]).
On a GPU the busy time of the communication stream (sum over buckets of
``done - start``) is reported too.
"""

import os
import time

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.simulation import nccl_channel_limit
from hpcgpu.transport import collectives, job_transport

from apps.train.kernels.backend import is_cupy, to_numpy
from apps.train.data.dataset import shard_bounds
from .peer_reduce import PeerBucketReducer, check_peer_reduce
from .reducers import DeviceBucketReducer, MpiBucketReducer, StreamBucketReducer, load_optimizer_slices
from .zero import ZeroRedundancy

#: Default bucket size in MB (10**6 bytes), PyTorch DDP's default.
DEFAULT_BUCKET_MB = 25.0


def plan_buckets(n_params, itemsize, bucket_mb=DEFAULT_BUCKET_MB):
    """Contiguous ``(lo, hi)`` ranges that tile ``[0, n_params)``, about ``bucket_mb`` each.

    Parameters
    ----------
    n_params : int
        Length of the flat gradient buffer.
    itemsize : int
        Bytes per gradient element (2 for fp16, 4 for fp32).
    bucket_mb : float
        Target bucket size in MB (10**6 bytes); must be positive.
    """
    if not bucket_mb > 0:
        raise ValueError(f"bucket size: expected a positive number of MB, found {bucket_mb}")
    per_bucket = max(1, int(bucket_mb * 1e6) // int(itemsize))
    return [(lo, min(lo + per_bucket, int(n_params))) for lo in range(0, int(n_params), per_bucket)]


class DataParallel:
    """Gradient synchronisation for data-parallel training (the trainer's ``sync``).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    bucket_mb : float
        Bucket size in MB (10**6 bytes).
    allreduce : {"nccl", "peer"}
        How GPU buckets are summed: NCCL's allreduce (default), or ``"peer"``: copy-engine
        copies between CUDA-IPC-mapped buffers and one small add kernel
        (:class:`apps.train.parallel.peer_reduce.PeerBucketReducer`; exactly 2 ranks on one node with
        GPUs, checked here identically on every rank). CPU buffers always use MPI.

    Attributes
    ----------
    buckets : list of (int, int)
        Planned after :meth:`bind`.
    on_grads_ready : callable(lo, hi) or None
        The backward hook; None on one rank (nothing to reduce).
    """

    zero_stage = 0

    def __init__(self, comm, arch, bucket_mb=DEFAULT_BUCKET_MB, allreduce="nccl"):
        self.comm, self.arch = comm, arch
        self.bucket_mb = float(bucket_mb)
        plan_buckets(1, 4, self.bucket_mb)   # validates the size before any collective
        check_allreduce(comm, allreduce, is_gpu=getattr(arch, "is_gpu", False))
        self.allreduce = allreduce
        self.buckets = []
        self.grads = None
        self._reducer = None
        self._next_bucket = 0
        self._cpu_totals = {"steps": 0, "exposed": 0.0, "backward": 0.0}
        self._backward_started = None
        self.alone_seconds = None
        if comm.size == 1:
            self.on_grads_ready = None

    # -- trainer protocol ------------------------------------------------------
    def bind(self, grads):
        """Plan the buckets over the flat gradient buffer ``grads`` (shape ``(n_params,)``)."""
        self.grads = grads
        self.buckets = plan_buckets(grads.shape[0], grads.itemsize, self.bucket_mb)
        if self.comm.size == 1:
            return
        if is_cupy(grads) and self.allreduce == "peer":
            self._reducer = PeerBucketReducer(self.comm, self.arch, grads, self.buckets)
        elif is_cupy(grads):
            self._reducer = DeviceBucketReducer(self.comm, self.arch, grads.dtype)
        else:
            self._reducer = MpiBucketReducer(self.comm, grads.dtype)

    def before_backward(self):
        if self._reducer is None:
            return
        self._next_bucket = 0
        if isinstance(self._reducer, StreamBucketReducer):
            self._reducer.mark_backward_start()
        else:
            self._backward_started = time.perf_counter()

    def on_grads_ready(self, lo, hi):
        """Backward hook: ``grads[lo:hi]`` are final; start every bucket that is now complete."""
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket][1] <= hi:
            bucket_lo, bucket_hi = self.buckets[self._next_bucket]
            self._reducer.start(self.grads, bucket_lo, bucket_hi)
            self._next_bucket += 1
        self._reducer.progress()

    def finish_gradients(self, grads):
        """Start the buckets not started yet, then wait for all; returns None."""
        if self._reducer is None:
            return
        if self._backward_started is not None:
            self._cpu_totals["backward"] += time.perf_counter() - self._backward_started
            self._backward_started = None
        if self._next_bucket < len(self.buckets):
            # no hook ran (or the last layers reported nothing): reduce what is left now
            self.on_grads_ready(0, grads.shape[0])
        self._reducer.wait()
        self._next_bucket = 0
        if isinstance(self._reducer, MpiBucketReducer):
            self._cpu_totals["steps"] += 1
            self._cpu_totals["exposed"] += self._reducer.exposed_seconds

    def owned_range(self, n_params):
        return 0, int(n_params)

    def sum_over_shards(self, value):
        # the gradients are replicated after the allreduce: the local value is the global one
        return value

    def gather_params(self, params):
        """Replicas step identically: nothing to gather; returns None."""

    def allreduce_sum(self, value):
        return self.comm.allreduce(value, op="sum") if self.comm.size > 1 else value

    # -- optimiser state for checkpoints -----------------------------------------
    def full_optimizer_state(self, optimizer_state):
        """Host copies of the optimiser state over the whole buffer (replicated already)."""
        # 0-d counters become NumPy scalars, which the checkpoint stores as scalars
        return {key: (to_numpy(value)[()] if np.ndim(value) == 0 else to_numpy(value).copy())
                for key, value in optimizer_state.items()}

    def load_optimizer_state(self, optimizer_state, full_state):
        """Fill ``optimizer_state`` in place from full-buffer host arrays; returns None."""
        load_optimizer_slices(optimizer_state, full_state, 0, None)

    # -- overlap measurement -------------------------------------------------------
    def measure_allreduce_alone(self, repeats=5):
        """Collective: seconds of one bucketed allreduce of the whole buffer with no compute.

        Runs on the bound gradient buffer (the trainer zeroes it at the start of
        every step, so call this between steps). One warm-up round (NCCL connects
        its peers on first use), then the median of ``repeats`` rounds, maximum
        over ranks; stored in ``alone_seconds``. 0 on one rank.
        """
        if self._reducer is None:
            self.alone_seconds = 0.0
            return 0.0
        saved_totals = None
        if isinstance(self._reducer, StreamBucketReducer):
            self._reducer._resolve()
            saved_totals = dict(self._reducer.totals)
        rounds = []
        for _ in range(1 + max(1, repeats)):
            self.comm.barrier()
            self.arch.synchronize()
            started = time.perf_counter()
            for lo, hi in self.buckets:
                self._reducer.start(self.grads, lo, hi)
            self._reducer.wait()
            self.arch.synchronize()
            rounds.append(time.perf_counter() - started)
        if saved_totals is not None:
            # these rounds were not training steps: keep them out of the overlap totals
            self._reducer._unresolved = None
            self._reducer.totals = saved_totals
        self.grads.fill(0)
        self.alone_seconds = self.comm.allreduce(float(np.median(rounds[1:])), op="max")
        return self.alone_seconds

    def overlap_stats(self):
        """Per-step means: backward, exposed wait, allreduce alone and the hidden fraction.

        Returns
        -------
        dict
            ``buckets``, ``bucket_mb``, ``backward_ms``, ``exposed_wait_ms``,
            ``allreduce_alone_ms`` (None until measured), ``allreduce_busy_ms``
            (GPU only) and ``hidden_fraction`` (None until ``alone`` is measured or
            on one rank).
        """
        stats = {"buckets": len(self.buckets), "bucket_mb": self.bucket_mb}
        if self._reducer is None:
            stats.update(backward_ms=None, exposed_wait_ms=0.0, allreduce_alone_ms=0.0,
                         hidden_fraction=None)
            return stats
        if isinstance(self._reducer, StreamBucketReducer):
            self._reducer._resolve()
            totals = self._reducer.totals
        else:
            totals = self._cpu_totals
        steps = max(1, totals["steps"])
        exposed = totals["exposed"] / steps
        stats["backward_ms"] = 1e3 * totals["backward"] / steps
        stats["exposed_wait_ms"] = 1e3 * exposed
        if "busy" in totals:
            stats["allreduce_busy_ms"] = 1e3 * totals["busy"] / steps
        alone = self.alone_seconds
        stats["allreduce_alone_ms"] = None if alone is None else 1e3 * alone
        stats["hidden_fraction"] = (None if not alone or not totals["steps"]
                                    else float(min(1.0, max(0.0, 1.0 - exposed / alone))))
        return stats


def create_nccl_communicator(comm, arch, n_channels=0):
    """Collective: build this job's device collectives of ``comm`` now -- with the ``nccl``
    transport, its NCCL communicator -- with at most ``n_channels`` NCCL channels.

    NCCL runs each collective as one thread block per *channel*; by default it takes
    as many as the links can use, and those blocks occupy SMs that the backward GEMMs
    running beside the bucket allreduces would otherwise use. Few channels lower the
    allreduce bandwidth but leave the compute kernels alone -- a win while the
    allreduce is hidden behind backward anyway. ``NCCL_MAX_NCHANNELS`` is read when a
    communicator is created, so :func:`hpcgpu.simulation.nccl_channel_limit` sets it just
    around the creation and restores the environment afterwards (NCCL may still keep the
    value for later communicators of this process: another library's, e.g. PyTorch's,
    should be measured in its own process).

    Parameters
    ----------
    n_channels : int
        0 (default) keeps NCCL's choice; an ``NCCL_MAX_NCHANNELS`` already in the
        environment wins over it. No effect on CPUs, on one rank, or once the
        communicator exists.

    Returns
    -------
    bool
        True when the limit was applied to a new NCCL communicator.
    """
    if n_channels < 0:
        raise ValueError(f"NCCL channels: expected >= 0 (0 = NCCL's default), found {n_channels}")
    if (not n_channels or comm.size == 1 or not getattr(arch, "is_gpu", False)
            or "NCCL_MAX_NCHANNELS" in os.environ or job_transport(comm).nccl_communicator is not None):
        return False
    with nccl_channel_limit(n_channels):
        movers = collectives(comm, on_device=True)
    return movers.name == "nccl"


ALLREDUCE_KINDS = ("nccl", "peer")


def check_allreduce(comm, allreduce, is_gpu=None, zero_stage=0):
    """Raise ConfigurationError (the same verdict on every rank) unless ``allreduce`` can be used.

    ``is_gpu=None`` (backend not chosen yet) skips the GPU check. Only replicated values are
    read (options, ``comm.size``, ``comm.n_nodes``), so every rank raises the same message
    before any collective.
    """
    if allreduce not in ALLREDUCE_KINDS:
        raise ConfigurationError(f"--allreduce: expected one of {', '.join(ALLREDUCE_KINDS)}, found {allreduce!r}")
    if allreduce == "peer":
        check_peer_reduce(comm, is_gpu, zero_stage)


def make_sync(comm, arch, zero_stage=0, bucket_mb=DEFAULT_BUCKET_MB, nccl_channels=0, allreduce="nccl"):
    """The gradient synchroniser for ``zero_stage`` 0 (:class:`DataParallel`) or 1 (ZeRO-1).

    ``nccl_channels > 0`` builds the device collectives first, NCCL's communicator with that
    channel limit (see :func:`create_nccl_communicator`). ``allreduce="peer"`` selects the copy-engine
    bucket reduction of :mod:`apps.train.parallel.peer_reduce` (ZeRO 0, 2 GPUs of one node; no NCCL
    communicator is created for it).
    """
    check_allreduce(comm, allreduce, is_gpu=getattr(arch, "is_gpu", False), zero_stage=zero_stage)
    if allreduce == "nccl":
        create_nccl_communicator(comm, arch, nccl_channels)
    if zero_stage == 0:
        return DataParallel(comm, arch, bucket_mb, allreduce)
    if zero_stage == 1:
        return ZeroRedundancy(comm, arch)
    raise ValueError(f"zero stage: expected 0 or 1, found {zero_stage}")


def evaluate_distributed(trainer, state, x, y, comm, batch_size=1000):
    """Collective: mean loss and accuracy on ``(x, y)``, each rank evaluating one shard.

    Every rank holds the same ``x``/``y``; the result does not depend on the
    number of ranks except for the rounding of the loss sum.
    """
    from apps.train.training.trainer import evaluate

    n_samples = int(x.shape[0])
    lo, hi = shard_bounds(n_samples, comm.rank, comm.size)
    loss_sum, correct = 0.0, 0
    if hi > lo:
        loss, accuracy = evaluate(trainer, state, x[lo:hi], y[lo:hi], batch_size)
        loss_sum, correct = loss * (hi - lo), int(round(accuracy * (hi - lo)))
    loss_sum = comm.allreduce(float(loss_sum), op="sum")
    correct = comm.allreduce(int(correct), op="sum")
    return loss_sum / n_samples, correct / n_samples


def replicas_identical(comm, array):
    """Collective: True when ``array`` is bitwise identical on every rank (SHA-256 compared)."""
    import hashlib

    digest = hashlib.sha256(np.ascontiguousarray(to_numpy(array)).tobytes()).hexdigest()
    return len(set(comm.mpi.allgather(digest))) == 1
