"""Pipeline parallelism: contiguous stages, micro-batches, GPipe and 1F1B schedules.

The layer list is cut into P contiguous stages (:func:`partition_stages`, balanced by parameter
count or at given boundaries); stage ``s`` runs on pipeline rank ``s``. A rank's batch is cut into M
micro-batches; activations go forward and their gradients backward between neighbouring stages,
point to point. Each stage runs its list of operations -- ``("F", m)`` forward or ``("B", m)``
backward of micro-batch ``m`` -- in the order of a schedule:

* GPipe (Huang et al. 2019): all M forwards, then all M backwards. Up to M micro-batches of
  activations are held at once;
* 1F1B (PipeDream-flush, Narayanan et al. 2021; Megatron's default): stage ``s`` runs
  ``min(P - s - 1, M)`` warm-up forwards, then alternates one forward and one backward, then drains
  the remaining backwards. Same bubble, but at most ``P - s`` micro-batches held.

With equal stage times both leave each stage idle for a fraction (P - 1) / (M + P - 1) of the step
(:func:`bubble_fraction`; :func:`simulate_schedule` replays a schedule with given times). The
:class:`PipelineEngine` measures it too: idle time (waiting for a neighbour) over the step's wall time.

Both schedules run backwards in micro-batch order 0, 1, ..., M - 1, so the gradients accumulate in
the same order: GPipe and 1F1B give bitwise the same gradients. The loss of every micro-batch is
divided by the global batch size (:mod:`apps.train.loss`), so the accumulated gradients equal the
full batch's (to rounding).

Activations of several micro-batches in flight: a layer keeps its saved tensors on itself (the
``_saved*`` attributes of the layer protocol, see :mod:`apps.train.layers`). After each forward the
engine takes them (and a recomputing model's block inputs) into a per-micro-batch stash and puts
them back just before that micro-batch's backward (:func:`stash_activations`).
"""

import time
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

from .data import shard_bounds
from .layers import ForwardContext
from .loss import softmax_cross_entropy

SCHEDULES = ("1f1b", "gpipe")


def gpipe_schedule(n_stages, n_micro, stage):
    """GPipe: ``[("F", 0) ... ("F", M-1), ("B", 0) ... ("B", M-1)]`` for every stage."""
    return [("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]


def one_f_one_b_schedule(n_stages, n_micro, stage):
    """1F1B for ``stage`` of ``n_stages``: warm-up forwards, one-forward-one-backward, drain."""
    warmup = min(n_stages - stage - 1, n_micro)
    operations = [("F", m) for m in range(warmup)]
    for index in range(n_micro - warmup):
        operations += [("F", warmup + index), ("B", index)]
    operations += [("B", m) for m in range(n_micro - warmup, n_micro)]
    return operations


def schedule_for(name, n_stages, n_micro, stage):
    """The operation list of ``stage`` under schedule ``name`` (``"1f1b"`` or ``"gpipe"``)."""
    if name not in SCHEDULES:
        raise ConfigurationError(f"pipeline schedule: expected one of {SCHEDULES}, found {name!r}")
    if n_micro < 1 or n_stages < 1 or not 0 <= stage < n_stages:
        raise ConfigurationError(
            f"pipeline schedule: expected micro-batches >= 1 and 0 <= stage < stages, found "
            f"{n_micro} micro-batches, stage {stage} of {n_stages}")
    make = one_f_one_b_schedule if name == "1f1b" else gpipe_schedule
    return make(n_stages, n_micro, stage)


def bubble_fraction(n_stages, n_micro):
    """Idle fraction of each stage with equal stage times: (P - 1) / (M + P - 1)."""
    return (n_stages - 1) / (n_micro + n_stages - 1)


def simulate_schedule(name, n_stages, n_micro, forward_seconds=1.0, backward_seconds=2.0):
    """Replay a schedule with fixed per-operation times and free communication.

    An operation starts when its stage is free and its input exists: ``F(s, m)`` after
    ``F(s-1, m)``, ``B(s, m)`` after ``B(s+1, m)`` (and after ``F(s, m)``, earlier on the stage).

    Returns
    -------
    dict
        ``makespan`` (seconds), ``idle_fraction`` (list over stages), ``peak_in_flight``
        (most micro-batches whose forward ran and backward did not, per stage).

    Raises
    ------
    RuntimeError
        When the schedule deadlocks (no stage can make progress).
    """
    operations = [schedule_for(name, n_stages, n_micro, stage) for stage in range(n_stages)]
    done, position = {}, [0] * n_stages
    free_at = [0.0] * n_stages
    in_flight, peak = [0] * n_stages, [0] * n_stages
    while any(position[s] < len(operations[s]) for s in range(n_stages)):
        progressed = False
        for stage in range(n_stages):
            if position[stage] == len(operations[stage]):
                continue
            kind, micro = operations[stage][position[stage]]
            needed = ((kind, stage - 1, micro) if kind == "F" and stage > 0 else
                      (kind, stage + 1, micro) if kind == "B" and stage < n_stages - 1 else None)
            if needed is not None and needed not in done:
                continue
            start = max(free_at[stage], done.get(needed, 0.0))
            free_at[stage] = start + (forward_seconds if kind == "F" else backward_seconds)
            done[(kind, stage, micro)] = free_at[stage]
            in_flight[stage] += 1 if kind == "F" else -1
            peak[stage] = max(peak[stage], in_flight[stage])
            position[stage] += 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name!r} deadlocks at positions {position}")
    makespan = max(free_at)
    busy = n_micro * (forward_seconds + backward_seconds)
    return {"makespan": makespan, "idle_fraction": [1.0 - busy / makespan] * n_stages,
            "peak_in_flight": peak}


def partition_stages(param_counts, n_stages, boundaries=None):
    """Cut ``len(param_counts)`` layers into ``n_stages`` contiguous, non-empty stages.

    Parameters
    ----------
    param_counts : list of int
        Parameters of each top-level layer.
    n_stages : int
    boundaries : list of int, optional
        The first layer of stages 1 .. P-1 (increasing). Default: the cut that minimises the
        largest stage's parameter count (ties: the earliest cut).

    Returns
    -------
    list of (int, int)
        ``(start, stop)`` layer ranges of the stages.
    """
    n_layers = len(param_counts)
    if not 1 <= n_stages <= n_layers:
        raise ConfigurationError(
            f"pipeline: {n_stages} stages need between 1 and {n_layers} (the number of layers); "
            "lower --pipeline-parallel or deepen the model")
    if boundaries is not None:
        cuts = [0] + [int(b) for b in boundaries] + [n_layers]
        if len(cuts) != n_stages + 1 or any(b >= c for b, c in zip(cuts, cuts[1:])):
            raise ConfigurationError(
                f"pipeline: stage boundaries {list(boundaries)} must be {n_stages - 1} increasing "
                f"layer indices in 1 .. {n_layers - 1}")
        return list(zip(cuts, cuts[1:]))
    prefix = np.concatenate([[0], np.cumsum(param_counts)])
    # best[s][i]: smallest possible largest stage when layers [0, i) form s stages
    best = np.full((n_stages + 1, n_layers + 1), np.inf)
    cut = np.zeros((n_stages + 1, n_layers + 1), dtype=int)
    best[0][0] = 0
    for stages in range(1, n_stages + 1):
        for stop in range(stages, n_layers + 1):
            for start in range(stages - 1, stop):
                value = max(best[stages - 1][start], prefix[stop] - prefix[start])
                if value < best[stages][stop]:
                    best[stages][stop], cut[stages][stop] = value, start
    ranges, stop = [], n_layers
    for stages in range(n_stages, 0, -1):
        ranges.append((int(cut[stages][stop]), stop))
        stop = int(cut[stages][stop])
    return ranges[::-1]


class MpiPointToPoint:
    """Activations and gradients between pipeline stages over MPI (NumPy buffers).

    The pluggable interface (a NCCL version provides the same three methods): ``send`` is
    non-blocking and keeps the array alive until :meth:`wait_all`; ``recv`` blocks. Paired calls
    match by ``(peer, tag)``; the engine uses tag ``2 m`` forward and ``2 m + 1`` backward.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The pipeline sub-communicator (rank = stage).
    """

    def __init__(self, comm):
        self.comm = comm
        self._pending = []

    def send(self, array, dest, tag):
        """Start sending ``array`` (C-contiguous copy if needed) to ``dest``; returns None."""
        buffer = np.ascontiguousarray(array)
        self._pending.append((self.comm.mpi.Isend(buffer, dest=dest, tag=tag), buffer))

    def recv(self, shape, dtype, source, tag):
        """Receive an array of ``shape`` and ``dtype`` from ``source`` (blocking)."""
        buffer = np.empty(shape, dtype=dtype)
        self.comm.mpi.Recv(buffer, source=source, tag=tag)
        return buffer

    def wait_all(self):
        """Complete every send started; returns None."""
        for request, _ in self._pending:
            request.Wait()
        self._pending = []


def stash_activations(model):
    """Take every ``_saved*`` attribute of ``model``'s leaves (and its recompute state) off them.

    Returns
    -------
    list of (object, dict)
        Pass it to :func:`restore_activations` before that micro-batch's backward.
    """
    owners = list(model.leaves()) + [model]
    stash = []
    for owner in owners:
        saved = {key: value for key, value in vars(owner).items()
                 if key.startswith("_saved") or key in ("_block_inputs", "_ctx")}
        stash.append((owner, saved))
    return stash


def restore_activations(stash):
    """Put a :func:`stash_activations` result back on its layers; returns None."""
    for owner, saved in stash:
        for key, value in saved.items():
            setattr(owner, key, value)


@dataclass
class PipelineStepStats:
    """Timing of one pipeline step on one stage (seconds).

    ``idle_fraction = idle / wall``: the measured bubble (plus any load imbalance and, on an
    oversubscribed CPU, time the neighbour's process was not scheduled).
    """

    wall: float
    busy: float
    idle: float
    peak_in_flight: int

    @property
    def idle_fraction(self):
        return self.idle / self.wall if self.wall > 0 else 0.0


class PipelineEngine:
    """Runs one stage's schedule for one optimiser step's gradients.

    Parameters
    ----------
    model : Sequential
        This stage's layers.
    stage, n_stages : int
        Pipeline rank and P.
    n_micro : int
        Micro-batches M per step.
    schedule : {"1f1b", "gpipe"}
    point_to_point : MpiPointToPoint or compatible
        Unused when ``n_stages == 1``.
    control : hpcgpu.Communicator
        The pipeline communicator, for the one-time exchange of activation shapes (MPI is the
        control plane; the data itself goes through ``point_to_point``).
    """

    SHAPE_TAG = 32000

    def __init__(self, model, stage, n_stages, n_micro, schedule, point_to_point, control):
        self.model, self.stage, self.n_stages, self.n_micro = model, stage, n_stages, n_micro
        self.schedule = schedule
        self.operations = schedule_for(schedule, n_stages, n_micro, stage)
        self.p2p, self.control = point_to_point, control
        self._input_trailing_shape = None
        self._shape_sent = False

    @property
    def is_first(self):
        return self.stage == 0

    @property
    def is_last(self):
        return self.stage == self.n_stages - 1

    def compute_gradients(self, x, y, sample_index, seed, step, global_batch_size, compute_dtype,
                          loss_scale=1.0, sync=None):
        """Run the schedule; parameter gradients ACCUMULATE into the model's gradient buffer.

        Parameters
        ----------
        x : ndarray, shape (local_batch, ...)
            This data replica's samples (read by the first stage only).
        y : ndarray of int, shape (local_batch,)
            Labels (read by the last stage only).
        sample_index : ndarray of int64, shape (local_batch,)
            Global sample positions (dropout masks).
        global_batch_size : int
            Samples of the whole optimiser step over all data replicas: the loss divisor.
        sync : object, optional
            The trainer's sync; its ``before_backward`` / ``on_grads_ready`` hooks are given to
            the LAST backward only (the data-parallel buckets start there).

        Returns
        -------
        (float, PipelineStepStats)
            The summed loss contribution (0 except on the last stage) and the timing.
        """
        local_batch = int(x.shape[0])
        if local_batch < self.n_micro:
            raise ConfigurationError(
                f"pipeline: {local_batch} samples per data replica cannot fill {self.n_micro} "
                "micro-batches; raise the global batch size or lower --micro-batches")
        bounds = [shard_bounds(local_batch, micro, self.n_micro) for micro in range(self.n_micro)]
        stash, loss_total, busy, in_flight, peak = {}, 0.0, 0.0, 0, 0
        started = time.perf_counter()
        last_operation = self.operations[-1]
        for kind, micro in self.operations:
            lo, hi = bounds[micro]
            if kind == "F":
                inputs = self._receive_input(hi - lo, compute_dtype, micro)
                if inputs is None:
                    inputs = x[lo:hi].astype(compute_dtype, copy=False)
                begun = time.perf_counter()
                ctx = ForwardContext(training=True, seed=seed, step=step,
                                     sample_index=sample_index[lo:hi])
                outputs = self.model.forward(inputs, ctx)
                if self.is_last:
                    loss, payload = softmax_cross_entropy(outputs, y[lo:hi], global_batch_size,
                                                          grad_scale=loss_scale)
                    loss_total += float(loss)
                else:
                    payload = outputs.shape
                stash[micro] = (stash_activations(self.model), payload)
                busy += time.perf_counter() - begun
                if not self.is_last:
                    self._send_output(outputs, micro)
                in_flight += 1
                peak = max(peak, in_flight)
            else:
                saved, payload = stash.pop(micro)
                grad = payload if self.is_last else self.p2p.recv(
                    payload, compute_dtype, self.stage + 1, 2 * micro + 1)
                begun = time.perf_counter()
                restore_activations(saved)
                final = (kind, micro) == last_operation and sync is not None
                if final:
                    sync.before_backward()
                grad_input = self.model.backward(
                    grad, on_grads_ready=sync.on_grads_ready if final else None,
                    need_input_grad=not self.is_first)
                busy += time.perf_counter() - begun
                if not self.is_first:
                    self.p2p.send(grad_input, self.stage - 1, 2 * micro + 1)
                in_flight -= 1
        if self.n_stages > 1:
            self.p2p.wait_all()
        wall = time.perf_counter() - started
        return loss_total, PipelineStepStats(wall, busy, max(0.0, wall - busy), peak)

    def _receive_input(self, rows, dtype, micro):
        """The activation of ``micro`` from the previous stage (None on the first stage)."""
        if self.is_first:
            return None
        if self._input_trailing_shape is None:
            # once per run: the previous stage says what one sample's activation looks like
            self._input_trailing_shape = tuple(self.control.mpi.recv(source=self.stage - 1,
                                                                     tag=self.SHAPE_TAG))
        return self.p2p.recv((rows,) + self._input_trailing_shape, dtype, self.stage - 1,
                             2 * micro)

    def _send_output(self, outputs, micro):
        if not self._shape_sent:
            self.control.mpi.send(tuple(outputs.shape[1:]), dest=self.stage + 1, tag=self.SHAPE_TAG)
            self._shape_sent = True
        self.p2p.send(outputs, self.stage + 1, 2 * micro)
