"""Shared setup of the shallow-water tests: make the local helper module importable, register markers."""

import os
import sys

# The NumPy reference (swe_reference.py) sits next to the tests; make it importable under any
# pytest import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped otherwise)")
