"""Training over many ranks: data, tensor and pipeline parallelism and what they move between ranks.

* :mod:`~apps.train.parallel.distributed` -- data parallelism: bucketed gradient sums during the backward pass,
  through :mod:`~apps.train.parallel.reducers` (MPI, NCCL, stream-ordered) or
  :mod:`~apps.train.parallel.peer_reduce` (CUDA IPC, ``--allreduce peer``)
* :mod:`~apps.train.parallel.zero` -- ZeRO-1: the optimiser state sharded over the data-parallel ranks
* :mod:`~apps.train.parallel.grid` -- the data x tensor x pipeline grid of ranks and its communicators
* :mod:`~apps.train.parallel.tensor_parallel` -- the residual MLP's layers split over a tensor group
* :mod:`~apps.train.parallel.pipeline` -- one pipeline stage's schedule
  (:mod:`~apps.train.parallel.pipeline_schedule`), its activations sent by
  :mod:`~apps.train.parallel.pipeline_transport`
* :mod:`~apps.train.parallel.trainer` -- :class:`~apps.train.parallel.trainer.ParallelTrainer`, the step on the
  grid, with its gradient synchronisation in :mod:`~apps.train.parallel.sync`
* :mod:`~apps.train.parallel.shard_map`, :mod:`~apps.train.parallel.sharded_checkpoint` -- where each rank's shard
  lies in the unsplit model; checkpoints restartable on another grid
* :mod:`~apps.train.parallel.comm_volume` -- bytes each rank sends, measured and computed

Imports from :mod:`apps.train.training`, :mod:`apps.train.nn`, :mod:`apps.train.data`, :mod:`apps.train.kernels`
and :mod:`hpcgpu` (all data movement through :mod:`hpcgpu.transport`); never from :mod:`apps.train.run` or the
app (``tests/imports/test_import_graph.py`` checks this).
"""
