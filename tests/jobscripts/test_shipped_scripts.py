"""The shipped job scripts are the rendered output of the one template, byte for byte.

``jobscripts/gpu/*.sbatch``, ``jobscripts/cpu/*.sbatch`` and ``jobscripts/mpirun/run-{openmpi,mpich}.sh``
come from ``jobscripts/template/`` filled with the values of :mod:`hpcgpu.jobs.shipped`; so does
every script ``hpcgpu jobscript`` writes. A hand edit of a shipped file, or a change of the template or
the values without rendering again, fails here with the command that fixes it.
"""

from __future__ import annotations

import difflib
import os
import shutil

import pytest

from hpcgpu.jobs import jobscript
from hpcgpu.jobs.shipped import WRITE_COMMAND, shipped_scripts, stale_shipped
from hpcgpu.jobs.template import BatchScript, fill, render_batch_script
from tests.jobscripts._slurm import JOBSCRIPTS


def test_every_shipped_script_is_the_rendered_template():
    stale = stale_shipped(JOBSCRIPTS)
    first_difference = ""
    expected = shipped_scripts()
    if stale and stale[0] in expected and (JOBSCRIPTS / stale[0]).is_file():
        first_difference = "".join(difflib.unified_diff(
            expected[stale[0]].splitlines(keepends=True), (JOBSCRIPTS / stale[0]).read_text().splitlines(keepends=True),
            f"rendered {stale[0]}", f"jobscripts/{stale[0]}", n=1))
    assert not stale, (
        f"{stale}: not what jobscripts/template/ renders (a hand edit, or a template or value changed without "
        f"rendering). Edit jobscripts/template/*.in or hpcgpu/jobs/shipped.py, then run `{WRITE_COMMAND}` "
        f"from the repository root and commit the result.\n{first_difference}")


def test_the_rendering_covers_every_batch_script_and_both_launchers():
    rendered = set(shipped_scripts())
    on_disk = {str(path.relative_to(JOBSCRIPTS)) for path in JOBSCRIPTS.glob("*/*.sbatch")}
    assert on_disk and on_disk <= rendered and len(on_disk) == 24
    assert {"mpirun/run-openmpi.sh", "mpirun/run-mpich.sh"} <= rendered
    for relative in rendered:
        assert os.access(JOBSCRIPTS / relative, os.X_OK), f"jobscripts/{relative} is not executable: {WRITE_COMMAND}"


def test_write_shipped_restores_a_hand_edited_script(tmp_path, capsys):
    copy = tmp_path / "jobscripts"
    shutil.copytree(JOBSCRIPTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    edited = copy / "cpu" / "md-sweep.sbatch"
    edited.write_text(edited.read_text().replace("--time=00:10:00", "--time=00:20:00"))
    (copy / "gpu" / "md-extra.sbatch").write_text("#!/bin/bash\n")
    assert stale_shipped(copy) == ["cpu/md-sweep.sbatch", "gpu/md-extra.sbatch"]
    assert jobscript.main(["--write-shipped", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "1 changed" in out and str(edited) in out
    assert edited.read_text() == (JOBSCRIPTS / "cpu" / "md-sweep.sbatch").read_text()
    assert stale_shipped(copy) == ["gpu/md-extra.sbatch"]   # not the template's: reported, never deleted


def test_write_shipped_needs_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        jobscript.main(["--write-shipped", str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and WRITE_COMMAND in capsys.readouterr().err


def test_fill_places_blocks_and_text_and_refuses_unknown_or_missing_slots():
    template = "{{# a note for the editor }}\n#!/bin/bash\n{{BLOCK}}\necho {{WORD}} {{MORE}}\n"
    assert fill(template, {"BLOCK": ["# one", "# two"], "WORD": "hello", "MORE": ""}) == \
        "#!/bin/bash\n# one\n# two\necho hello\n"
    assert fill(template, {"BLOCK": [], "WORD": "a", "MORE": "b"}) == "#!/bin/bash\necho a b\n"
    with pytest.raises(ValueError, match=r"missing \['MORE'\], unknown \['OTHER'\]"):
        fill(template, {"BLOCK": [], "WORD": "a", "OTHER": "b"})
    with pytest.raises(ValueError, match="expected a list of lines"):
        fill(template, {"BLOCK": "text", "WORD": "a", "MORE": "b"})
    with pytest.raises(ValueError, match="expected a str"):
        fill(template, {"BLOCK": [], "WORD": ["a"], "MORE": "b"})


def test_a_value_is_never_read_as_a_slot():
    """Text given for a slot stays as given, even when it looks like a slot (a user's app flag could)."""
    text = render_batch_script(BatchScript(
        about=("{{RUN_FUNCTION}}",), job_name="x", log="%x-%j.log", resources=("--nodes=1",),
        app_module="apps.stencil", app_arguments=("'{{LOG}}'",), source_common=("source common.sh || exit 2",)))
    assert "# {{RUN_FUNCTION}}\n" in text and text.endswith("hpcgpu_run apps.stencil '{{LOG}}'\n")
