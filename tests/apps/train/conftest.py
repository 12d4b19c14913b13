"""Fixtures and markers for the apps.train tests."""

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped otherwise)")
    config.addinivalue_line("markers", "slow: takes more than ~60 s on a 2-core CPU")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
