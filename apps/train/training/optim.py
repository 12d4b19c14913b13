"""Optimisers over flat buffers, the learning-rate schedule and gradient clipping.

Optimisers are stateless objects holding hyper-parameters; their state is a plain
``dict`` of named arrays, so it is checkpointable as is (HDF5 datasets) and can be
*sharded*: ``step`` works on any contiguous slice of the flat buffers, which is
all ZeRO-1 needs -- each rank calls::

    optimizer.step(params[lo:hi], grads[lo:hi], state_shard, lr=lr)

with ``state_shard = optimizer.init_state(hi - lo, xp)`` and then all-gathers the
parameters. The update is elementwise, so the shards' results equal the unsharded
update bit for bit.

Gradient clipping by the global norm is split in two so that the caller can sum
across ranks/shards in between::

    local = grad_sum_of_squares(grads_shard)   # a Python float
    total = comm.allreduce(local)              # the Communicator's host sum; identity on one process
    factor, norm = clip_factor(total, max_norm)
    optimizer.step(..., grad_scale=factor)   # the factor is fused into the update
"""

import math

import numpy as np

from apps.train.kernels.buffers import sum_of_squares
from apps.train.kernels.optimizer_updates import adamw_update, adamw_update_mixed, sgd_update


class SGD:
    """SGD with (optionally Nesterov) momentum and L2 weight decay.

    Update rule: see :func:`apps.train.kernels.optimizer_updates.sgd_update`.
    State: ``{"momentum_buffer": (n,)}``.
    """

    name = "sgd"

    def __init__(self, momentum=0.9, weight_decay=0.0, nesterov=False):
        if not 0.0 <= momentum < 1.0 or weight_decay < 0.0:
            raise ValueError(
                f"SGD: expected 0 <= momentum < 1 and weight_decay >= 0, found "
                f"momentum={momentum}, weight_decay={weight_decay}"
            )
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)

    def init_state(self, n_elements, xp=np, dtype="float32"):
        """Zero state for ``n_elements`` parameters (a whole buffer or one shard)."""
        return {"momentum_buffer": xp.zeros(int(n_elements), dtype=dtype)}

    def step(self, params, grads, state, lr, grad_scale=1.0):
        """Update ``params`` in place from ``grads * grad_scale``; returns None."""
        sgd_update(params, grads, state["momentum_buffer"], lr=lr, momentum=self.momentum,
                   weight_decay=self.weight_decay, nesterov=self.nesterov,
                   grad_scale=grad_scale)


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019).

    Update rule: see :func:`apps.train.kernels.optimizer_updates.adamw_update`.
    State: ``{"exp_avg": (n,), "exp_avg_sq": (n,), "step": int64 0-d host array}``.
    Weight decay applies to every element of the buffer (one parameter group).
    """

    name = "adamw"

    def __init__(self, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0 and eps > 0.0 and weight_decay >= 0.0):
            raise ValueError(
                f"AdamW: expected 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, found "
                f"beta1={beta1}, beta2={beta2}, eps={eps}, weight_decay={weight_decay}"
            )
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)

    def init_state(self, n_elements, xp=np, dtype="float32"):
        """Zero state for ``n_elements`` parameters (a whole buffer or one shard)."""
        return {
            "exp_avg": xp.zeros(int(n_elements), dtype=dtype),
            "exp_avg_sq": xp.zeros(int(n_elements), dtype=dtype),
            # host counter: every shard holds the same value, no device sync needed
            "step": np.zeros((), dtype=np.int64),
        }

    def step(self, params, grads, state, lr, grad_scale=1.0):
        """Update ``params`` in place from ``grads * grad_scale``; returns None."""
        state["step"] = np.asarray(int(state["step"]) + 1, dtype=np.int64)
        adamw_update(params, grads, state["exp_avg"], state["exp_avg_sq"], lr=lr,
                     beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                     weight_decay=self.weight_decay, step=int(state["step"]),
                     grad_scale=grad_scale)

    def step_mixed(self, master_params, compute_grads, state, lr, inverse_loss_scale,
                   compute_params, grad_scale=1.0):
        """Mixed precision in one pass: unscale the float16 ``compute_grads``, update the
        float32 ``master_params`` and write their float16 copy into ``compute_params``
        (see :func:`apps.train.kernels.optimizer_updates.adamw_update_mixed`); returns None."""
        state["step"] = np.asarray(int(state["step"]) + 1, dtype=np.int64)
        adamw_update_mixed(master_params, compute_grads, state["exp_avg"], state["exp_avg_sq"],
                           compute_params, lr=lr, beta1=self.beta1, beta2=self.beta2,
                           eps=self.eps, weight_decay=self.weight_decay,
                           step=int(state["step"]), inverse_loss_scale=inverse_loss_scale,
                           grad_scale=grad_scale)


def make_optimizer(name, weight_decay=0.0, momentum=0.9, betas=(0.9, 0.999), eps=1e-8,
                   nesterov=False):
    """Build an optimiser by name (``"sgd"`` or ``"adamw"``)."""
    if name == "sgd":
        return SGD(momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if name == "adamw":
        return AdamW(beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
    raise ValueError(f"optimizer: expected 'sgd' or 'adamw', found {name!r}")


class WarmupCosineSchedule:
    """Linear warm-up followed by cosine decay.

    For 0-based optimiser step ``s``::

        lr(s) = base_lr * (s + 1) / warmup_steps                      s < warmup_steps
        lr(s) = min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2     otherwise,
                p = min(1, (s - warmup_steps) / max(1, total_steps - warmup_steps))

    ``warmup_steps = 0`` starts directly at ``base_lr``; after ``total_steps`` the
    rate stays at ``min_lr``. ``total_steps = None`` gives a constant rate after
    warm-up.
    """

    def __init__(self, base_lr, warmup_steps=0, total_steps=None, min_lr=0.0):
        if base_lr <= 0.0 or warmup_steps < 0 or min_lr < 0.0:
            raise ValueError(
                f"schedule: expected base_lr > 0, warmup_steps >= 0, min_lr >= 0, found "
                f"base_lr={base_lr}, warmup_steps={warmup_steps}, min_lr={min_lr}"
            )
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = None if total_steps is None else int(total_steps)
        self.min_lr = float(min_lr)

    def __call__(self, step):
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return self.base_lr
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def grad_sum_of_squares(grads):
    """Local sum of squares of a flat gradient buffer (or shard), as a Python float.

    See :func:`apps.train.kernels.buffers.sum_of_squares` (CPU: accumulated in the
    buffer dtype, float16 upcast to float32; GPU: a bandwidth-bound two-stage
    reduction in float64). Reading the result synchronises a GPU. Sum it over
    ranks before :func:`clip_factor`.
    """
    if grads.dtype.kind != "f":
        raise TypeError(f"grad_sum_of_squares: expected a float buffer, found {grads.dtype}")
    return sum_of_squares(grads.reshape(-1))


def clip_factor(total_sum_of_squares, max_norm):
    """Scale factor that brings the global gradient norm down to ``max_norm``.

    Returns ``(factor, norm)`` with ``norm = sqrt(total_sum_of_squares)`` and
    ``factor = min(1, max_norm / (norm + 1e-6))`` (as ``torch.nn.utils.clip_grad_norm_``).
    ``max_norm = None`` disables clipping (factor 1). A non-finite norm gives
    factor 1 -- the loss scaler skips such a step.
    """
    norm = math.sqrt(total_sum_of_squares) if total_sum_of_squares >= 0 else float("nan")
    if max_norm is None or not math.isfinite(norm):
        return 1.0, norm
    return min(1.0, float(max_norm) / (norm + 1e-6)), norm
