"""Files a run keeps: crash-safe netCDF records and the output operation for any model's fields.

- :mod:`hpcgpu.output.netcdf_classic` -- append-only netCDF (64-bit offset) files that survive a kill
  at any moment: :class:`~hpcgpu.output.netcdf_classic.Schema`, :class:`~hpcgpu.output.netcdf_classic.RecordFile`
- :mod:`hpcgpu.output.twin_file`      -- crash-safe appends to HDF5 files (H5MD): two copies, one published
- :mod:`hpcgpu.output.atomic`         -- small files written whole or not at all (summaries, environment)
- :mod:`hpcgpu.output.errors`         -- one message for a failed write (:class:`hpcgpu.errors.OutputError`)
"""
