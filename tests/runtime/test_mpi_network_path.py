"""The inter-node code path on one host with CPU ranks: MPICH's network module between ranks of one machine.

``MPIR_CVAR_NOLOCAL=1`` makes MPICH treat every rank as if on its own host: no shared-memory transport,
and ``MPI_Comm_split_type(SHARED)`` gives one rank per group, so the framework's node detection sees one
node per rank (its placement, the header's inter-node traffic); ``MPIR_CVAR_CH4_NETMOD=ofi`` with
``FI_PROVIDER=tcp`` sends the bytes through libfabric's TCP provider over loopback (without them the
UCX module may still use shared memory underneath). Every app must give the plain run's checksum.
What the path costs (latency, bandwidth, overlap) is measured in docs/multinode.md, not here.
"""

import json
import os
import sys

import pytest

from hpcgpu.jobs.launch import run_mpi

from tests.helpers.app_runs import ROOT, run_app_summary

NETWORK_PATH = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
"""MPICH's variables for the network path between ranks of one host (docs/multinode.md)."""


def _mpi_library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version()


pytestmark = pytest.mark.skipif(not _mpi_library().startswith("MPICH"),
                                reason="the network-path variables are MPICH's (Open MPI: --mca btl self,tcp)")


def run(module_args, network: bool, tmp_path):
    """(summary, output) of ``module_args`` on 2 ranks, plain (the variables removed) or over the network path."""
    env = NETWORK_PATH if network else dict.fromkeys(NETWORK_PATH)
    return run_app_summary(2, [*module_args, "--no-plot"], tmp_path / ("network" if network else "plain"), env=env)


@pytest.mark.parametrize("args", [
    ["apps.stencil", "--model", "jacobi", "--nx", "64", "--ny", "48", "--steps", "20"],
    ["apps.stencil", "--model", "swe", "--nx", "48", "--ny", "32", "--steps", "5", "--snapshot-every", "0"],
    ["apps.stencil", "--grid", "latlon", "--nx", "48", "--ny", "24", "--steps", "5", "--snapshot-every", "0"],
    ["apps.md", "--cells", "8", "--steps", "10", "--dims", "2,1,1"],
    ["apps.train", "--steps", "5"],
], ids=["jacobi", "swe", "latlon", "md", "train"])
def test_each_app_gives_the_plain_checksum_over_the_network_path(args, tmp_path):
    plain, _ = run(args, False, tmp_path)
    network, output = run(args, True, tmp_path)
    assert network["checksum"] == plain["checksum"]
    assert (plain["n_nodes"], network["n_nodes"]) == (1, 2)   # the node detection saw one node per rank
    if args[0] != "apps.train":   # and the header names the halo / ghost bytes that cross nodes
        lines = [line for line in output.splitlines() if line.startswith("nodes: ")]
        assert len(lines) == 1 and "2 nodes x 1 ranks" in lines[0], output[-3000:]


def test_the_halo_benchmark_measures_a_remote_link_between_two_nodes(tmp_path):
    """Over the network path the halo benchmark's ranks are on two nodes, each size moved a message to
    the other rank (a remote peer, a positive time), and no bandwidth exceeds the memory copy rate."""
    env = dict(os.environ, NUMBA_NUM_THREADS="1", **NETWORK_PATH)
    report = tmp_path / "halo.json"
    result = run_mpi(2, [sys.executable, "-m", "hpcgpu.bench", "halo", "--backend", "numpy", "--transports", "mpi",
                         "--layouts", "rows", "--sizes", "8,65536", "--seconds", "0.1", "--json", str(report)],
                     timeout=240, env=env, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    measured = json.loads(report.read_text())
    assert measured["meta"]["nodes"].startswith("2 nodes x 1 ranks"), measured["meta"]
    rows = measured["results"]
    assert [row["values"] for row in rows] == [8, 65536], rows
    for row in rows:
        assert row["peer"] == "remote" and row["microseconds"] > 0, row
        rate = row["gigabytes_per_second"]
        assert rate is None or rate <= measured["meta"]["memory_copy_gigabytes_per_second"], row
