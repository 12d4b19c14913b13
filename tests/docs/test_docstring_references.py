"""Docstrings name things that exist: every Sphinx-style cross-reference to a dotted hpcgpu or apps
name (``:func:`apps.train.parallel.grid.prepare_device_communication```, ``:mod:`...```, ``:class:``,
``:meth:``, ``:attr:``, ``:data:``) resolves to a module or one of its attributes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_REFERENCE = re.compile(r":(?:func|class|meth|mod|data|attr):`~?((?:hpcgpu|apps)\.[\w.]+)`")


def resolves(name: str) -> bool:
    """True if the longest importable prefix of ``name`` has the rest as nested attributes."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_docstring_cross_references_resolve():
    broken = []
    for package in ("hpcgpu", "apps"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in sorted(set(_REFERENCE.findall(path.read_text(encoding="utf-8")))):
                if not resolves(name):
                    broken.append(f"{path.relative_to(ROOT)}: {name}")
    assert not broken, "docstrings name what does not exist:\n" + "\n".join(broken)
