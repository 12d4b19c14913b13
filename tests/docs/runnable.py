"""The runnable code blocks of the documentation: where they are and how each one runs.

A fenced code block runs in CI when the line right above its opening fence is an HTML comment that
starts with ``run`` (invisible on the site and on GitHub)::

    <!-- run -->
    ```python
    import hpcgpu
    ```

    <!-- run: ranks=2 timeout=120 -->
    ```python
    comm = hpcgpu.Communicator()   # on 2 ranks, under mpiexec
    ```

    <!-- run -->
    ```bash
    mpiexec -n 2 python -m apps.stencil --nx 64 --ny 32 --steps 20 --quiet
    ```

Options (``key=value`` after ``run:``): ``ranks=N`` starts a Python block under ``mpiexec -n N``
(a shell block says ``mpiexec`` itself), ``timeout=S`` is the block's limit in seconds (default
:data:`DEFAULT_TIMEOUT`). The blocks of one page run in page order in one fresh temporary directory,
so a later block may read the files an earlier one wrote (a restart after a checkpointed run).
Languages: ``python`` (run as a script) and ``bash``/``sh``/``shell`` (run by ``bash -e -o pipefail``,
so every command must succeed). ``python`` and ``mpiexec`` in a shell block are the test's own
(the directory of its interpreter comes first on ``PATH``), and ``PYTHONPATH`` names the checkout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 60.0
PYTHON_LANGUAGES = ("python", "py")
SHELL_LANGUAGES = ("bash", "sh", "shell")
OPTIONS = ("ranks", "timeout")

_MARKER = re.compile(r"^\s*<!--\s*run(?::(?P<options>[^>]*?))?\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<language>[\w+-]*)")


class MarkerError(ValueError):
    """A ``run`` marker that marks nothing runnable, or has an unknown option (the message says where)."""


@dataclass
class Block:
    """One runnable block: where it is, its language, its source and how to run it."""

    path: Path
    line: int                 # 1-based line of the opening fence
    language: str
    source: str
    ranks: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    options: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _parse_options(text: str | None, where: str) -> dict:
    options = {}
    for item in (text or "").split():
        key, _, value = item.partition("=")
        if key not in OPTIONS or not value:
            raise MarkerError(f"{where}: run option {item!r}: expected key=value with key in {OPTIONS}")
        try:
            options[key] = int(value) if key == "ranks" else float(value)
        except ValueError:
            raise MarkerError(f"{where}: run option {item!r}: expected a number") from None
    return options


def blocks_of(path: Path) -> list[Block]:
    """The runnable blocks of one Markdown file, in page order.

    Raises
    ------
    MarkerError
        A marker not directly followed by a fenced block in a runnable language, or a bad option.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    open_fence = None   # the fence of the code block we are in (a marker inside one is an example)
    for number, line in enumerate(lines):
        fence_line = _FENCE.match(line)
        if open_fence is not None:
            stripped = line.strip()
            if fence_line and stripped.startswith(open_fence) and stripped.strip(open_fence[0]) == "":
                open_fence = None
            continue
        if fence_line:
            open_fence = fence_line.group("fence")
            continue
        marker = _MARKER.match(line)
        if marker is None:
            continue
        where = f"{path.relative_to(ROOT)}:{number + 1}"
        options = _parse_options(marker.group("options"), where)
        fence = _FENCE.match(lines[number + 1]) if number + 1 < len(lines) else None
        language = fence.group("language").lower() if fence else ""
        if fence is None or language not in PYTHON_LANGUAGES + SHELL_LANGUAGES:
            raise MarkerError(f"{where}: a run marker must stand right above a fenced python or bash block; "
                              f"found {lines[number + 1] if number + 1 < len(lines) else 'the end of the file'!r}")
        if "ranks" in options and language not in PYTHON_LANGUAGES:
            raise MarkerError(f"{where}: ranks= is for Python blocks; a shell block writes mpiexec itself")
        indent, closing = len(fence.group("indent")), fence.group("fence")
        body = []
        for inner in lines[number + 2:]:
            if inner.strip().startswith(closing[0] * len(closing)) and inner.strip().strip(closing[0]) == "":
                break
            body.append(inner[indent:] if inner[:indent].strip() == "" else inner)
        else:
            raise MarkerError(f"{where}: the marked block is never closed")
        source = "\n".join(body) + "\n"
        blocks.append(Block(path, number + 2, language, source, options.get("ranks"),
                            options.get("timeout", DEFAULT_TIMEOUT), options))
    return blocks


def documentation_files() -> list[Path]:
    """Every Markdown file whose blocks may be marked: docs/**/*.md and the README."""
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
