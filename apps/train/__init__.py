"""Neural-network training on many GPUs (data, tensor and pipeline parallelism): ``python -m apps.train``.

The app in layers, each subpackage importing only from the ones listed before it (and from :mod:`hpcgpu`)::

    kernels, data  <-  nn  <-  training  <-  parallel  <-  run  <-  app

* :mod:`apps.train.kernels` -- CuPy and Numba kernels behind validating wrappers, the array helpers
* :mod:`apps.train.data` -- MNIST-1D and HDF5 data, rank-independent global batches, per-rank shards, prefetch
* :mod:`apps.train.nn` -- layers with explicit backward over flat buffers, the models, the loss
* :mod:`apps.train.training` -- one rank's step: precision, optimiser, init/step/evaluate, checkpoint payload
* :mod:`apps.train.parallel` -- data parallelism (bucketed allreduce, ZeRO-1), tensor and pipeline parallelism
  on a data x tensor x pipeline grid, sharded checkpoints, communication volume
* :mod:`apps.train.run` -- the training run as a :class:`hpcgpu.simulation.Simulation` model, the loss plot
* :mod:`apps.train.app` -- the command line (the app contract) and the assembly of a run;
  :mod:`apps.train.scaling_recipe` -- the ``hpcgpu.bench`` scaling recipe (entry point ``train``)

``tests/imports/test_import_graph.py`` checks the order. Importing the package does no work (no data
generation, no GPU access).
"""
