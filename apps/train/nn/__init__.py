"""The network: layers with explicit backward over one flat parameter buffer, the models, the loss.

* :mod:`~apps.train.nn.params` -- flat parameter and gradient buffers in backward order, seeded initialisation
* :mod:`~apps.train.nn.layers`, :mod:`~apps.train.nn.conv`, :mod:`~apps.train.nn.dropout` -- the layers
* :mod:`~apps.train.nn.sequential` -- a model: layers in order, gradient-ready hook, fusion, recomputation
* :mod:`~apps.train.nn.loss` -- softmax cross-entropy over the global batch
* :mod:`~apps.train.nn.models` -- the models of ``--model`` (MNIST-1D MLP and CNN, the large MLP)

Imports from :mod:`apps.train.kernels` (and :mod:`hpcgpu`) only: a layer knows nothing of optimisers, ranks or
the app (``tests/imports/test_import_graph.py`` checks this).
"""
