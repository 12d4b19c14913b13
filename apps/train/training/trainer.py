"""Single-process training: an init function and a step function over a state.

Order of one optimiser step (:func:`train_step`)
------------------------------------------------
1. zero the compute gradient buffer;
2. for each of ``accum_steps`` contiguous micro-batches of this process's samples:
   forward, softmax cross-entropy divided by the GLOBAL batch size (times the
   loss scale), backward -- gradients accumulate in the flat buffer. Only the last
   micro-batch passes ``sync.on_grads_ready`` to backward, because only then are
   the gradients final;
3. ``sync.finish_gradients()`` -- the data-parallel layer waits for its bucket
   allreduces here (a no-op on one process);
4. convert to master gradients (unscale in mixed precision);
5. local sum of squares -> ``sync.allreduce_sum`` -> global norm; a non-finite norm
   means overflow: the loss scaler halves and the step is skipped;
6. optimiser update of the master weights with the clipping factor fused in, at
   the scheduled learning rate; refresh the fp16 compute copy.

The ``sync`` object is the seam for distribution: :class:`LocalSync` does nothing;
:class:`apps.train.parallel.distributed.DataParallel` launches bucket allreduces from
``on_grads_ready``; :class:`apps.train.parallel.zero.ZeroRedundancy` (ZeRO-1) reduce-scatters
the gradients, lets the optimiser step only the shard ``sync.owned_range(n)`` of
this rank and all-gathers the parameters in ``sync.gather_params``. The protocol:

=============================  ===================================================
``on_grads_ready(lo, hi)``     backward hook (or None): ``grads[lo:hi]`` are final
``before_backward()``          called just before the last micro-batch's backward
``finish_gradients(grads)``    gradients of the owned range are reduced after it
``owned_range(n_params)``      ``(lo, hi)`` stepped by this rank's optimiser
``sum_over_shards(value)``     sum of a per-shard float over the ranks that own shards
``gather_params(params)``      make the full parameter buffer current on every rank
``allreduce_sum(value)``       sum of a float over all ranks (the loss)
=============================  ===================================================
"""

import contextlib
from dataclasses import dataclass, field

import numpy as np

from apps.train.kernels.backend import array_module, to_numpy
from apps.train.data.dataset import shard_bounds
from apps.train.nn.layers import ForwardContext
from apps.train.nn.loss import count_correct, softmax_cross_entropy
from .optim import WarmupCosineSchedule, clip_factor, grad_sum_of_squares, make_optimizer
from apps.train.nn.params import init_flat_parameters
from .precision import make_precision, to_compute


@dataclass
class TrainConfig:
    """Hyper-parameters of a run (all plain values, so a TOML file maps onto it).

    ``global_batch_size`` counts samples over all ranks and micro-batches of one
    optimiser step. ``precision`` is ``"fp32"``, ``"fp64"`` (tests), ``"fp16"``
    (mixed precision with fp32 masters and loss scaling) or ``"bf16"`` (fp32 masters,
    no loss scaling). ``clip_norm=None`` disables clipping.
    ``total_steps=None`` keeps the learning rate constant after warm-up.
    """

    optimizer: str = "adamw"
    lr: float = 1e-2
    weight_decay: float = 0.0
    momentum: float = 0.9
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    total_steps: int = None
    min_lr: float = 0.0
    global_batch_size: int = 100
    accum_steps: int = 1
    clip_norm: float = None
    precision: str = "fp32"
    init_loss_scale: float = 2.0**16
    loss_scale_growth_interval: int = 2000
    seed: int = 0


@dataclass
class TrainState:
    """Everything that changes during training (checkpoint it with :func:`state_arrays`).

    Attributes
    ----------
    step : int
        Optimiser steps attempted so far (skipped overflow steps included).
    precision : FullPrecision, MixedPrecision or BFloat16Precision
        Owns the flat master/compute parameter and gradient buffers.
    optimizer_state : dict of str -> ndarray
    """

    step: int
    precision: object
    optimizer_state: dict


@dataclass
class StepMetrics:
    loss: float
    grad_norm: float
    lr: float
    applied: bool
    loss_scale: float


class LocalSync:
    """Gradient synchronisation for one process: every hook is a no-op."""

    on_grads_ready = None

    def bind(self, grads):
        """Remember the flat gradient buffer (nothing to do here); returns None."""

    def before_backward(self):
        """Backward of the last micro-batch starts (nothing to do); returns None."""

    def finish_gradients(self, grads):
        """Wait for outstanding gradient reductions (none here); returns None."""

    def owned_range(self, n_params):
        """The whole buffer is stepped by this process."""
        return 0, int(n_params)

    def sum_over_shards(self, value):
        return value

    def gather_params(self, params):
        """Nothing to gather; returns None."""

    def allreduce_sum(self, value):
        return value


def _phase(timers, name):
    """``timers.phase(name)`` or a no-op context when no timers are given."""
    return contextlib.nullcontext() if timers is None else timers.phase(name)


@dataclass
class Trainer:
    """A model plus the optimiser/schedule built from a :class:`TrainConfig`."""

    model: object
    config: TrainConfig
    optimizer: object = field(init=False)
    schedule: object = field(init=False)

    def __post_init__(self):
        config = self.config
        if config.accum_steps < 1:
            raise ValueError(f"accum_steps: expected >= 1, found {config.accum_steps}")
        self.optimizer = make_optimizer(config.optimizer, weight_decay=config.weight_decay,
                                        momentum=config.momentum, betas=config.betas,
                                        eps=config.eps)
        self.schedule = WarmupCosineSchedule(config.lr, config.warmup_steps,
                                             config.total_steps, config.min_lr)

    def schedule_plan(self) -> dict:
        """The learning-rate schedule as plain values (stored in checkpoints; ``total_steps`` None: constant)."""
        config = self.config
        return {"lr": float(config.lr), "warmup_steps": int(config.warmup_steps), "min_lr": float(config.min_lr),
                "total_steps": None if config.total_steps is None else int(config.total_steps)}

    def set_schedule(self, plan: dict) -> None:
        """Use the schedule ``plan`` (from :meth:`schedule_plan`, e.g. of a checkpoint); returns None.

        A restarted run continues the schedule its first run planned, whatever ``--steps`` it has.
        """
        config = self.config
        config.lr, config.warmup_steps = float(plan["lr"]), int(plan["warmup_steps"])
        config.min_lr = float(plan["min_lr"])
        config.total_steps = None if plan["total_steps"] is None else int(plan["total_steps"])
        self.schedule = WarmupCosineSchedule(config.lr, config.warmup_steps, config.total_steps, config.min_lr)


def init_train_state(trainer, xp=np, sync=None):
    """Fresh state: seeded parameters (same on every rank), zero optimiser state.

    Binds ``trainer.model`` to the compute buffers of the new state and ``sync``
    (if given) to its gradient buffer. The optimiser state covers
    ``sync.owned_range(n_params)`` -- the whole buffer except under ZeRO-1.
    """
    config = trainer.config
    sync = sync if sync is not None else LocalSync()
    master_dtype = "float64" if config.precision == "fp64" else "float32"
    master = xp.asarray(init_flat_parameters(trainer.model.layout, config.seed, master_dtype))
    precision = make_precision(config.precision, master, config.init_loss_scale,
                               config.loss_scale_growth_interval)
    trainer.model.bind(precision.compute_params, precision.compute_grads)
    sync.bind(precision.compute_grads)
    lo, hi = sync.owned_range(master.shape[0])
    optimizer_state = trainer.optimizer.init_state(hi - lo, xp, master_dtype)
    return TrainState(step=0, precision=precision, optimizer_state=optimizer_state)


def compute_gradients(trainer, state, x_local, y_local, sample_index_local, sync, timers=None):
    """Steps 1-3 of :func:`train_step`; returns this process's loss contribution.

    Parameters
    ----------
    x_local : ndarray, shape (local_batch, ...)
        This process's samples of the global batch (on the compute backend).
    y_local : ndarray of int, shape (local_batch,)
    sample_index_local : ndarray of int64, shape (local_batch,)
        Global positions of these samples (dropout masks depend on them).
    """
    config, model, precision = trainer.config, trainer.model, state.precision
    local_batch = int(x_local.shape[0])
    if local_batch < config.accum_steps:
        raise ValueError(
            f"this process has {local_batch} samples per step but accum_steps="
            f"{config.accum_steps}; every micro-batch needs at least one sample -- raise "
            "the global batch size or lower accum_steps"
        )
    compute_dtype = precision.compute_params.dtype
    loss_total = None
    with _phase(timers, "compute"):
        precision.compute_grads.fill(0)
        for micro in range(config.accum_steps):
            lo, hi = shard_bounds(local_batch, micro, config.accum_steps)
            ctx = ForwardContext(training=True, seed=config.seed, step=state.step,
                                 sample_index=sample_index_local[lo:hi])
            logits = model.forward(to_compute(x_local[lo:hi], compute_dtype), ctx)
            loss, grad_logits = softmax_cross_entropy(logits, y_local[lo:hi],
                                                      config.global_batch_size,
                                                      grad_scale=precision.loss_scale)
            # summed on the device: a float() here would stall a GPU pipeline before backward
            loss_total = loss if loss_total is None else loss_total + loss
            last = micro == config.accum_steps - 1
            if last:
                sync.before_backward()
            # only the last micro-batch's gradients are final: no communication before it
            # the data needs no gradient: the first Linear skips that GEMM
            model.backward(grad_logits, on_grads_ready=sync.on_grads_ready if last else None,
                           need_input_grad=False)
    with _phase(timers, "allreduce"):
        sync.finish_gradients(precision.compute_grads)
    return float(loss_total)


def apply_gradients(trainer, state, sync, timers=None):
    """Steps 4-6 of :func:`train_step`; returns (grad_norm, lr, applied).

    Only ``sync.owned_range`` of the buffers is converted and stepped (the whole
    buffer, except under ZeRO-1); ``sync.gather_params`` then makes the full
    master buffer current everywhere before the compute copy is refreshed.

    Mixed precision with an optimiser that has ``step_mixed`` (AdamW) takes the
    fused path: the sum of squares is taken over the float16 gradients themselves
    (times ``1 / scale**2``: with a power-of-two scale exactly the sum over the
    unscaled values; an inf/nan anywhere makes it non-finite, so the overflow
    decision comes BEFORE any update), then one pass unscales, steps the masters
    and writes the float16 copy.
    """
    config, precision = trainer.config, state.precision
    n_params = precision.master_params.shape[0]
    lo, hi = sync.owned_range(n_params)
    fused = precision.name == "mixed" and hasattr(trainer.optimizer, "step_mixed")
    # the scale that multiplied THIS step's gradients (update_scale may change it below)
    inverse_loss_scale = 1.0 / precision.loss_scale
    with _phase(timers, "compute"):
        if fused:
            local_sum_of_squares = (grad_sum_of_squares(precision.compute_grads[lo:hi])
                                    * inverse_loss_scale * inverse_loss_scale)
        else:
            precision.grads_to_master(lo, hi)
            local_sum_of_squares = grad_sum_of_squares(precision.master_grads[lo:hi])
    total_sum_of_squares = sync.sum_over_shards(local_sum_of_squares)
    factor, norm = clip_factor(total_sum_of_squares, config.clip_norm)
    found_nonfinite = not np.isfinite(norm)
    lr = trainer.schedule(state.step)
    applied = precision.update_scale(found_nonfinite)
    if applied:
        with _phase(timers, "compute"):
            if fused:
                trainer.optimizer.step_mixed(
                    precision.master_params[lo:hi], precision.compute_grads[lo:hi],
                    state.optimizer_state, lr, inverse_loss_scale,
                    precision.compute_params[lo:hi], grad_scale=factor)
            else:
                trainer.optimizer.step(precision.master_params[lo:hi],
                                       precision.master_grads[lo:hi],
                                       state.optimizer_state, lr, grad_scale=factor)
        with _phase(timers, "allreduce"):
            sync.gather_params(precision.master_params)
        if not fused or (lo, hi) != (0, n_params):
            # the fused step wrote the float16 copy of the owned range only
            with _phase(timers, "compute"):
                precision.refresh_compute_params()
    return norm, lr, applied


def train_step(trainer, state, x_local, y_local, sample_index_local, sync=None, timers=None):
    """One optimiser step on this process's share of a global batch.

    Mutates ``state`` in place (``state.step`` advances even when an overflow
    step is skipped) and returns :class:`StepMetrics` with the global mean loss.
    ``timers`` (a :class:`hpcgpu.app.timers.PhaseTimers`, optional) gets the
    phases ``compute`` and ``allreduce`` (the time spent *waiting* for gradients).
    """
    sync = sync if sync is not None else LocalSync()
    loss_contribution = compute_gradients(trainer, state, x_local, y_local,
                                          sample_index_local, sync, timers)
    loss_scale = state.precision.loss_scale
    norm, lr, applied = apply_gradients(trainer, state, sync, timers)
    state.step += 1
    loss = sync.allreduce_sum(loss_contribution)
    return StepMetrics(loss=loss, grad_norm=norm, lr=lr, applied=applied, loss_scale=loss_scale)


def evaluate(trainer, state, x, y, batch_size=1000):
    """Mean loss and accuracy of the current weights on ``(x, y)`` (eval mode).

    Returns
    -------
    (float, float)
        Mean cross-entropy and the fraction of correct predictions.
    """
    model = trainer.model
    compute_dtype = state.precision.compute_params.dtype
    n_samples = int(x.shape[0])
    loss_total, correct = 0.0, 0
    ctx = ForwardContext(training=False)
    for start in range(0, n_samples, batch_size):
        logits = model.forward(to_compute(x[start:start + batch_size], compute_dtype), ctx)
        loss, _ = softmax_cross_entropy(logits, y[start:start + batch_size], n_samples)
        loss_total += float(loss)
        correct += count_correct(logits, y[start:start + batch_size])
        for layer in model.layers:
            layer.release()
    return loss_total, correct / n_samples


def state_arrays(state):
    """Flatten a :class:`TrainState` into ``{name: host ndarray}`` for a checkpoint."""
    arrays = {"step": np.int64(state.step),
              "params": to_numpy(state.precision.master_params).copy()}
    for key, value in state.optimizer_state.items():
        arrays[f"optimizer/{key}"] = to_numpy(value).copy()
    for key, value in state.precision.state_dict().items():
        arrays[f"precision/{key}"] = np.asarray(value)
    return arrays


def load_state_arrays(state, arrays):
    """Restore a state written by :func:`state_arrays` into ``state`` in place."""
    precision = state.precision
    if arrays["params"].shape != precision.master_params.shape:
        raise ValueError(
            f"checkpoint has {arrays['params'].shape[0]} parameters, the model has "
            f"{precision.master_params.shape[0]}; it was written for a different model"
        )
    xp = array_module(precision.master_params)
    precision.master_params[...] = xp.asarray(arrays["params"])
    precision.refresh_compute_params()
    for key in state.optimizer_state:
        value = arrays[f"optimizer/{key}"]
        if key == "step":
            state.optimizer_state[key] = np.asarray(value, dtype=np.int64)
        else:
            state.optimizer_state[key][...] = xp.asarray(value)
    precision.load_state_dict({key[len("precision/"):]: value for key, value in arrays.items()
                               if key.startswith("precision/")})
    state.step = int(arrays["step"])
