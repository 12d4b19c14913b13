"""Make the channel's and the lat-lon grid's NumPy references (``swe_reference``, ``sphere_reference``) importable."""

import os
import sys

_STENCIL_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _grid in ("swe", "sphere"):
    sys.path.insert(0, os.path.join(_STENCIL_TESTS, _grid))
