"""The training data: MNIST-1D generated offline or an HDF5 file, rank-independent batches, per-rank shards.

* :mod:`~apps.train.data.dataset` -- MNIST-1D generation, HDF5 storage, the global shuffle of an epoch and
  :func:`~apps.train.data.dataset.shard_bounds` (which samples of a global batch a rank holds)
* :mod:`~apps.train.data.loader` -- each rank's shard of the seeded global batches, prefetched in the background

A bottom layer beside :mod:`apps.train.kernels`: it imports from :mod:`hpcgpu` and from itself only
(``tests/imports/test_import_graph.py`` checks this).
"""
