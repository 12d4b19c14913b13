"""Benchmarks print only believable numbers (issue 24).

``hpcgpu.bench halo`` on one rank reported 9,388 GB/s (nothing crossed a link); the scaling study
printed 105-336% efficiency on 2 cores without a word about oversubscription.
"""

import json
import sys

import pytest

from hpcgpu.bench.halo import bandwidth, peer_kind
from hpcgpu.bench.scaling import physical_cores, scaling_warnings
from hpcgpu.jobs.launch import run_mpi


def test_bandwidth_is_reported_only_for_a_link_and_below_the_copy_rate():
    assert peer_kind(1, periodic=False) == "no neighbour"
    assert peer_kind(1, periodic=True) == "local copy"
    assert peer_kind(2, periodic=False) == "remote"
    assert bandwidth(4096, 1e-6, "remote", ceiling=10e9) == (pytest.approx(4.096), "")
    assert bandwidth(4096, 1e-9, "remote", ceiling=10e9) == (None, "above memory copy rate")
    assert bandwidth(4096, 1e-6, "local copy", ceiling=10e9) == (None, "local copy")


@pytest.mark.parametrize("n_ranks, periodic, kind", [(1, False, "no neighbour"), (1, True, "local copy"),
                                                     (2, False, "remote")])
def test_halo_bench_rows(tmp_path, n_ranks, periodic, kind):
    out = tmp_path / "halo.json"
    args = [sys.executable, "-m", "hpcgpu.bench", "halo", "--backend", "numpy", "--sizes", "1,65536",
            "--layouts", "rows", "--seconds", "0.02", "--json", str(out)] + (["--periodic"] if periodic else [])
    result = run_mpi(n_ranks, args, timeout=120)
    assert result.returncode == 0, result.output
    record = json.loads(out.read_text())
    ceiling = record["meta"]["memory_copy_gigabytes_per_second"]
    assert record["meta"]["peer"] == kind and ceiling > 0
    for row in record["results"]:
        assert row["peer"] == kind
        if kind != "remote":
            assert row["gigabytes_per_second"] is None and row["note"] == kind
        elif row["gigabytes_per_second"] is not None:
            assert row["gigabytes_per_second"] <= ceiling
    if kind != "remote":
        assert "no other rank to exchange with" in result.output


def test_scaling_warns_about_oversubscription_and_superlinear_efficiency():
    rows = [{"status": "ok", "n_ranks": 1, "efficiency": 1.0, "backend": "cpu"},
            {"status": "ok", "n_ranks": 2, "efficiency": 0.9, "backend": "cpu"},
            {"status": "ok", "n_ranks": 4, "efficiency": 3.36, "backend": "cpu"}]
    oversubscribed, superlinear = scaling_warnings(rows, cores=2)
    assert oversubscribed.startswith("warning: oversubscribed: 4 rank(s) on 2 physical core(s)")
    assert "336% at 4 ranks" in superlinear and "superlinear or noise" in superlinear
    assert scaling_warnings(rows[:2], cores=2) == []
    assert scaling_warnings(rows[:2], cores=None) == []
    assert 1 <= physical_cores()
