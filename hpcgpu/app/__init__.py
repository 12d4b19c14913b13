"""The common app contract: command line, progress, phase timers, summaries and checksums.

Every app (``apps.stencil``, ``apps.md``, ``apps.train``) builds on these so that flags, output and
JSON summaries look the same everywhere (see ``docs/app-contract.md``).
"""
