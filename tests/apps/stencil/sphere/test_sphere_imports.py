"""The polar filter's modules form no import cycle (issue 25), not even through function-local imports.

``polar_filter`` (the entry point) imports ``polar_circles`` and ``polar_filter_gpu``;
``polar_filter_gpu`` imports ``polar_circles``; ``polar_circles`` imports neither.
"""

import ast
from pathlib import Path

import pytest

SPHERE = Path(__file__).resolve().parents[4] / "apps" / "stencil" / "sphere"


def imported_modules(name: str) -> set:
    """Every module a source file imports, at any depth of its code."""
    tree = ast.parse((SPHERE / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("polar_filter_gpu", {"apps.stencil.sphere.polar_filter"}),
        ("polar_circles", {"apps.stencil.sphere.polar_filter", "apps.stencil.sphere.polar_filter_gpu"}),
    ],
)
def test_polar_filter_modules_do_not_import_their_callers(module, forbidden):
    assert not imported_modules(module) & forbidden


def test_the_entry_point_imports_both_implementations():
    assert {"apps.stencil.sphere.polar_circles", "apps.stencil.sphere.polar_filter_gpu"} <= imported_modules("polar_filter")
