"""docs/user-guide.md runs as written: its ``python title="FILE"`` blocks are written to FILE (blocks
with the same title appended in order) and its ``console`` commands run in order in one directory,
``mpiexec -n N`` under the test launcher; a command marked ``# exits 75`` must exit with 75."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "user-guide.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def page_steps(text: str):
    """``("file", name, code)`` and ``("command", line)`` in the order of the page."""
    for language, info, body in BLOCK.findall(text):
        title = re.search(r'title="([^"]+)"', info)
        if language == "python" and title:
            yield "file", title.group(1), body
        elif language == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    yield "command", line[2:]


def test_the_user_guide_runs_as_written(tmp_path):
    steps = list(page_steps(PAGE.read_text()))
    assert sum(1 for s in steps if s[0] == "command") >= 8 and any(s[0] == "file" for s in steps)
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    files: dict = {}
    for step in steps:
        if step[0] == "file":
            _, name, code = step
            files[name] = files.get(name, "") + ("\n\n" if name in files else "") + code
            (tmp_path / name).write_text(files[name])
            continue
        line = step[1]
        expected = 75 if "# exits 75" in line else 0
        words = shlex.split(line.split("#")[0])
        if words[0] == "mpiexec":
            n_ranks = int(words[2])
            words = words[3:]
        else:
            n_ranks = None
        assert words[0] == "python"
        command = [sys.executable, *words[1:]]
        if n_ranks is None:
            result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True,
                                    timeout=120)
            code, output = result.returncode, result.stdout + result.stderr
        else:
            result = run_mpi(n_ranks, command, timeout=120, env=environment, cwd=str(tmp_path))
            code, output = result.returncode, result.output
        assert code == expected, f"`{line}` exited {code}, expected {expected}:\n{output[-3000:]}"
    # The sentence after the restart section: a changed model option is refused, naming it.
    result = subprocess.run([sys.executable, "heat.py", "--steps", "250", "--output", "chain", "--alpha", "0.1",
                             "--restart", "latest", "--quiet"], cwd=tmp_path, env=environment, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "--alpha" in result.stdout + result.stderr
