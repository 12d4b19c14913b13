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
from .loss import count_correct, softmax_cross_entropy
from .pipeline_schedule import (SCHEDULES, bubble_fraction, gpipe_schedule, one_f_one_b_schedule,
                                partition_stages, schedule_for, simulate_schedule)

__all__ = ["SCHEDULES", "MpiPointToPoint", "PipelineEngine", "PipelineStepStats", "bubble_fraction",
           "gpipe_schedule", "one_f_one_b_schedule", "partition_stages", "restore_activations",
           "schedule_for", "simulate_schedule", "stash_activations"]


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

    def forward_only(self, x, y, compute_dtype, batch_size=1000):
        """Evaluation mode: every chunk of ``batch_size`` rows forward through the stages.

        Parameters
        ----------
        x : ndarray, shape (n_rows, ...)
            Rows to evaluate (read by the first stage only).
        y : ndarray of int, shape (n_rows,)
            Labels (read by the last stage only).

        Returns
        -------
        (float, int)
            Summed cross-entropy and number of correct predictions of the rows on the last stage;
            ``(0.0, 0)`` on the other stages.
        """
        n_rows = int(x.shape[0])
        loss_sum, correct = 0.0, 0
        ctx = ForwardContext(training=False)
        for chunk, start in enumerate(range(0, n_rows, batch_size)):
            stop = min(start + batch_size, n_rows)
            inputs = self._receive_input(stop - start, compute_dtype, chunk)
            if inputs is None:
                inputs = x[start:stop].astype(compute_dtype, copy=False)
            outputs = self.model.forward(inputs, ctx)
            if self.is_last:
                loss, _ = softmax_cross_entropy(outputs, y[start:stop], stop - start)
                loss_sum += float(loss) * (stop - start)
                correct += count_correct(outputs, y[start:stop])
            else:
                self._send_output(outputs, chunk)
            for layer in self.model.layers:
                layer.release()
        if self.n_stages > 1:
            self.p2p.wait_all()
        return loss_sum, correct

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
