"""Tools for testing hpcgpu and the programs built on it (fault injection: :mod:`hpcgpu.testing.faults`)."""
