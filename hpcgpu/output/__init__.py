"""Files a run keeps: crash-safe netCDF records and the output operation for any model's fields.

- :mod:`hpcgpu.output.fields`         -- :class:`NetCDFOutput`: any model's fields as CF netCDF records
- :mod:`hpcgpu.output.netcdf_classic` -- append-only netCDF (64-bit offset) files that survive a kill
  at any moment: :class:`~hpcgpu.output.netcdf_classic.Schema`, :class:`~hpcgpu.output.netcdf_classic.RecordFile`
- :mod:`hpcgpu.output.twin_file`      -- crash-safe appends to HDF5 files (H5MD): two copies, one published
- :mod:`hpcgpu.output.atomic`         -- small files written whole or not at all (summaries, environment)
- :mod:`hpcgpu.output.errors`         -- one message for a failed write (:class:`hpcgpu.errors.OutputError`)
"""

from __future__ import annotations

import importlib

__all__ = ["NetCDFOutput"]


def __getattr__(name: str):
    # Lazy: the netCDF writer alone (used by the apps' snapshots) does not import the simulation driver.
    if name == "NetCDFOutput":
        return importlib.import_module("hpcgpu.output.fields").NetCDFOutput
    raise AttributeError(f"module 'hpcgpu.output' has no attribute {name!r}")
