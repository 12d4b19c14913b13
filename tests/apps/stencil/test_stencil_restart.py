"""apps.stencil restarts: bitwise equal to an uninterrupted run, across rank counts, after a stop signal."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcgpu.jobs.launch import mpiexec_command, run_mpi

SMALL = {
    "swe": ["--model", "swe", "--nx", "48", "--ny", "24", "--no-plot", "--snapshot-every", "0"],
    "jacobi": ["--model", "jacobi", "--nx", "64", "--ny", "40", "--norm-every", "5"],
}


def run_app(n_ranks, *args, timeout=180):
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", "--quiet", *args], timeout=timeout)
    return result


def checksum(path):
    return json.loads(path.read_text())["checksum"]


@pytest.mark.parametrize("model", ["swe", "jacobi"])
def test_ten_steps_checkpoint_restart_ten_steps_equals_twenty_steps(tmp_path, model):
    base = SMALL[model]
    ckpt = tmp_path / "ckpt"
    assert run_app(2, *base, "--steps", "20", "--output", str(tmp_path / "full"),
                   "--summary", str(tmp_path / "full.json")).returncode == 0
    first = run_app(2, *base, "--steps", "10", "--checkpoint-every", "10", "--checkpoint-dir", str(ckpt),
                    "--output", str(tmp_path / "a"))
    assert first.returncode == 0, first.output
    second = run_app(2, *base, "--steps", "20", "--restart", "latest", "--checkpoint-dir", str(ckpt),
                     "--output", str(tmp_path / "b"), "--summary", str(tmp_path / "b.json"))
    assert second.returncode == 0, second.output
    assert checksum(tmp_path / "b.json") == checksum(tmp_path / "full.json")


def test_elastic_restart_4_then_2_then_3_ranks_is_bitwise_identical(tmp_path):
    base = SMALL["swe"]
    ckpt = str(tmp_path / "ckpt")
    assert run_app(1, *base, "--steps", "24", "--output", str(tmp_path / "full"),
                   "--summary", str(tmp_path / "full.json")).returncode == 0
    for n_ranks, steps in [(4, 8), (2, 16), (3, 24)]:
        result = run_app(n_ranks, *base, "--steps", str(steps), "--checkpoint-every", "8", "--checkpoint-dir", ckpt,
                         "--restart", "latest", "--output", str(tmp_path / f"r{n_ranks}"),
                         "--summary", str(tmp_path / f"r{n_ranks}.json"))
        assert result.returncode == 0, result.output
    assert checksum(tmp_path / "r3.json") == checksum(tmp_path / "full.json")


def test_wall_time_limit_checkpoints_and_exits_75_then_the_chain_completes(tmp_path):
    base = SMALL["jacobi"] + ["--nx", "512", "--ny", "512"]
    ckpt = str(tmp_path / "ckpt")
    assert run_app(2, *base, "--steps", "20000", "--output", str(tmp_path / "full"),
                   "--summary", str(tmp_path / "full.json")).returncode == 0
    stopped = run_app(2, *base, "--steps", "20000", "--wall-time-limit", "1.5", "--checkpoint-dir", ckpt,
                      "--output", str(tmp_path / "a"))
    assert stopped.returncode == 75, stopped.output
    assert os.listdir(ckpt), "the stop must leave a checkpoint"
    done = run_app(2, *base, "--steps", "20000", "--restart", "latest", "--checkpoint-dir", ckpt,
                   "--output", str(tmp_path / "b"), "--summary", str(tmp_path / "b.json"))
    assert done.returncode == 0, done.output
    assert checksum(tmp_path / "b.json") == checksum(tmp_path / "full.json")


def test_sigusr1_to_one_rank_checkpoints_and_exits_75(tmp_path):
    marker = tmp_path / "signal-run"
    ckpt = tmp_path / "ckpt"
    command = mpiexec_command(2, [sys.executable, "-m", "apps.stencil", "--quiet", *SMALL["jacobi"],
                                  "--nx", "1024", "--ny", "1024", "--steps", "100000", "--checkpoint-every", "20",
                                  "--checkpoint-dir", str(ckpt), "--output", str(marker)])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (ckpt.exists() and any(p.name.startswith("ckpt_") and not p.name.endswith(".tmp")
                                         for p in ckpt.iterdir())):
            assert time.monotonic() < deadline and process.poll() is None, "the run never wrote a checkpoint"
            time.sleep(0.2)
        ranks = subprocess.run(["pgrep", "-f", "--", f"--output {marker}"], capture_output=True, text=True).stdout.split()
        python_ranks = [int(pid) for pid in ranks
                        if "apps.stencil" in open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
                        and open(f"/proc/{pid}/cmdline").read().startswith(sys.executable)]
        assert python_ranks, ranks
        os.kill(python_ranks[-1], signal.SIGUSR1)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 75, output
    steps = sorted(int(p.name[5:]) for p in ckpt.iterdir() if not p.name.endswith(".tmp"))
    assert steps, "the stop must leave a complete checkpoint"
