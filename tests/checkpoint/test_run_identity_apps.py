"""Issue 24 end to end with ``apps.stencil``: a fresh run B in run A's checkpoint directory.

Run A (1 rank, 40 steps, a checkpoint every 10, keep 3) leaves steps 20, 30 and 40; each test works
on a copy of that directory.
"""

import shutil
import sys
from pathlib import Path

import h5py
import pytest

from hpcgpu.jobs.launch import run_mpi
from tests.checkpoint.test_run_identity import file_hashes, names

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--nx", "36", "--ny", "18", "--backend", "numpy", "--no-plot", "--snapshot-every", "0"]


def stencil(n_ranks, tmp_path, name, *args):
    return run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", *BASE, "--output", str(tmp_path / name),
                             *map(str, args)], timeout=180, cwd=str(ROOT))


def run_id_of(checkpoint):
    with h5py.File(Path(checkpoint) / "checkpoint.h5", "r") as master:
        return master.attrs["run_id"]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    where = tmp_path_factory.mktemp("run_a")
    result = stencil(1, where, "a", "--quiet", "--steps", 40, "--checkpoint-every", 10, "--checkpoint-dir",
                     where / "ckpt")
    assert result.returncode == 0, result.output
    assert names(where / "ckpt") == ["ckpt_000000020", "ckpt_000000030", "ckpt_000000040"]
    return where / "ckpt", run_id_of(where / "ckpt" / "ckpt_000000040")


@pytest.fixture
def shared(tmp_path, run_a):
    """A copy of run A's checkpoint directory, A's run id, and the hashes of its files."""
    directory = tmp_path / "ckpt"
    shutil.copytree(run_a[0], directory)
    return directory, run_a[1], file_hashes(directory)


def test_a_fresh_run_in_another_runs_directory_refuses_with_exit_2_and_changes_nothing(tmp_path, shared):
    directory, run_a_id, before = shared
    result = stencil(2, tmp_path, "b", "--quiet", "--steps", 40, "--checkpoint-every", 10,
                     "--checkpoint-dir", directory)
    assert result.returncode == 2, result.output
    for expected in (str(directory), f"run {run_a_id} (steps 20, 30, 40)", "--restart latest", "--checkpoint-dir",
                     "--share-checkpoint-dir"):
        assert expected in result.output, result.output
    assert result.output.count("error:") == 1, "one message (rank 0), not one per rank"
    assert file_hashes(directory) == before


def test_share_checkpoint_dir_runs_beside_the_other_run_and_never_touches_it(tmp_path, shared):
    directory, run_a_id, before = shared
    result = stencil(2, tmp_path, "b", "--quiet", "--steps", 35, "--checkpoint-every", 7, "--keep", 2,
                     "--checkpoint-dir", directory, "--share-checkpoint-dir")
    assert result.returncode == 0, result.output
    assert names(directory) == ["ckpt_000000020", "ckpt_000000028", "ckpt_000000030", "ckpt_000000035",
                                "ckpt_000000040"], "B pruned its own 7, 14, 21 and nothing of A's"
    assert file_hashes(directory, {"ckpt_000000020", "ckpt_000000030", "ckpt_000000040"}) == before
    run_b_id = run_id_of(directory / "ckpt_000000035")
    assert run_b_id != run_a_id and run_id_of(directory / "ckpt_000000028") == run_b_id

    # --restart latest: both runs are compatible; B's checkpoints are the newest, and the app says so.
    resumed = stencil(1, tmp_path, "c", "--steps", 42, "--checkpoint-every", 7, "--keep", 2,
                      "--checkpoint-dir", directory, "--restart", "latest")
    assert resumed.returncode == 0, resumed.output
    assert f"chose the newest compatible one (run {run_b_id}, step 35)" in resumed.output, resumed.output
    assert run_id_of(directory / "ckpt_000000042") == run_b_id, "a restarted run continues its run id"
    assert names(directory) == ["ckpt_000000020", "ckpt_000000030", "ckpt_000000035", "ckpt_000000040",
                                "ckpt_000000042"]
    assert file_hashes(directory, {"ckpt_000000020", "ckpt_000000030", "ckpt_000000040"}) == before


def test_restart_latest_with_another_configuration_refuses_and_names_the_option(tmp_path, shared):
    directory, _, before = shared
    result = stencil(1, tmp_path, "b", "--quiet", "--nx", 48, "--steps", 50, "--checkpoint-every", 10,
                     "--checkpoint-dir", directory, "--restart", "latest")
    assert result.returncode == 2, result.output
    assert "--nx: 36 in the checkpoint, 48 in this run" in result.output, result.output
    assert file_hashes(directory) == before


def test_restart_compares_resolved_values_an_unset_option_equals_its_default_given(tmp_path, shared):
    """Run A left --hyperviscosity unset (1e9 is used): giving 1e9 continues it, 5e8 is refused."""
    directory, _, _ = shared
    same = stencil(2, tmp_path, "b", "--quiet", "--steps", 50, "--checkpoint-every", 10, "--checkpoint-dir",
                   directory, "--restart", "latest", "--hyperviscosity", "1e9")
    assert same.returncode == 0, same.output
    other = stencil(1, tmp_path, "c", "--quiet", "--steps", 60, "--checkpoint-dir", directory, "--restart", "latest",
                    "--hyperviscosity", "5e8")
    assert other.returncode == 2, other.output
    assert "--hyperviscosity: 1000000000.0 in the checkpoint, 500000000.0 in this run" in other.output, other.output


def test_a_checkpoint_that_recorded_an_option_unset_is_compared_resolved(tmp_path, shared):
    """Checkpoints written before a model declared its unset values recorded null: resolved the same way."""
    import json

    from hpcgpu.checkpoint import identity

    directory, _, _ = shared
    for checkpoint in sorted(directory.iterdir()):
        with h5py.File(checkpoint / "checkpoint.h5", "r+") as master:
            options = json.loads(master.attrs[identity.OPTIONS_ATTRIBUTE])
            assert options["--hyperviscosity"] == 1e9
            options["--hyperviscosity"] = None
            master.attrs[identity.OPTIONS_ATTRIBUTE] = json.dumps(options, sort_keys=True)
            master.attrs[identity.FINGERPRINT_ATTRIBUTE] = identity.fingerprint(options)
    result = stencil(1, tmp_path, "b", "--quiet", "--steps", 50, "--checkpoint-dir", directory, "--restart", "latest",
                     "--hyperviscosity", "1e9")
    assert result.returncode == 0, result.output
    refused = stencil(1, tmp_path, "c", "--quiet", "--steps", 50, "--checkpoint-dir", directory, "--restart",
                      "latest", "--hyperviscosity", "5e8")
    assert refused.returncode == 2 and "--hyperviscosity" in refused.output, refused.output


def test_resolving_unset_options():
    from hpcgpu.app.checkpointing import resolve_unset_options

    unset = {"hyperviscosity": 1e9, "target_temperature": lambda options: options["--temperature"]}
    assert resolve_unset_options({"--hyperviscosity": None, "--nx": 4}, unset) == {"--hyperviscosity": 1e9, "--nx": 4}
    assert resolve_unset_options({"--hyperviscosity": 5.0}, unset) == {"--hyperviscosity": 5.0}
    assert resolve_unset_options({"--target-temperature": None, "--temperature": 1.5}, unset) == \
        {"--target-temperature": 1.5, "--temperature": 1.5}
    assert resolve_unset_options(None, unset) is None
