"""Fixtures and markers for the apps.train tests."""

import h5py
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


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """A small learnable HDF5 data set (x, y, x_test, y_test)."""
    rng = np.random.default_rng(0)
    projections = rng.standard_normal((12, 4))
    path = tmp_path_factory.mktemp("data") / "small.h5"
    with h5py.File(path, "w") as handle:
        for prefix, count in (("", 240), ("_test", 60)):
            x = rng.standard_normal((count, 12)).astype(np.float32)
            handle[f"x{prefix}"], handle[f"y{prefix}"] = x, np.argmax(x @ projections, axis=1)
    return str(path)
