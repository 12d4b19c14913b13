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

Messages go through a sender of :mod:`apps.train.parallel.pipeline_transport` (the job's transport: MPI on
CPUs, NCCL or MPI on GPUs).
A send is posted together with the next receive from the same neighbour (1F1B's steady state:
activation forward with the next gradient's receive, gradient backward with the next activation's
receive) and alone otherwise, so that senders whose sends complete only when the peer receives
(NCCL) cannot deadlock.

With equal stage times both leave each stage idle for a fraction (P - 1) / (M + P - 1) of the step
(:func:`bubble_fraction`; :func:`simulate_schedule` replays a schedule with given times). The
:class:`PipelineEngine` measures it too: idle time (waiting for a neighbour) over the step's wall time
(:class:`StageClock`: the host clock on CPUs, CUDA events on GPUs).

Both schedules run backwards in micro-batch order 0, 1, ..., M - 1, so the gradients accumulate in
the same order: GPipe and 1F1B give bitwise the same gradients. The loss of every micro-batch is
divided by the global batch size (:mod:`apps.train.nn.loss`), so the accumulated gradients equal the
full batch's (to rounding).

Activations of several micro-batches in flight: a layer keeps its saved tensors on itself (the
``_saved*`` attributes of the layer protocol, see :mod:`apps.train.nn.layers`). After each forward the
engine takes them (and a recomputing model's block inputs) into a per-micro-batch stash and puts
them back just before that micro-batch's backward (:func:`stash_activations`).
"""

import time
from dataclasses import dataclass

from hpcgpu.arch import is_device_array
from hpcgpu.errors import ConfigurationError

from apps.train.data.dataset import shard_bounds
from apps.train.nn.layers import ForwardContext
from apps.train.nn.loss import count_correct, softmax_cross_entropy
from .pipeline_schedule import (SCHEDULES, bubble_fraction, gpipe_schedule, one_f_one_b_schedule,
                                partition_stages, schedule_for, simulate_schedule)
from .pipeline_transport import ActivationShapes, PointToPoint
from apps.train.training.precision import to_compute

__all__ = ["SCHEDULES", "PipelineEngine", "PointToPoint", "PipelineStepStats", "bubble_fraction",
           "gpipe_schedule", "one_f_one_b_schedule", "partition_stages", "restore_activations",
           "schedule_for", "simulate_schedule", "stash_activations"]


def stash_activations(model):
    """Take every ``_saved*`` attribute of ``model``'s leaves (and its recompute state) off them.

    Returns
    -------
    list of (object, dict)
        Pass it to :func:`restore_activations` before that micro-batch's backward.
    """
    stash = [(leaf, leaf.saved_state()) for leaf in model.leaves()]
    stash.append((model, {key: value for key, value in vars(model).items() if key in ("_block_inputs", "_ctx")}))
    return stash


def restore_activations(stash):
    """Put a :func:`stash_activations` result back on its layers; returns None."""
    for owner, saved in stash:
        for key, value in saved.items():
            setattr(owner, key, value)


class StageClock:
    """Wall and busy (compute) time of one stage's step: the measured bubble is the rest.

    On CPUs the host clock. On GPUs the host only queues kernels (and NCCL's receives wait on the
    device), so the times come from CUDA events recorded on the current stream around each
    forward and backward and at the start and end of the step; :meth:`finish` waits for the last
    one (one host synchronisation per step).
    """

    def __init__(self, on_device):
        self.on_device = on_device
        self.intervals = []
        self.busy = 0.0
        self.started = self.mark()

    def mark(self):
        """A time stamp: ``time.perf_counter()`` or a recorded ``cupy.cuda.Event``."""
        if not self.on_device:
            return time.perf_counter()
        import cupy

        event = cupy.cuda.Event()
        event.record()
        return event

    def add_busy(self, begun):
        """Count the time since ``begun`` (a :meth:`mark`) as compute; returns None."""
        if self.on_device:
            self.intervals.append((begun, self.mark()))
        else:
            self.busy += time.perf_counter() - begun

    def finish(self):
        """``(wall, busy)`` seconds of the step."""
        if not self.on_device:
            return time.perf_counter() - self.started, self.busy
        import cupy

        ended = self.mark()
        ended.synchronize()
        busy = sum(cupy.cuda.get_elapsed_time(a, b) for a, b in self.intervals) / 1e3
        return cupy.cuda.get_elapsed_time(self.started, ended) / 1e3, busy


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
    point_to_point : PointToPoint
        The pipeline sender (:mod:`apps.train.parallel.pipeline_transport`); unused when
        ``n_stages == 1``.
    control : hpcgpu.Communicator
        The pipeline communicator, for the one-time message of the activation shape
        (:class:`~apps.train.parallel.pipeline_transport.ActivationShapes`, host MPI: the control plane; the
        data itself goes through ``point_to_point``).

    Attributes
    ----------
    shapes : ActivationShapes or None
        Sends and receives that shape (None without ``control``).
    """

    def __init__(self, model, stage, n_stages, n_micro, schedule, point_to_point, control):
        self.model, self.stage, self.n_stages, self.n_micro = model, stage, n_stages, n_micro
        self.schedule = schedule
        self.operations = schedule_for(schedule, n_stages, n_micro, stage)
        self.p2p, self.control = point_to_point, control
        self.shapes = ActivationShapes(control) if control is not None else None
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
        stash, loss_total, in_flight, peak = {}, 0.0, 0, 0
        clock = StageClock(is_device_array(x))
        last_operation = self.operations[-1]
        pending = None   # this stage's last send, posted with the next receive from its peer
        for kind, micro in self.operations:
            lo, hi = bounds[micro]
            if kind == "F":
                inputs = None
                if not self.is_first:
                    inputs = self._post(pending, self._input_message(hi - lo, compute_dtype, micro))
                elif pending is not None:
                    self._post(pending)
                pending = None
                if inputs is None:
                    inputs = to_compute(x[lo:hi], compute_dtype)
                begun = clock.mark()
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
                clock.add_busy(begun)
                if not self.is_last:
                    pending = self._output_message(outputs, micro)
                in_flight += 1
                peak = max(peak, in_flight)
            else:
                saved, payload = stash.pop(micro)
                if self.is_last:
                    grad = payload
                    if pending is not None:
                        self._post(pending)
                else:
                    grad = self._post(pending, (payload, compute_dtype, self.stage + 1, 2 * micro + 1))
                pending = None
                begun = clock.mark()
                restore_activations(saved)
                final = (kind, micro) == last_operation and sync is not None
                if final:
                    sync.before_backward()
                grad_input = self.model.backward(
                    grad, on_grads_ready=sync.on_grads_ready if final else None,
                    need_input_grad=not self.is_first)
                clock.add_busy(begun)
                if not self.is_first:
                    pending = (grad_input, self.stage - 1, 2 * micro + 1)
                in_flight -= 1
        if pending is not None:
            self._post(pending)
        if self.n_stages > 1:
            self.p2p.wait_all()
        wall, busy = clock.finish()
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
        pending = None
        for chunk, start in enumerate(range(0, n_rows, batch_size)):
            stop = min(start + batch_size, n_rows)
            inputs = None
            if not self.is_first:
                inputs = self._post(pending, self._input_message(stop - start, compute_dtype, chunk))
            elif pending is not None:
                self._post(pending)
            pending = None
            if inputs is None:
                inputs = to_compute(x[start:stop], compute_dtype)
            outputs = self.model.forward(inputs, ctx)
            if self.is_last:
                loss, _ = softmax_cross_entropy(outputs, y[start:stop], stop - start)
                loss_sum += float(loss) * (stop - start)
                correct += count_correct(outputs, y[start:stop])
            else:
                pending = self._output_message(outputs, chunk)
            for layer in self.model.layers:
                layer.release()
        if pending is not None:
            self._post(pending)
        if self.n_stages > 1:
            self.p2p.wait_all()
        return loss_sum, correct

    def _post(self, send, receive=None):
        """Post ``send`` (or None) and ``receive`` (or None); returns the received array or None.

        A send and a receive with the same peer go in ONE exchange (one NCCL group): NCCL sends
        complete only when the peer posts its receive, and in the 1F1B steady state both
        neighbours send to each other before receiving (see :mod:`apps.train.parallel.pipeline_transport`).
        Otherwise the send is posted first, alone, so the next stage is not kept waiting.
        """
        if send is not None and receive is not None and send[1] == receive[2]:
            return self.p2p.exchange(send=send, receive=receive)
        if send is not None:
            self.p2p.exchange(send=send)
        return None if receive is None else self.p2p.exchange(receive=receive)

    def _input_message(self, rows, dtype, micro):
        """The receive ``(shape, dtype, source, tag)`` of ``micro``'s activation (not first stage)."""
        if self._input_trailing_shape is None:
            # once per run: the previous stage says what one sample's activation looks like
            self._input_trailing_shape = self.shapes.receive(self.stage - 1)
        return (rows,) + self._input_trailing_shape, dtype, self.stage - 1, 2 * micro

    def _output_message(self, outputs, micro):
        """The send ``(array, dest, tag)`` of ``micro``'s activation (not last stage)."""
        if not self._shape_sent:
            self.shapes.send(tuple(outputs.shape[1:]), self.stage + 1)
            self._shape_sent = True
        return outputs, self.stage + 1, 2 * micro
