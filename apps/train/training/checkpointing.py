"""Training checkpoints through :class:`hpcgpu.checkpoint.CheckpointManager`.

Everything a bitwise-identical continuation needs is *replicated* state (the same
on every rank), stored under ``/replicated`` of the checkpoint's master file:

==================  ==========================================================
``params``          fp32 (or fp64) master weights, shape (n_params,)
``optimizer/*``     the optimiser state over the WHOLE buffer -- under ZeRO-1 the
                    shards are all-gathered first, so a checkpoint can be
                    restarted with any rank count and either ZeRO stage
``precision/*``     dynamic loss scaler (scale, good steps, skipped steps)
``data``            global batch size, seed, step, epoch, batch in epoch: the
                    data position (the global order is a function of seed and
                    epoch only, see :mod:`apps.train.data.loader`)
``rng``             the seeds: dropout masks are a hash of (seed, step, sample),
                    the shuffle of (seed, epoch) -- no generator state to save
``history``         loss curve and evaluations so far (the restarted run's
                    summary and plot cover the whole run)
``model``           model name and parameter count (checked on restart)
``schedule``        the learning-rate schedule planned by the first run (peak
                    lr, warm-up, cosine end ``total_steps``, min lr): a restart
                    continues it, whatever its ``--steps`` (see
                    :func:`check_schedule`)
==================  ==========================================================

The fp16 compute copy is not stored: it is the cast of the masters.
"""

import numpy as np

from hpcgpu.errors import ConfigurationError

from apps.train.kernels.backend import array_module, to_numpy


def training_checkpoint_payload(trainer, state, sync, history, model_name) -> dict:
    """Collective (ZeRO gathers the optimiser state): ``{"replicated": ..., "metadata": ...}`` of ``state``.

    The shape :class:`hpcgpu.app.checkpointing.RunControl` saves; every value is identical on every rank.
    """
    config = trainer.config
    replicated = {
        "params": to_numpy(state.precision.master_params).copy(),
        "optimizer": sync.full_optimizer_state(state.optimizer_state),
        "precision": {key.replace("/", "."): np.asarray(value)[()]
                      for key, value in state.precision.state_dict().items()},
        "data": {"global_batch_size": int(config.global_batch_size), "seed": int(config.seed),
                 "step": int(state.step)},
        "rng": {"seed": int(config.seed),
                "scheme": "dropout = hash(seed, step, sample); shuffle = permutation(seed, epoch)"},
        "history": {key: [float(v) for v in values] for key, values in history.items()},
        "model": {"name": model_name, "n_params": int(trainer.model.n_params)},
        "schedule": trainer.schedule_plan(),
    }
    metadata = {"model": model_name, "precision": config.precision,
                "global_batch_size": int(config.global_batch_size),
                "zero_stage": int(getattr(sync, "zero_stage", 0))}
    return {"replicated": replicated, "metadata": metadata}


def save_training_checkpoint(manager, trainer, state, sync, history, model_name):
    """Collective: write a checkpoint of ``state`` at ``state.step``.

    Returns the :class:`hpcgpu.checkpoint.CheckpointInfo` (None while an
    asynchronous write is in flight).
    """
    payload = training_checkpoint_payload(trainer, state, sync, history, model_name)
    return manager.save(state.step, replicated=payload["replicated"], metadata=payload["metadata"])


def check_data_position(path, data: dict, config) -> None:
    """Raise ConfigurationError unless the checkpoint's ``data`` (its replicated ``"data"`` entry) was
    written with this run's global batch size and seed, on which the data position depends."""
    if int(data["global_batch_size"]) != config.global_batch_size or int(data["seed"]) != config.seed:
        raise ConfigurationError(
            f"{path}: written with --batch-size {data['global_batch_size']} and --seed "
            f"{data['seed']}, this run has {config.global_batch_size} and {config.seed}; the data "
            "position depends on both, restart with the same values")


def apply_saved_schedule(path, saved: dict, trainer, steps, reschedule: bool, note_fn=None) -> None:
    """Give ``trainer`` the learning-rate schedule stored in the checkpoint's replicated state ``saved``
    (:func:`check_schedule`; nothing for checkpoints written before schedules were stored, or without
    ``steps``); ``note_fn(text)`` is told when it differs from this run's options."""
    if "schedule" in saved and steps is not None:
        plan, note = check_schedule(path, dict(saved["schedule"]), trainer.schedule_plan(), int(steps), reschedule)
        trainer.set_schedule(plan)
        if note is not None and note_fn is not None:
            note_fn(note)


def check_schedule(path, saved: dict, current: dict, steps: int, reschedule: bool) -> tuple[dict, str | None]:
    """The schedule a restarted run uses, and a note for the user (or None).

    The schedule belongs to the run that planned it: a cosine decay planned over ``total_steps``
    continues to that end whatever ``--steps`` the restart has. A run asked to stop earlier follows the
    original curve and stops; one asked to go past the end would train at the minimum rate, so it is
    refused unless ``reschedule`` (``--reschedule``), which re-plans the schedule with this run's
    options (the rate jumps at the restart). Changed ``--lr``/``--warmup``/``--schedule`` likewise need
    ``--reschedule``.

    Raises
    ------
    ConfigurationError
        When the options change the schedule without ``reschedule``.
    """
    if reschedule:
        note = None if saved == current else (f"--reschedule: the learning-rate schedule is re-planned "
                                              f"({_plan_text(saved)} -> {_plan_text(current)})")
        return current, note
    changed = [key for key in ("lr", "warmup_steps", "min_lr") if saved[key] != current[key]]
    if (saved["total_steps"] is None) != (current["total_steps"] is None):
        changed.append("schedule")
    if changed:
        raise ConfigurationError(
            f"{path}: this run changes the learning-rate schedule of the checkpoint ({_plan_text(saved)}; "
            f"now {_plan_text(current)}); restart with the original --lr/--warmup/--schedule, or add "
            "--reschedule to re-plan it from here")
    end = saved["total_steps"]
    if end is not None and steps > end:
        raise ConfigurationError(
            f"{path}: --steps {steps} goes past the end of the checkpoint's cosine schedule (step {end}, "
            f"where the learning rate reaches its minimum {saved['min_lr']:g}); restart with --steps {end} to "
            f"finish the planned run, or add --reschedule to re-plan the cosine decay to step {steps} "
            "(the learning rate jumps up at the restart)")
    note = None
    if end is not None and steps < end:
        note = (f"learning-rate schedule: the cosine decay planned to step {end} continues (this run stops at "
                f"step {steps}; --reschedule re-plans it)")
    return saved, note


def _plan_text(plan: dict) -> str:
    end = "constant" if plan["total_steps"] is None else f"cosine to step {plan['total_steps']}"
    return f"lr {plan['lr']:g}, warm-up {plan['warmup_steps']} steps, {end}"


def restore_training_checkpoint(manager, which, trainer, state, sync, model_name, steps=None, reschedule=False,
                                note_fn=None):
    """Collective: load checkpoint ``which`` ("latest" or a path) into ``state`` in place.

    ``steps``: the final step of this run (``--steps``); the learning-rate schedule stored in the
    checkpoint is kept (:func:`check_schedule`) unless ``reschedule``; ``note_fn(text)`` is told when it
    differs from this run's options. Checkpoints written before the schedule was stored keep this run's
    schedule.

    Returns
    -------
    dict
        The saved history (lists keyed by ``step``, ``loss``, ...).

    Raises
    ------
    ConfigurationError
        When the checkpoint was written for another model or global batch size, or this run changes
        its learning-rate schedule without ``reschedule``.
    """
    restored = manager.load(which)
    saved = restored.replicated
    config = trainer.config
    model = saved["model"]
    if model["name"] != model_name or int(model["n_params"]) != trainer.model.n_params:
        raise ConfigurationError(
            f"{restored.info.path}: written for model {model['name']!r} with {model['n_params']} "
            f"parameters, this run has {model_name!r} with {trainer.model.n_params}; restart with "
            "the same --model/--depth/--width")
    check_data_position(restored.info.path, saved["data"], config)
    apply_saved_schedule(restored.info.path, saved, trainer, steps, reschedule, note_fn)
    precision = state.precision
    xp = array_module(precision.master_params)
    precision.master_params[...] = xp.asarray(np.asarray(saved["params"],
                                                         dtype=precision.master_params.dtype))
    precision.refresh_compute_params()
    try:
        sync.load_optimizer_state(state.optimizer_state, saved["optimizer"])
    except ValueError as exc:
        raise ConfigurationError(f"{restored.info.path}: {exc}") from None
    precision.load_state_dict({key.replace(".", "/"): value
                               for key, value in saved.get("precision", {}).items()})
    state.step = int(restored.step)
    return {key: list(values) for key, values in saved.get("history", {}).items()}
