"""Fixtures and markers for the apps.train tests."""

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped otherwise)")
    config.addinivalue_line("markers", "slow: takes more than ~60 s on a 2-core CPU")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module of a parity test: NumPy (the CPU path), then CuPy (marked ``gpu``)."""
    if request.param == "numpy":
        return np
    return request.getfixturevalue("cupy")
