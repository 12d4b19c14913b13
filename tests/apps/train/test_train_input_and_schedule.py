"""apps.train: ``--data`` errors once and naming the file; a restart keeps the planned LR schedule (issue 24)."""

import json
import sys

import numpy as np
import pytest

from apps.train.training.checkpointing import check_schedule
from apps.train.data.dataset import data_file_problem
from hpcgpu.errors import ConfigurationError
from hpcgpu.jobs.launch import run_mpi

SMALL = ["--model", "large-mlp", "--depth", "2", "--width", "16", "--batch-size", "24", "--no-plot",
         "--eval-every", "0", "--warmup", "2", "--backend", "numpy"]


def train(tmp_path, n_ranks, *args, name="run", expect=0, quiet=True):
    summary = tmp_path / f"{name}.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.train", *(["--quiet"] if quiet else []),
                               "--output", str(tmp_path / name), "--summary", str(summary), *args], timeout=180)
    assert result.returncode == expect, result.output
    return (json.loads(summary.read_text()) if expect == 0 else None), result.output


# -- --data ------------------------------------------------------------------------------------------------


def test_data_file_problem_names_the_file_and_the_expected_format(tmp_path, data_file):
    text = tmp_path / "notes.txt"
    text.write_text("x,y\n1,2\n")
    npz = tmp_path / "arrays.npz"
    np.savez(npz, x=np.zeros(3))
    assert data_file_problem(data_file) is None
    for path, what in ((text, "is a text file"), (npz, "is a NumPy .npy/.npz file"),
                       (tmp_path / "missing.h5", "file not found"), (tmp_path, "is a directory, not a file")):
        problem = data_file_problem(path)
        assert problem.startswith(f"--data {path}: {what}; expected an HDF5 file with datasets x"), problem


@pytest.mark.parametrize("n_ranks", [1, 2, 3])
def test_a_bad_data_file_is_reported_once(tmp_path, n_ranks):
    text = tmp_path / "notes.txt"
    text.write_text("not hdf5\n")
    _, output = train(tmp_path, n_ranks, *SMALL, "--steps", "2", "--data", str(text), expect=2)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output   # once, not once per rank; no "file signature not found" riddle
    assert lines[0].startswith(f"error: --data {text}: is a text file; expected an HDF5 file")
    assert "[rank" not in output


def test_a_missing_data_file_is_reported_once(tmp_path):
    _, output = train(tmp_path, 2, *SMALL, "--steps", "2", "--data", str(tmp_path / "nope.h5"), expect=2)
    assert output.count("error:") == 1 and "[rank" not in output and "nope.h5: file not found" in output


# -- the learning-rate schedule on restart ----------------------------------------------------------------

PLAN = {"lr": 1e-3, "warmup_steps": 2, "min_lr": 0.0, "total_steps": 10}


def test_check_schedule_keeps_the_planned_cosine_end():
    shorter, note = check_schedule("ckpt", PLAN, {**PLAN, "total_steps": 8}, 8, reschedule=False)
    assert shorter == PLAN and "continues" in note
    same, note = check_schedule("ckpt", PLAN, dict(PLAN), 10, reschedule=False)
    assert same == PLAN and note is None
    with pytest.raises(ConfigurationError, match="--steps 20 goes past the end of the checkpoint's cosine schedule"):
        check_schedule("ckpt", PLAN, {**PLAN, "total_steps": 20}, 20, reschedule=False)
    with pytest.raises(ConfigurationError, match="changes the learning-rate schedule"):
        check_schedule("ckpt", PLAN, {**PLAN, "lr": 0.5}, 10, reschedule=False)
    replanned, note = check_schedule("ckpt", PLAN, {**PLAN, "total_steps": 20}, 20, reschedule=True)
    assert replanned["total_steps"] == 20 and "re-planned" in note


def test_a_restart_with_other_steps_continues_the_original_schedule(tmp_path, data_file):
    args = [*SMALL, "--data", data_file]
    straight, _ = train(tmp_path, 2, *args, "--steps", "10", "--checkpoint-every", "5", name="straight")
    checkpoint = str(tmp_path / "straight" / "checkpoints" / "ckpt_000000005")
    # fewer steps: the same cosine curve as the 10-step plan, so the same losses up to step 8
    short, output = train(tmp_path, 2, *args, "--steps", "8", "--restart", checkpoint, name="short", quiet=False)
    assert short["diagnostics"]["loss_curve"] == straight["diagnostics"]["loss_curve"][:8]
    assert "cosine decay planned to step 10 continues" in output
    assert (short["steps"], short["first_step"], short["final_step"]) == (3, 5, 8)
    # more steps than planned: refused with the fix, before any step
    _, output = train(tmp_path, 2, *args, "--steps", "20", "--restart", checkpoint, name="long", expect=2)
    assert output.count("error:") == 1 and "--steps 20 goes past the end" in output and "--reschedule" in output
    # ... unless asked for explicitly
    longer, _ = train(tmp_path, 2, *args, "--steps", "20", "--restart", checkpoint, "--reschedule", name="resched")
    assert longer["final_step"] == 20
    assert longer["diagnostics"]["loss_curve"][:5] == straight["diagnostics"]["loss_curve"][:5]
