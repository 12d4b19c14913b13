"""Files a run keeps, written so that a hard kill at any moment loses no earlier record.

- :mod:`hpcgpu.output.netcdf_classic` -- append-only netCDF (64-bit offset) files that survive a kill
  at any moment: :class:`~hpcgpu.output.netcdf_classic.Schema`, :class:`~hpcgpu.output.netcdf_classic.RecordFile`
- :mod:`hpcgpu.output.time_axis`      -- the time axis of a model's records, from its ``time`` and ``time_units``
- :mod:`hpcgpu.output.twin_file`      -- crash-safe appends to HDF5 files (H5MD): two copies, one published
- :mod:`hpcgpu.output.atomic`         -- small files written whole or not at all (summaries, environment),
  and :func:`~hpcgpu.output.atomic.fsync_path`
- :mod:`hpcgpu.output.errors`         -- one message for a failed write (:class:`hpcgpu.errors.OutputError`)

The operation that writes any model's fields with these files, :class:`hpcgpu.NetCDFOutput`, lives
with the other operations of the run loop (:mod:`hpcgpu.simulation.netcdf_output`): this package sits
below the checkpoints and the driver, which both write through it.
"""
