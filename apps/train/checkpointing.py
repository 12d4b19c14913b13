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
                    epoch only, see :mod:`apps.train.loader`)
``rng``             the seeds: dropout masks are a hash of (seed, step, sample),
                    the shuffle of (seed, epoch) -- no generator state to save
``history``         loss curve and evaluations so far (the restarted run's
                    summary and plot cover the whole run)
``model``           model name and parameter count (checked on restart)
==================  ==========================================================

The fp16 compute copy is not stored: it is the cast of the masters.
"""

import numpy as np

from hpcgpu.errors import ConfigurationError

from ._backend import array_module, to_numpy


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


def restore_training_checkpoint(manager, which, trainer, state, sync, model_name):
    """Collective: load checkpoint ``which`` ("latest" or a path) into ``state`` in place.

    Returns
    -------
    dict
        The saved history (lists keyed by ``step``, ``loss``, ...).

    Raises
    ------
    ConfigurationError
        When the checkpoint was written for another model or global batch size.
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
    data = saved["data"]
    if int(data["global_batch_size"]) != config.global_batch_size or int(data["seed"]) != config.seed:
        raise ConfigurationError(
            f"{restored.info.path}: written with --batch-size {data['global_batch_size']} and --seed "
            f"{data['seed']}, this run has {config.global_batch_size} and {config.seed}; the data "
            "position depends on both, restart with the same values")
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
