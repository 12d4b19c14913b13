"""Shared setup of the shallow-water tests: make the local NumPy reference importable.

``swe_reference.py`` (the slicing reference of the stage kernel and the tile/ghost helpers) sits next
to the tests; putting this directory on ``sys.path`` makes ``import swe_reference`` work under any
pytest import mode. The ``gpu`` marker is registered by the project's pytest configuration.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
