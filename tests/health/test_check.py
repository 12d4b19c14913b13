"""``hpcgpu check`` on CPU ranks: the real command (exit codes, JSON, the exclude file) and, with an
injected NVML source, a node whose GPU has an uncorrectable ECC error is failed and excluded."""

import argparse
import json
import sys

import pytest

from hpcgpu.jobs.launch import run_mpi
from tests.health.fake_nvml import FakeSource

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def check_options(*argv):
    from hpcgpu.health.check import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.mpi(ranks=[1, 2, 3])
def test_check_runs_every_cpu_check_and_agrees_on_every_rank(comm, tmp_path):
    from hpcgpu.health.check import collect

    report = collect(comm, check_options("--checkpoint-dir", str(tmp_path)))
    checks = {f["check"]: f for f in report["findings"]}
    assert checks["gpu checks"]["status"] == "skip" and "no GPU" in checks["gpu checks"]["detail"]
    assert checks["versions"]["status"] == "ok" and checks["free space"]["status"] == "ok"
    if comm.size > 1:
        pairs = checks["link bandwidth"]["values"]["pairs"]
        assert len(pairs) == (1 if comm.size == 2 else comm.size)
        assert all(p["bytes_per_second"] > 0 for p in pairs)
        assert "slowest ranks" in checks["link bandwidth"]["detail"] and checks["allreduce"]["status"] == "ok"
    assert report["verdict"] in ("ok", "warn") and report["n_ranks"] == comm.size
    assert comm.mpi.allgather(report["exit_code"]) == [report["exit_code"]] * comm.size


@pytest.mark.mpi(ranks=[2])
def test_an_injected_ecc_error_fails_and_excludes_the_node(comm):
    from hpcgpu.health.check import collect

    # Two GPUs on this node; rank 1's has uncorrectable ECC errors and a fatal XID.
    source = FakeSource({"0000:3b:00": {}, "0000:5e:00": {"ecc_volatile": 3}}, xids={"0000:5e:00": [79]})
    report = collect(comm, check_options("--no-probes"), gpu_source=source)
    failed = [(f["check"], f["rank"]) for f in report["findings"] if f["status"] == "fail"]
    assert sorted(failed) == [("ecc", 1), ("xid", 1)]
    assert report["verdict"] == "fail" and report["exit_code"] == 4
    assert report["exclude_nodes"] == [comm.hostname]
    count = next(f for f in report["findings"] if f["check"] == "gpu count")
    assert count["status"] == "ok" and count["values"]["visible"] == 2


def test_the_command_exit_codes_json_and_exclude_file(tmp_path):
    report_path, exclude = tmp_path / "check.json", tmp_path / "exclude.txt"
    healthy = run_mpi(2, [sys.executable, "-m", "hpcgpu", "check", "--json", str(report_path), "--exclude-file",
                          str(exclude), "--checkpoint-dir", str(tmp_path)], timeout=120, cwd=str(ROOT))
    assert healthy.returncode == 0, healthy.output
    assert "hpcgpu check: HEALTHY" in healthy.output and "node " in healthy.output
    report = json.loads(report_path.read_text())
    assert report["verdict"] == "ok" and report["exit_code"] == 0 and exclude.read_text() == "\n"
    full = run_mpi(2, [sys.executable, "-m", "hpcgpu", "check", "--no-probes", "--need", "1000T",
                       "--checkpoint-dir", str(tmp_path), "--json", str(report_path)], timeout=120, cwd=str(ROOT))
    assert full.returncode == 4, full.output
    assert "FAILED" in full.output and "free space" in full.output
    # One node, and it fails the shared check: nothing to exclude (another node would fail it too).
    assert json.loads(report_path.read_text())["exclude_nodes"] == []
    usage = run_mpi(1, [sys.executable, "-m", "hpcgpu", "check", "--need", "lots"], timeout=60, cwd=str(ROOT))
    assert usage.returncode == 2 and "expected a size" in usage.output
