"""The training run as a model of :class:`hpcgpu.simulation.Simulation`: steps, state, diagnostics, the plot.

* :mod:`~apps.train.run.training_run` -- :class:`~apps.train.run.training_run.TrainingRun`, what both models share
  (the loader, the history, the loss-curve plot, BLAS threads)
* :mod:`~apps.train.run.simulation_model` -- :class:`~apps.train.run.simulation_model.TrainingModel`, one replica per
  rank (data parallelism, ZeRO-1)
* :mod:`~apps.train.run.parallel_model` -- :class:`~apps.train.run.parallel_model.ParallelTrainingModel`, the
  residual MLP on a data x tensor x pipeline grid
* :mod:`~apps.train.run.report` -- the loss-curve figure

Imports from every subpackage below it (:mod:`apps.train.parallel` and down) and from :mod:`hpcgpu`; only the
command line (:mod:`apps.train.app`) imports it (``tests/imports/test_import_graph.py`` checks this).
"""
