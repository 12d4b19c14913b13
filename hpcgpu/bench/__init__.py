"""Benchmarks (not tests): ``python -m hpcgpu.bench {halo}``. Each prints a table and can write JSON."""
