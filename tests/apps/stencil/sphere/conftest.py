"""Make ``sphere_reference`` (NumPy reference of the stage, tile helpers) importable from these tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
