"""``jobscripts/mpirun/simulate-nodes.sh``: the NCCL host id of each rank follows the same pretend nodes
as ``HPCGPU_SIMULATE_NODES`` in the decomposition (hpcgpu.decomposition.comm.simulated_nodes)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from hpcgpu.decomposition.comm import simulated_nodes
from tests.jobscripts._slurm import JOBSCRIPTS

WRAPPER = JOBSCRIPTS / "mpirun" / "simulate-nodes.sh"


def host_id(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(WRAPPER), "bash", "-c", 'echo "${NCCL_HOSTID-unset}"'],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("setting, n_ranks", [("2", 4), ("2:cyclic", 4), ("3", 8), ("3:cyclic", 5), ("1", 3)])
@pytest.mark.parametrize("rank_variable, size_variable", [("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                                          ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")])
def test_host_ids_match_the_decomposition_nodes(setting, n_ranks, rank_variable, size_variable):
    expected = simulated_nodes(setting, n_ranks)
    for rank in range(n_ranks):
        result = host_id({"HPCGPU_SIMULATE_NODES": setting, rank_variable: str(rank), size_variable: str(n_ranks)})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{socket.gethostname()}-node{expected[rank]}"


def test_unset_kept_and_bad_settings():
    assert host_id({"PMI_RANK": "0", "PMI_SIZE": "2"}).stdout.strip() == "unset"
    kept = host_id({"HPCGPU_SIMULATE_NODES": "2", "PMI_RANK": "1", "PMI_SIZE": "2", "NCCL_HOSTID": "mine"})
    assert kept.stdout.strip() == "mine"
    for bad in ("3", "0", "x", "2:random"):
        result = host_id({"HPCGPU_SIMULATE_NODES": bad, "PMI_RANK": "0", "PMI_SIZE": "2"})
        assert result.returncode == 2 and "expected K, K:block or K:cyclic with 1 <= K <= 2" in result.stderr
    alone = host_id({"HPCGPU_SIMULATE_NODES": "2"})
    assert alone.returncode == 0 and alone.stdout.strip() == "unset" and "no world rank/size" in alone.stderr
