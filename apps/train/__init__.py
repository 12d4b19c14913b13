"""Data-parallel neural-network training (single-process core).

Modules, one concept each:

* :mod:`~apps.train.params` -- flat parameter/gradient buffers, layout, seeded init
* :mod:`~apps.train.layers`, :mod:`~apps.train.dropout`, :mod:`~apps.train.conv` -- layers with explicit backward
* :mod:`~apps.train.sequential` -- models, gradient-ready hook, recomputation
* :mod:`~apps.train.loss` -- softmax cross-entropy over the global batch
* :mod:`~apps.train.optim` -- SGD, AdamW (shardable), schedule, clipping
* :mod:`~apps.train.precision` -- fp16 (dynamic loss scaling) and bf16 mixed precision
* :mod:`~apps.train.models` -- MNIST-1D MLP/CNN, large MLP
* :mod:`~apps.train.data` -- MNIST-1D generation, HDF5, global shuffle, sharding
* :mod:`~apps.train.trainer` -- init/step functions and a one-process loop
* :mod:`~apps.train.distributed` -- data parallelism: bucketed allreduce during backward
* :mod:`~apps.train.zero` -- ZeRO-1: sharded optimiser state
* :mod:`~apps.train.parallel_training` -- the residual MLP on a data x tensor x pipeline grid
  (:mod:`~apps.train.tensor_parallel`, :mod:`~apps.train.pipeline`), in every precision
* :mod:`~apps.train.loader` -- per-rank shards of global batches, prefetched
* :mod:`~apps.train.checkpointing` -- training state through hpcgpu.checkpoint
* :mod:`~apps.train.app` -- ``python -m apps.train`` (the app contract), :mod:`~apps.train.report` plots

Kernels (GPU via CuPy, CPU via Numba): :mod:`~apps.train.im2col`,
:mod:`~apps.train.random_mask`, :mod:`~apps.train.optim_kernels`.
Importing the package does no work (no data generation, no GPU access).
"""
