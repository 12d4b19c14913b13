"""Checkpoints of a model split over a D x T x P grid, restartable on any grid.

A checkpoint stores the LOGICAL model: the parameters and the optimiser state in the layout of the
unsplit one-process model (:meth:`ParallelModel.reference`), whatever grid wrote them. Each is one
global 1-D dataset of ``n_params`` values -- an :class:`hpcgpu.Field` on an :class:`hpcgpu.Decomposition`
of the world into contiguous blocks, which :class:`hpcgpu.checkpoint.CheckpointManager` writes as
every rank's block under one global dataset (rank files plus a virtual dataset, or one file with
parallel HDF5) and reads back on any rank count. A :class:`~apps.train.parallel.shard_map.BlockExchange` moves
the ranks' shard values into the blocks before the save (each element copied from the one rank that
writes it, so every bit survives) and cuts the new grid's shards out of them after a restart. So a
checkpoint written at 1 x 2 x 1 restarts at 1 x 1 x 2, 2 x 1 x 1 or 1 x 1 x 1, and on its own grid
the continuation is bitwise the uninterrupted run. Memory per rank: its shard and one block.

Under ZeRO-1 (:class:`~apps.train.parallel.trainer.ParallelSync` with ``zero_stage=1``) each data
replica holds the optimiser state of one part of its buffer only: a second exchange
(:func:`~apps.train.parallel.shard_map.owned_pieces`) moves those parts to the same blocks, so the file is the
same unsplit state whether the run used ZeRO or not, and restarts with or without ``--zero 1``.

Contents (``checkpoint.h5``; the small state is replicated, as in :mod:`apps.train.training.checkpointing`):

=========================  ===================================================================
``/fields/params``         master weights, shape (n_params,), the one-process layout
``/fields/optimizer.KEY``  AdamW ``exp_avg``/``exp_avg_sq`` or SGD ``momentum_buffer``, same layout
``optimizer``              ``arrays`` (the KEYs above) and ``counters`` (AdamW's ``step``)
``precision/*``            the fp16 loss scaler (identical on every rank)
``data``, ``rng``          global batch size, seed and step: the data position (the sample order is
                           a function of seed and epoch; dropout masks of seed, step and sample)
``history``                loss curve and evaluations so far
``model``                  name, parameter count, master dtype and the :class:`MLPSpec` (checked on
                           restart: a checkpoint reshards onto another grid, not onto another model)
``schedule``               the learning-rate schedule (:func:`apps.train.training.checkpointing.check_schedule`)
``grid``                   D, T, P, micro-batches, pipeline schedule and the layers of each stage of
                           the grid that wrote it (information: a restart may use another grid)
``tensors``                lists over the tensors of the unsplit model: ``name``, ``offset``,
                           ``shape``, ``split`` (``column``: axis 0 over the tensor ranks; ``row``:
                           axis 1; ``replicated``) and ``stage`` -- to read the file without this code
=========================  ===================================================================

::

    checkpoints = ShardedCheckpoint(runner)           # collective: the block layout and exchange
    checkpoints.save(manager, history)                # collective
    history = ShardedCheckpoint(new_runner).restore(manager, "latest", steps=200)   # any grid
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

import hpcgpu
from hpcgpu.errors import ConfigurationError

from apps.train.kernels.backend import to_numpy
from apps.train.training.checkpointing import apply_saved_schedule, check_data_position
from .shard_map import BlockExchange, gather_logical, owned_pieces, shard_pieces, tensor_map

#: The :class:`MLPSpec` fields a checkpoint must share with the run that restarts from it.
SPEC_FIELDS = ("n_inputs", "n_classes", "width", "hidden", "depth", "dropout")

#: The name of the parameter dataset; optimiser arrays are ``optimizer.KEY``.
PARAMS = "params"


class ShardedCheckpoint:
    """Saves and restores one :class:`~apps.train.parallel.trainer.ParallelTrainer` (any grid).

    Parameters
    ----------
    runner : apps.train.parallel.trainer.ParallelTrainer
    model_name : str
        Stored and checked on restart (``--model``).

    Notes
    -----
    Collective to build: the 1-D decomposition of the unsplit vector over the world and the
    :class:`~apps.train.parallel.shard_map.BlockExchange` between this grid's shards and its blocks.
    """

    def __init__(self, runner, model_name: str = "residual-mlp"):
        self.runner, self.model_name = runner, model_name
        grid, parallel_model = runner.grid, runner.parallel_model
        self.n_params = int(parallel_model.reference().layout.n_params)
        if self.n_params < grid.world.size:
            raise ConfigurationError(
                f"sharded checkpoint: {self.n_params} parameters cannot be cut into one block per rank of "
                f"{grid.world.size}; use fewer ranks")
        self.pieces = shard_pieces(parallel_model, grid.data_rank, grid.tensor_rank)
        self.decomposition = hpcgpu.Decomposition(grid.world, (self.n_params,), dims=(grid.world.size,),
                                                  node_aware=False)
        starts = self.decomposition.starts(0)
        bounds = [starts[self.decomposition.rank_coords(rank)[0]] for rank in range(grid.world.size)]
        self.exchange = BlockExchange(grid.world, self.pieces, bounds + [self.n_params])
        if self.exchange.block_lo != self.decomposition.local_start[0]:
            raise ConfigurationError("sharded checkpoint: the block exchange and the decomposition disagree")
        # ZeRO-1: each data replica holds the optimiser state of its part of the buffer only
        self.optimizer_exchange = self.exchange
        if getattr(runner.sync, "zero_stage", 0):
            lo, hi = runner.sync.owned_range(parallel_model.model.n_params)
            self.optimizer_exchange = BlockExchange(grid.world, owned_pieces(parallel_model, grid.tensor_rank,
                                                                             lo, hi), bounds + [self.n_params])

    # ------------------------------------------------------------------ save
    def state(self, history=None) -> dict:
        """Collective: ``{"fields", "replicated", "metadata"}`` for :meth:`CheckpointManager.save`.

        Parameters
        ----------
        history : dict of lists, optional
            The loss curve and evaluations to keep (:class:`apps.train.run.training_run.TrainingRun`).
        """
        runner = self.runner
        grid, state, parallel_model = runner.grid, runner.state, runner.parallel_model
        trainer, config, precision = runner.trainer, runner.config, state.precision
        fields = {PARAMS: self._field_of(precision.master_params, PARAMS)}
        counters = {}
        for key, value in state.optimizer_state.items():
            if np.ndim(value) == 0:   # AdamW's step counter, the same on every rank
                counters[key] = to_numpy(value)[()]
            else:
                fields[f"optimizer.{key}"] = self._field_of(value, f"optimizer.{key}", self.optimizer_exchange)
        replicated = {
            "optimizer": {"arrays": sorted(key for key in state.optimizer_state if f"optimizer.{key}" in fields),
                          "counters": counters},
            "precision": {key.replace("/", "."): np.asarray(value)[()]
                          for key, value in precision.state_dict().items()},
            "data": {"global_batch_size": int(config.global_batch_size), "seed": int(config.seed),
                     "step": int(state.step)},
            "rng": {"seed": int(config.seed),
                    "scheme": "dropout = hash(seed, step, sample); shuffle = permutation(seed, epoch)"},
            "history": {key: [int(v) if key.endswith("step") else float(v) for v in values]
                        for key, values in (history or {}).items()},
            "model": {"name": self.model_name, "n_params": self.n_params, "spec": asdict(parallel_model.spec),
                      "dtype": str(np.dtype(precision.master_params.dtype))},
            "schedule": trainer.schedule_plan(),
            "grid": {"data": grid.data_size, "tensor": grid.tensor_size, "pipeline": grid.pipeline_size,
                     "micro_batches": int(runner.engine.n_micro), "schedule": runner.engine.schedule,
                     "stage_layers": [[int(a), int(b)] for a, b in parallel_model.stage_ranges]},
            "tensors": tensor_map(parallel_model),
        }
        metadata = {"model": self.model_name, "precision": config.precision,
                    "global_batch_size": int(config.global_batch_size),
                    "grid": f"{grid.data_size} x {grid.tensor_size} x {grid.pipeline_size}",
                    "layout": "unsplit one-process model"}
        return {"fields": fields, "replicated": replicated, "metadata": metadata}

    def save(self, manager, history=None):
        """Collective: write a checkpoint of the runner at its step; returns the CheckpointInfo (None
        while an asynchronous write is in flight)."""
        state = self.state(history)
        return manager.save(self.runner.state.step, fields=state["fields"], replicated=state["replicated"],
                            metadata=state["metadata"])

    def _field_of(self, local, name, exchange=None):
        """A new host Field holding this rank's block of the unsplit ``local`` buffers (collective)."""
        field = hpcgpu.Field(self.decomposition, hpcgpu.arch.CPU(), halo_width=0,
                             dtype=to_numpy(local[:0]).dtype, name=name)
        (exchange or self.exchange).to_blocks(local, field.interior)
        return field

    # ------------------------------------------------------------------ restart
    def restore(self, manager, which, steps=None, reschedule=False, note_fn=None) -> dict:
        """Collective: load checkpoint ``which`` ("latest" or a path) into the runner in place.

        The grid may differ from the one that wrote the checkpoint. ``steps``, ``reschedule`` and
        ``note_fn`` as in :func:`apps.train.training.checkpointing.restore_training_checkpoint`.

        Returns
        -------
        dict
            The saved history (lists keyed by ``step``, ``loss``, ...).

        Raises
        ------
        ConfigurationError
            On every rank alike, after reading the checkpoint's replicated state and before its
            arrays: another model (spec, parameter count), global batch size, seed or optimiser, or a
            changed schedule without ``reschedule``.
        """
        runner = self.runner
        described = manager.load(which)   # the replicated state only: check before reading arrays
        saved, path = described.replicated, described.info.path
        self.check_compatible(path, saved)
        apply_saved_schedule(path, saved, runner.trainer, steps, reschedule, note_fn)
        stored_dtype = np.dtype(saved["model"]["dtype"])
        cpu = hpcgpu.arch.CPU()
        fields = {name: hpcgpu.Field(self.decomposition, cpu, halo_width=0, dtype=stored_dtype, name=name)
                  for name in [PARAMS] + [f"optimizer.{key}" for key in saved["optimizer"]["arrays"]]}
        restored = manager.load(described.info, fields=fields)
        state = runner.state
        precision = state.precision
        self._fill(fields[PARAMS], precision.master_params)
        precision.refresh_compute_params()
        for key, value in state.optimizer_state.items():
            if np.ndim(value) == 0:
                state.optimizer_state[key] = np.asarray(saved["optimizer"]["counters"][key],
                                                        dtype=np.asarray(value).dtype)
            else:
                self._fill(fields[f"optimizer.{key}"], value, self.optimizer_exchange)
        precision.load_state_dict({key.replace(".", "/"): value
                                   for key, value in saved.get("precision", {}).items()})
        state.step = int(restored.step)
        return {key: list(values) for key, values in saved.get("history", {}).items()}

    def _fill(self, field, local, exchange=None):
        block = field.interior.astype(to_numpy(local[:0]).dtype, copy=False)
        (exchange or self.exchange).from_blocks(block, local)

    def check_compatible(self, path, saved: dict) -> None:
        """Raise ConfigurationError unless the checkpoint's replicated state ``saved`` fits the runner.

        Reads only replicated values, so every rank raises the same message.
        """
        runner = self.runner
        model = saved["model"]
        spec = asdict(runner.parallel_model.spec)
        stored_spec = model.get("spec")
        if model["name"] != self.model_name or stored_spec is None:
            raise ConfigurationError(
                f"{path}: written for model {model['name']!r}{'' if stored_spec else ' (not split over a grid)'}, "
                f"this run trains {self.model_name!r} on a D x T x P grid; restart with the same --model")
        differing = [name for name in SPEC_FIELDS if stored_spec.get(name) != spec[name]]
        if differing:
            found = ", ".join(f"{name} {stored_spec.get(name)}" for name in differing)
            wanted = ", ".join(f"{name} {spec[name]}" for name in differing)
            raise ConfigurationError(
                f"{path}: the checkpoint's model has {found}, this run's {wanted}; a checkpoint reshards onto "
                "another grid (--tensor-parallel, --pipeline-parallel, data replicas) but not onto another "
                "model: restart with the same --width/--hidden/--depth/--dropout and data")
        if int(model["n_params"]) != self.n_params:
            raise ConfigurationError(
                f"{path}: holds {model['n_params']} parameters, this run's model has {self.n_params}; restart "
                "with the same model")
        check_data_position(path, saved["data"], runner.config)
        optimizer = saved["optimizer"]
        stored_keys = sorted(list(optimizer["arrays"]) + list(optimizer["counters"]))
        wanted_keys = sorted(runner.state.optimizer_state)
        if stored_keys != wanted_keys:
            raise ConfigurationError(
                f"{path}: optimiser state {stored_keys}, this run's optimiser needs {wanted_keys}; restart with "
                "the same --optimizer")


def logical_state(runner) -> dict:
    """Collective: the unsplit parameters and optimiser state of ``runner`` on every rank (tests,
    small models: the whole model is assembled on each rank).

    Returns
    -------
    dict
        ``{"params": ndarray, "optimizer/KEY": ndarray or NumPy scalar}``, the same on every rank.
    """
    grid, state, parallel_model = runner.grid, runner.state, runner.parallel_model
    pieces = shard_pieces(parallel_model, grid.data_rank, grid.tensor_rank)
    n_params = parallel_model.reference().layout.n_params
    arrays = {"params": gather_logical(grid.world, pieces, state.precision.master_params, n_params)}
    if getattr(runner.sync, "zero_stage", 0):   # ZeRO-1: the owned part of the buffer
        lo, hi = runner.sync.owned_range(parallel_model.model.n_params)
        pieces = owned_pieces(parallel_model, grid.tensor_rank, lo, hi)
    for key, value in state.optimizer_state.items():
        arrays[f"optimizer/{key}"] = (to_numpy(value)[()] if np.ndim(value) == 0
                                      else gather_logical(grid.world, pieces, value, n_params))
    return arrays
