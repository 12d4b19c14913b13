"""Observing a run: what the job runs on, what its GPUs do while it runs, and how to profile it.

===============  ==========================================================================================
``info``         ``hpcgpu info``: MPI library, ranks, nodes, GPUs, links, CPU affinity, chosen backend
``monitor``      :class:`~hpcgpu.observe.monitor.GpuMonitor`: a thread that samples every GPU of the rank
                 (``--monitor``) and reports throttling, memory and power at the end
``nvml_sample``  one NVML reading of a GPU (clocks, temperature, power, throttle reasons), shared by the
                 monitor and :mod:`hpcgpu.health`
``profiling``    the ``--profile`` flag: print the Nsight Systems command that records this run
===============  ==========================================================================================

Imports only :mod:`hpcgpu.runtime` (topology, affinity, container) from below; :mod:`hpcgpu.health`,
:mod:`hpcgpu.app` and :mod:`hpcgpu.simulation` import from here. Nothing here starts MPI or picks a GPU.
"""
