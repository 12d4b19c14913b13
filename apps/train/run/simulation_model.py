"""``apps.train`` as a :class:`hpcgpu.simulation.Model`: data-parallel training steps and evaluations.

The training itself stays in :mod:`apps.train.training.trainer` (``train_step``), :mod:`apps.train.parallel.distributed`
(gradient buckets, ZeRO) and :mod:`apps.train.data.loader` (prefetched shards); this module adapts it to
the simulation driver: :class:`TrainingModel` (a step is one optimiser step over one global batch;
checkpoints hold the replicated training state; the checksum covers the master weights) and
:class:`Evaluation` (the test set every ``--eval-every`` steps).
"""

from __future__ import annotations

from hpcgpu.app.checksum import hash_arrays
from hpcgpu.simulation import Operation

from apps.train.kernels.backend import to_numpy
from apps.train.training.checkpointing import restore_training_checkpoint, training_checkpoint_payload
from apps.train.data.dataset import shard_bounds
from apps.train.parallel.distributed import evaluate_distributed, replicas_identical
from apps.train.training.trainer import train_step
from .training_run import TrainingRun


class TrainingModel(TrainingRun):
    """One data-parallel training run.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : hpcgpu.app.cli.FrozenOptions
        The resolved options (:func:`apps.train.app.resolve_options`).
    data : apps.train.data.loader.TrainingData
    trainer : apps.train.training.trainer.Trainer
    sync : apps.train.parallel.distributed.DataParallel or apps.train.parallel.zero.ZeroRedundancy
    state : apps.train.training.trainer.TrainState
    """

    def __init__(self, comm, arch, options, data, trainer, sync, state):
        self.trainer, self.sync, self.state = trainer, sync, state
        super().__init__(comm, arch, options, data, n_params=trainer.model.n_params)

    @property
    def step_index(self) -> int:
        return self.state.step

    # ------------------------------------------------------------------ stepping
    def prepare(self) -> None:
        """Measure the bucketed allreduce alone (for the overlap report); start the prefetching loader."""
        self.sync.measure_allreduce_alone()
        self.start_loader(self.comm.rank, self.comm.size)

    def step(self, timers) -> None:
        batch = self.loader.next()
        metrics = train_step(self.trainer, self.state, batch.x, batch.y, batch.sample_index, self.sync, timers)
        self.record_loss(metrics.loss)

    def evaluate(self) -> None:
        """Collective: loss and accuracy on the test set, appended to the history."""
        self.record_evaluation(*evaluate_distributed(self.trainer, self.state, self.x_test, self.y_test, self.comm))

    # ------------------------------------------------------------------ description
    def describe(self) -> str:
        options = self.options
        return (f"{options.model}, {self.n_params:,} parameters, {options.precision}, "
                f"{options.optimizer} lr {options.lr:g}" + (", recompute" if options.recompute else ""))

    def header_lines(self, comm, arch) -> list[str]:
        options = self.options
        shares = sorted({hi - lo for lo, hi in (shard_bounds(options.batch_size, r, comm.size)
                                               for r in range(comm.size))})
        sync_text = ("ZeRO-1 (optimiser state sharded, reduce-scatter + all-gather)" if options.zero
                     else f"{len(self.sync.buckets)} allreduce bucket(s) of <= {options.bucket_mb:g} MB"
                     + (" (copy engines, CUDA IPC)" if options.allreduce == "peer" else ""))
        lines = self.first_header_lines(arch)
        lines.append(f"ranks: {comm.size} on {comm.n_nodes} node(s); data parallel: global batch {options.batch_size} "
                     f"= {comm.size} x {'/'.join(str(s) for s in shares)} (accumulation {options.accum_steps}); "
                     f"{sync_text}")
        return lines

    def decomposition(self) -> dict:
        options, sync = self.options, self.sync
        shares = [hi - lo for lo, hi in (shard_bounds(options.batch_size, r, self.comm.size)
                                         for r in range(self.comm.size))]
        return {"kind": "data-parallel", "replicas": self.comm.size, "global_batch_size": options.batch_size,
                "local_batch_sizes": shares, "accum_steps": options.accum_steps, "zero_stage": options.zero,
                "buckets": len(sync.buckets), "bucket_mb": options.bucket_mb if options.zero == 0 else None,
                "allreduce": options.allreduce if options.zero == 0 else None}

    # ------------------------------------------------------------------ checkpoint / restart
    def checkpoint_state(self) -> dict:
        return training_checkpoint_payload(self.trainer, self.state, self.sync, self.history, self.options.model)

    def load_checkpoint(self, control) -> int | None:
        """Collective: load ``--restart`` into the training state; the schedule rules of
        :func:`apps.train.training.checkpointing.check_schedule` apply."""
        options = self.options
        loud = self.comm.rank == 0 and not options.quiet

        def load(manager, which):
            self.history.update(restore_training_checkpoint(
                manager, which, self.trainer, self.state, self.sync, options.model, steps=options.steps,
                reschedule=options.reschedule, note_fn=print if loud else None))
            return self.state.step

        return control.restore_with(load)

    # ------------------------------------------------------------------ results
    def diagnostics(self) -> dict:
        """Collective: the final evaluation (unless the last step had one), the replica check, the losses."""
        self.evaluate_unless_done()
        identical = replicas_identical(self.comm, to_numpy(self.state.precision.master_params))
        return {**self.loss_diagnostics(self.state.precision), "overlap": self.sync.overlap_stats(),
                "replicas_identical": bool(identical), "n_params": self.n_params}

    def checksum(self) -> str:
        """Collective: the master weights (identical on every rank)."""
        params = to_numpy(self.state.precision.master_params)
        return self.comm.broadcast(hash_arrays([("params", params)]) if self.comm.rank == 0 else None, root=0)

class Evaluation(Operation):
    """Evaluate on the test set when the trigger fires (``--eval-every``; the final evaluation is part of
    the diagnostics)."""

    def __init__(self, model: TrainingModel, trigger):
        super().__init__(trigger)
        self.model = model

    def act(self, simulation) -> None:
        self.model.evaluate()
