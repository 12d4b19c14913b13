"""The common app contract: command line, progress, phase timers, summaries and checksums, and the lock
that gives a run directory one writer (:mod:`hpcgpu.app.directory_lock`).

Every app (``apps.stencil``, ``apps.md``, ``apps.train``) builds on these so that flags, output and
JSON summaries look the same everywhere (see ``docs/app-contract.md``).
"""
