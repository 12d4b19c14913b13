"""Checkpoints of a model split over a D x T x P grid, restartable on any grid.

A checkpoint stores the LOGICAL model: the parameters and the optimiser state in the layout of the
unsplit one-process model (:meth:`ParallelModel.reference`), whatever grid wrote them. Each rank
knows how its flat buffer maps into that layout (:func:`shard_pieces`): for every parameter tensor of
its stage, the flat indices of the unsplit tensor it holds (rows ``lo:hi`` of a column-parallel
weight, columns of a row-parallel one, all of a replicated tensor). Saving assembles the logical
vectors exactly (:func:`gather_logical`: each element is written by one rank -- data replica 0 and,
for a replicated tensor, tensor rank 0 -- and copied, never summed, so -0.0 and every bit survive);
restarting cuts this rank's shard out of them again (:func:`cut_shard`) on whatever grid the new run
has. So a checkpoint written at 1 x 2 x 1 restarts at 1 x 1 x 2, 2 x 1 x 1 or 1 x 1 x 1, and on its
own grid the continuation is bitwise the uninterrupted run.

The arrays go through :class:`hpcgpu.checkpoint.CheckpointManager` as replicated state under
``/replicated`` of ``checkpoint.h5`` (the layout of :mod:`apps.train.checkpointing`, which the
data-parallel models write, plus the grid and the tensor map):

==================  ==========================================================================
``params``          master weights, shape (n_params of the one-process model,), its layout
``optimizer/*``     AdamW ``exp_avg``/``exp_avg_sq`` (or SGD ``momentum_buffer``) in the same
                    layout; ``step``, the AdamW counter
``precision/*``     the fp16 loss scaler (identical on every rank)
``data``, ``rng``   global batch size, seed and step: the data position (the order of the
                    samples is a function of seed and epoch; dropout masks of seed, step and
                    sample)
``history``         loss curve and evaluations so far
``model``           name, parameter count and the :class:`MLPSpec` (checked on restart)
``schedule``        the learning-rate schedule (see :func:`apps.train.checkpointing.check_schedule`)
``grid``            D, T, P, micro-batches, pipeline schedule and the layers of each stage of
                    the grid that wrote it (information: a restart may use another grid)
``tensors``         lists over the tensors of the unsplit model: ``name``, ``offset``, ``shape``,
                    ``split`` (how a grid cuts it: ``column``, axis 0 over the tensor ranks;
                    ``row``, axis 1; ``replicated``) and ``stage`` (the stage that held it) --
                    enough to read the file without this code
==================  ==========================================================================

Memory: the logical vectors are assembled on every rank (as the ZeRO-1 path gathers its optimiser
shards for a checkpoint), which bounds the model size to what one rank can hold three times over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

from ._backend import array_module, to_numpy
from .checkpointing import check_schedule
from .sequential import Sequential
from .tensor_parallel import ColumnParallelLinear, TensorGroup, mlp_layers

#: The :class:`MLPSpec` fields a checkpoint must share with the run that restarts from it.
SPEC_FIELDS = ("n_inputs", "n_classes", "width", "hidden", "depth", "dropout")


@dataclass(frozen=True)
class ShardPiece:
    """One parameter tensor of this rank's stage, placed in the unsplit model's flat buffer.

    Attributes
    ----------
    local_offset, local_stop : int
        Its range in this rank's flat buffer.
    logical_indices : ndarray of int64, shape (local_stop - local_offset,)
        The positions of its elements in the unsplit model's flat buffer (C order of the shard).
    writes : bool
        True on the one rank that contributes this shard to a checkpoint: data replica 0 and,
        for a tensor every tensor rank holds whole, tensor rank 0.
    """

    local_offset: int
    local_stop: int
    logical_indices: np.ndarray
    writes: bool


def _entries_of(layout, leaf):
    return [entry for entry in layout.entries if entry.layer == leaf.name]


def _split_kind(leaf, name) -> str:
    """How a grid splits parameter ``name`` of ``leaf``: column, row or replicated."""
    if name not in getattr(leaf, "sharded_params", ()):
        return "replicated"
    return "column" if isinstance(leaf, ColumnParallelLinear) else "row"


def shard_pieces(parallel_model, data_rank: int, tensor_rank: int) -> list[ShardPiece]:
    """Where every parameter tensor of this rank's stage lies in the unsplit model (no collective).

    Parameters
    ----------
    parallel_model : apps.train.parallel_training.ParallelModel
    data_rank, tensor_rank : int
        This rank's coordinates (they decide which rank writes a piece).
    """
    layout = parallel_model.model.layout
    pieces = []
    for leaf, reference_leaf, reference_layout in parallel_model.leaf_pairs():
        for entry, reference_entry in zip(_entries_of(layout, leaf), _entries_of(reference_layout, reference_leaf)):
            indices = np.arange(reference_entry.offset, reference_entry.stop,
                                dtype=np.int64).reshape(reference_entry.shape)
            if hasattr(leaf, "shard"):
                indices = leaf.shard(entry.name, indices)
            if indices.shape != tuple(entry.shape):
                raise ConfigurationError(
                    f"sharded checkpoint: {leaf.name}/{entry.name} holds {tuple(entry.shape)}, its slice of the "
                    f"unsplit {reference_leaf.name}/{reference_entry.name} is {indices.shape}")
            sharded = _split_kind(leaf, entry.name) != "replicated"
            pieces.append(ShardPiece(entry.offset, entry.stop, np.ascontiguousarray(indices).reshape(-1),
                                     writes=data_rank == 0 and (tensor_rank == 0 or sharded)))
    return pieces


def tensor_map(parallel_model) -> dict:
    """The unsplit model's tensors as columns: ``name``, ``offset``, ``shape``, ``split``, ``stage`` (lists).

    ``split`` is how a tensor-parallel grid cuts a tensor (``column``: axis 0, ``row``: axis 1,
    ``replicated``); ``stage`` the pipeline stage that holds it in the grid of ``parallel_model``.
    """
    # the split leaves of a T = 2 model say how each tensor is cut (no communication: layouts only)
    split = Sequential(mlp_layers(parallel_model.spec, TensorGroup(0, 2, _NoCollectives())))
    reference = parallel_model.reference()
    layer_of_leaf, stage_of_layer = [], {}
    for index, layer in enumerate(reference.layers):
        layer_of_leaf += [index] * len(layer.leaves())
    for stage, (start, stop) in enumerate(parallel_model.stage_ranges):
        stage_of_layer.update({layer: stage for layer in range(start, stop)})
    tensors = {"name": [], "offset": [], "shape": [], "split": [], "stage": []}
    for position, (leaf, split_leaf) in enumerate(zip(reference.leaves(), split.leaves())):
        for entry in _entries_of(reference.layout, leaf):
            tensors["name"].append(f"{entry.layer}/{entry.name}")
            tensors["offset"].append(int(entry.offset))
            tensors["shape"].append([int(n) for n in entry.shape])
            tensors["split"].append(_split_kind(split_leaf, entry.name))
            tensors["stage"].append(stage_of_layer[layer_of_leaf[position]])
    return tensors


class _NoCollectives:
    def allreduce(self, array, op):   # pragma: no cover - only layouts are built
        raise AssertionError("no collective while describing the tensors")


def gather_logical(world, pieces, local, n_logical: int) -> np.ndarray:
    """Collective over ``world``: the unsplit flat vector of the per-rank buffers ``local``, on every rank.

    Parameters
    ----------
    world : hpcgpu.Communicator
        Every rank of the grid.
    pieces : list of ShardPiece
        This rank's (:func:`shard_pieces`).
    local : ndarray, shape (this rank's n_params,)
        The buffer (host or device) laid out as this rank's stage.
    n_logical : int
        Parameters of the unsplit model.

    Returns
    -------
    numpy.ndarray, shape (n_logical,), the dtype of ``local``
        Every element copied from the one rank that writes it (exact).

    Raises
    ------
    ConfigurationError
        On every rank, when the ranks' pieces do not cover each element exactly once.
    """
    host = to_numpy(local)
    written = [piece for piece in pieces if piece.writes]
    indices = (np.concatenate([piece.logical_indices for piece in written]) if written
               else np.zeros(0, dtype=np.int64))
    values = (np.concatenate([host[piece.local_offset:piece.local_stop] for piece in written]) if written
              else np.zeros(0, dtype=host.dtype))
    logical = np.zeros(n_logical, dtype=host.dtype)
    covered = np.zeros(n_logical, dtype=np.int64)
    for rank_indices, rank_values in world.mpi.allgather((indices, values)):
        logical[rank_indices] = rank_values
        covered[rank_indices] += 1
    if not np.all(covered == 1):
        raise ConfigurationError(
            f"sharded checkpoint: the ranks' shards cover {int(np.sum(covered == 0))} element(s) of the unsplit "
            f"model not at all and {int(np.sum(covered > 1))} more than once; expected each exactly once")
    return logical


def cut_shard(pieces, logical, local) -> None:
    """Fill this rank's buffer ``local`` (host or device) from the unsplit vector ``logical``; returns None."""
    host = np.empty(local.shape[0], dtype=local.dtype)
    source = np.asarray(logical)
    for piece in pieces:
        host[piece.local_offset:piece.local_stop] = source[piece.logical_indices]
    local[...] = array_module(local).asarray(host)


# ---------------------------------------------------------------------------- save
def parallel_checkpoint_payload(runner, history=None, model_name="residual-mlp") -> dict:
    """Collective over the grid: ``{"replicated": ..., "metadata": ...}`` of ``runner``'s state.

    Parameters
    ----------
    runner : apps.train.parallel_training.ParallelTrainer
    history : dict of lists, optional
        The loss curve and evaluations to keep (:class:`apps.train.training_run.TrainingRun`).
    """
    grid, state, parallel_model = runner.grid, runner.state, runner.parallel_model
    trainer, config = runner.trainer, runner.config
    pieces = shard_pieces(parallel_model, grid.data_rank, grid.tensor_rank)
    n_logical = parallel_model.reference().layout.n_params
    precision = state.precision
    optimizer = {}
    for key, value in state.optimizer_state.items():
        if np.ndim(value) == 0:   # AdamW's step counter, the same on every rank
            optimizer[key] = to_numpy(value)[()]
        else:
            optimizer[key] = gather_logical(grid.world, pieces, value, n_logical)
    replicated = {
        "params": gather_logical(grid.world, pieces, precision.master_params, n_logical),
        "optimizer": optimizer,
        "precision": {key.replace("/", "."): np.asarray(value)[()]
                      for key, value in precision.state_dict().items()},
        "data": {"global_batch_size": int(config.global_batch_size), "seed": int(config.seed),
                 "step": int(state.step)},
        "rng": {"seed": int(config.seed),
                "scheme": "dropout = hash(seed, step, sample); shuffle = permutation(seed, epoch)"},
        "history": {key: [int(v) if key.endswith("step") else float(v) for v in values]
                    for key, values in (history or {}).items()},
        "model": {"name": model_name, "n_params": int(n_logical), "spec": asdict(parallel_model.spec)},
        "schedule": trainer.schedule_plan(),
        "grid": {"data": grid.data_size, "tensor": grid.tensor_size, "pipeline": grid.pipeline_size,
                 "micro_batches": int(runner.engine.n_micro), "schedule": runner.engine.schedule,
                 "stage_layers": [[int(a), int(b)] for a, b in parallel_model.stage_ranges]},
        "tensors": tensor_map(parallel_model),
    }
    metadata = {"model": model_name, "precision": config.precision,
                "global_batch_size": int(config.global_batch_size),
                "grid": f"{grid.data_size} x {grid.tensor_size} x {grid.pipeline_size}",
                "layout": "logical (unsplit one-process model)"}
    return {"replicated": replicated, "metadata": metadata}


def save_parallel_checkpoint(manager, runner, history=None, model_name="residual-mlp"):
    """Collective: write a checkpoint of ``runner`` at its step; returns the CheckpointInfo (None while
    an asynchronous write is in flight)."""
    payload = parallel_checkpoint_payload(runner, history, model_name)
    return manager.save(runner.state.step, replicated=payload["replicated"], metadata=payload["metadata"])


# ---------------------------------------------------------------------------- restart
def check_compatible(path, saved: dict, runner, model_name) -> None:
    """Raise ConfigurationError unless the checkpoint ``saved`` (its replicated state) fits ``runner``.

    Reads only replicated values, so every rank raises the same message.
    """
    model = saved["model"]
    spec = asdict(runner.parallel_model.spec)
    stored_spec = model.get("spec")
    if model["name"] != model_name or stored_spec is None:
        raise ConfigurationError(
            f"{path}: written for model {model['name']!r}{'' if stored_spec else ' (not split over a grid)'}, this "
            f"run trains {model_name!r} on a D x T x P grid; restart with the same --model")
    differing = [name for name in SPEC_FIELDS if stored_spec.get(name) != spec[name]]
    if differing:
        found = ", ".join(f"{name} {stored_spec.get(name)}" for name in differing)
        wanted = ", ".join(f"{name} {spec[name]}" for name in differing)
        raise ConfigurationError(
            f"{path}: the checkpoint's model has {found}, this run's {wanted}; a checkpoint reshards onto "
            "another grid (--tensor-parallel, --pipeline-parallel, data replicas) but not onto another model: "
            "restart with the same --width/--hidden/--depth/--dropout and data")
    n_logical = runner.parallel_model.reference().layout.n_params
    if int(model["n_params"]) != n_logical or np.asarray(saved["params"]).shape != (n_logical,):
        raise ConfigurationError(
            f"{path}: holds {model['n_params']} parameters, this run's model has {n_logical}; restart with "
            "the same model")
    data, config = saved["data"], runner.config
    if int(data["global_batch_size"]) != config.global_batch_size or int(data["seed"]) != config.seed:
        raise ConfigurationError(
            f"{path}: written with --batch-size {data['global_batch_size']} and --seed {data['seed']}, this "
            f"run has {config.global_batch_size} and {config.seed}; the data position depends on both, "
            "restart with the same values")
    stored_keys = sorted(saved["optimizer"])
    wanted_keys = sorted(runner.state.optimizer_state)
    if stored_keys != wanted_keys:
        raise ConfigurationError(
            f"{path}: optimiser state {stored_keys}, this run's optimiser needs {wanted_keys}; restart with "
            "the same --optimizer")


def restore_parallel_checkpoint(manager, which, runner, model_name="residual-mlp", steps=None,
                                reschedule=False, note_fn=None) -> dict:
    """Collective: load checkpoint ``which`` ("latest" or a path) into ``runner`` in place, on its grid.

    The grid may differ from the one that wrote the checkpoint: each rank cuts its shard of the
    parameters and the optimiser state out of the stored unsplit vectors. ``steps``,
    ``reschedule`` and ``note_fn`` as in :func:`apps.train.checkpointing.restore_training_checkpoint`.

    Returns
    -------
    dict
        The saved history (lists keyed by ``step``, ``loss``, ...).

    Raises
    ------
    ConfigurationError
        On every rank alike (after the collective read, before anything else): another model
        (spec, parameter count), global batch size, seed or optimiser, or a changed schedule
        without ``reschedule``.
    """
    restored = manager.load(which)
    saved, path = restored.replicated, restored.info.path
    check_compatible(path, saved, runner, model_name)
    if "schedule" in saved and steps is not None:
        plan, note = check_schedule(path, dict(saved["schedule"]), runner.trainer.schedule_plan(), int(steps),
                                    reschedule)
        runner.trainer.set_schedule(plan)
        if note is not None and note_fn is not None:
            note_fn(note)
    grid, state = runner.grid, runner.state
    pieces = shard_pieces(runner.parallel_model, grid.data_rank, grid.tensor_rank)
    precision = state.precision
    cut_shard(pieces, np.asarray(saved["params"], dtype=precision.master_params.dtype), precision.master_params)
    precision.refresh_compute_params()
    for key, value in state.optimizer_state.items():
        stored = saved["optimizer"][key]
        if np.ndim(value) == 0:
            state.optimizer_state[key] = np.asarray(stored, dtype=np.asarray(value).dtype)
        else:
            cut_shard(pieces, np.asarray(stored, dtype=value.dtype), value)
    precision.load_state_dict({key.replace(".", "/"): value for key, value in saved.get("precision", {}).items()})
    state.step = int(restored.step)
    return {key: list(values) for key, values in saved.get("history", {}).items()}


def logical_state(runner) -> dict:
    """Collective: the unsplit parameters and optimiser arrays of ``runner`` (as a checkpoint holds them).

    Returns
    -------
    dict
        ``{"params": ndarray, "optimizer/KEY": ndarray or scalar}``, the same on every rank.
    """
    payload = parallel_checkpoint_payload(runner)["replicated"]
    arrays = {"params": payload["params"]}
    arrays.update({f"optimizer/{key}": value for key, value in payload["optimizer"].items()})
    return arrays
