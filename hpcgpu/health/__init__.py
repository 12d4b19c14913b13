"""Health of a job: a pre-flight check of its nodes, and watching a run for hangs and stragglers.

* :mod:`hpcgpu.health.check` -- ``hpcgpu check``: on every rank at once, GPU readings through NVML
  (:mod:`~hpcgpu.health.readings`, judged in :mod:`~hpcgpu.health.gpu_checks`), a device bandwidth
  probe and the job transport's links (:mod:`~hpcgpu.health.probes`), versions, free space and clock
  skew (:mod:`~hpcgpu.health.job_checks`); one table per node and a verdict
  (:mod:`~hpcgpu.health.report`).
* :mod:`hpcgpu.health.watchdog` -- a thread per rank that ends a run whose ranks stop making progress,
  naming the stuck rank (:mod:`~hpcgpu.health.hang`).
* :mod:`hpcgpu.health.stragglers` -- per-rank step times compared every N steps.

Nothing here runs at import: no MPI, no NVML, no CUDA. ``docs/health.md`` is the user's page.
"""
