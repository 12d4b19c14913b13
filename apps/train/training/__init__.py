"""One rank's training step: precision, optimiser, the step itself and the state a checkpoint keeps.

* :mod:`~apps.train.training.precision` -- fp32/fp64, fp16 with dynamic loss scaling, bf16
* :mod:`~apps.train.training.optim` -- SGD and AdamW (shardable), learning-rate schedule, gradient clipping
* :mod:`~apps.train.training.trainer` -- ``init_train_state`` / ``train_step`` / ``evaluate`` and the
  one-process :class:`~apps.train.training.trainer.Trainer`; gradient synchronisation is a hook passed in
* :mod:`~apps.train.training.checkpointing` -- the training state as a checkpoint payload, and its restore

Imports from :mod:`apps.train.nn`, :mod:`apps.train.data` and :mod:`apps.train.kernels` (and :mod:`hpcgpu`); never
from :mod:`apps.train.parallel` or above (``tests/imports/test_import_graph.py`` checks this).
"""
