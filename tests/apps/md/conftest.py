"""Markers and fixtures of the MD tests (small systems, float64, CPU)."""

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA GPU")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture
def perturbed_fcc():
    """4x4x4 fcc (256 atoms) at density 0.8442, displaced by up to 0.05 sigma, two types."""
    from apps.md import lattice

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (4, 4, 4))
    rng = np.random.default_rng(7)
    positions = (positions + rng.uniform(-0.05, 0.05, positions.shape)) % box
    types = (np.arange(positions.shape[0]) % 2).astype(np.int32)
    return np.ascontiguousarray(positions), types, box, atom_ids
