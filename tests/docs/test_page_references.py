"""The pages name code that exists: in the inline code of every page of docs/, a repository path
(``apps/train/parallel/zero.py``, ``tests/apps/train/test_bf16.py::test_bf16_restart_is_bitwise``) is a file
of the checkout (and the test a function in it), and a dotted hpcgpu or apps name
(``apps.train.parallel.grid.make_grid``, ``hpcgpu.checkpoint.CheckpointManager``) resolves to a module
or one of its attributes.

Left out: a path written after a colon (``git show REV:benchmarks/...``, a file of an old tree), a
path with a wildcard (``tests/apps/train/test_split_*.py``) and a dotted name with a capitalised
placeholder (``apps.NAME``), and the names of :data:`NOT_MODULES` (dotted like a module, but not one)."""

from __future__ import annotations

import re
from pathlib import Path

from .test_docstring_references import resolves

ROOT = Path(__file__).resolve().parents[2]
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"(?<![\w./:-])((?:apps|hpcgpu|benchmarks|tests|examples|jobscripts)/[\w./-]*\w)(?![\w*./-])(?:::(\w+))?")
_DOTTED = re.compile(r"(?<![\w./:-])((?:apps|hpcgpu)(?:\.\w+)+)")
#: Dotted names the pages use that are not Python modules: the scaling recipes' entry-point group.
NOT_MODULES = {"hpcgpu.scaling_recipes"}


def broken_references(page: Path) -> list[str]:
    """The paths and dotted names in ``page``'s inline code that do not exist."""
    broken = []
    for span in _CODE.findall(page.read_text(encoding="utf-8")):
        for path, function in _PATH.findall(span):
            target = ROOT / path
            if not target.exists():
                broken.append(path)
            elif function and not re.search(rf"^\s*def {function}\b", target.read_text(encoding="utf-8"), re.M):
                broken.append(f"{path}::{function}")
        for name in _DOTTED.findall(span):
            if name in NOT_MODULES or any(part.isupper() for part in name.split(".")):
                continue
            if not resolves(name):
                broken.append(name)
    return broken


def test_pages_name_files_and_objects_that_exist():
    broken = [f"docs/{page.name}: {name}" for page in sorted((ROOT / "docs").glob("*.md"))
              for name in sorted(set(broken_references(page)))]
    assert not broken, "the documentation names what does not exist:\n" + "\n".join(broken)


def test_a_missing_path_or_name_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("`apps/train/parallel/zero.py` `apps/train/no_such.py` `tests/apps/train/test_bf16.py::no_such_test` "
                    "`apps.train.parallel.zero.ZeroRedundancy` `apps.train.parallel.zero.NoSuchName` `apps.NAME` "
                    "`git show abc:benchmarks/gone.py` `tests/apps/train/test_gone_*.py`")
    assert sorted(broken_references(page)) == ["apps.train.parallel.zero.NoSuchName", "apps/train/no_such.py",
                                               "tests/apps/train/test_bf16.py::no_such_test"]
