"""Starting jobs: launching ranks and writing the batch scripts that do it on a cluster.

==============  ===========================================================================================
``launch``      start a command on N ranks with the local ``mpiexec``, under a timeout (tests, series)
``jobscript``   ``hpcgpu jobscript``: write a Slurm batch script for an app, or copy a shipped one
``template``    the templates every batch script and launcher is rendered from (``jobscripts/template/``)
``shipped``     the values of every shipped script (``jobscripts/gpu``, ``cpu``, ``mpirun``)
``jobscripts``  the shipped scripts, package data (in a checkout, a link to the top-level ``jobscripts/``)
==============  ===========================================================================================

A tool on top of the framework: imports :mod:`hpcgpu.errors` and :mod:`hpcgpu.app` (the command-line
parser); :mod:`hpcgpu.bench` and :mod:`hpcgpu.testing` import the launcher from here.
"""
