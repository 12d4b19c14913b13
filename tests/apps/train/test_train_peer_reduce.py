"""``--allreduce peer`` on the CPU: who owns which half, the configuration checks, the options.

The copy-engine reduction itself needs 2 GPUs (``test_train_peer_reduce_gpu.py``); here every
way to ask for it where it cannot work must end in one clear ConfigurationError, raised the
same on every rank before any collective.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcgpu.errors import ConfigurationError

from apps.train.app import build_parser
from apps.train.parallel.distributed import DataParallel, check_allreduce, make_sync
from apps.train.parallel.peer_reduce import check_peer_reduce, owned_range


@pytest.mark.parametrize("lo, hi", [(0, 0), (5, 6), (0, 7), (10, 20), (3, 1002)])
def test_the_two_owned_halves_tile_each_bucket(lo, hi):
    """Rank 0 sums [lo, mid), rank 1 [mid, hi): together the bucket, without overlap;
    an odd bucket gives rank 1 the extra element (a 1-element bucket leaves rank 0 none)."""
    (lo0, hi0), (lo1, hi1) = owned_range(lo, hi, 0), owned_range(lo, hi, 1)
    assert (lo0, hi1) == (lo, hi) and hi0 == lo1
    assert (hi1 - lo1) - (hi0 - lo0) == (hi - lo) % 2


def test_every_problem_is_named_in_one_message():
    with pytest.raises(ConfigurationError) as info:
        check_peer_reduce(SimpleNamespace(size=3, n_nodes=2), is_gpu=False, zero_stage=1)
    message = str(info.value)
    assert message.startswith("--allreduce peer cannot be used")
    for expected in ("needs GPUs", "exactly 2 ranks, found 3", "one node only; the job spans 2 nodes", "--zero 1"):
        assert expected in message, message


def test_two_gpus_of_one_node_pass_and_an_unknown_backend_is_not_judged():
    check_peer_reduce(SimpleNamespace(size=2, n_nodes=1), is_gpu=True, zero_stage=0)
    check_peer_reduce(SimpleNamespace(size=2, n_nodes=1), is_gpu=None)   # --backend auto: decided later
    check_allreduce(SimpleNamespace(size=5, n_nodes=3), "nccl", is_gpu=False, zero_stage=1)   # no limits
    with pytest.raises(ConfigurationError, match="expected one of nccl, peer, found 'mpi'"):
        check_allreduce(SimpleNamespace(size=2, n_nodes=1), "mpi")


@pytest.mark.mpi(ranks=[1, 2, 3], timeout=90)
def test_peer_on_the_cpu_or_a_wrong_rank_count_is_refused_on_every_rank(comm):
    import hpcgpu

    arch = hpcgpu.arch.CPU()
    with pytest.raises(ConfigurationError) as info:
        DataParallel(comm, arch, bucket_mb=1.0, allreduce="peer")
    message = str(info.value)
    assert "needs GPUs" in message
    assert ("exactly 2 ranks" in message) == (comm.size != 2), message
    with pytest.raises(ConfigurationError, match="--zero 1"):
        make_sync(comm, arch, zero_stage=1, allreduce="peer")
    # the default still works, and nothing above left a collective half-done
    sync = make_sync(comm, arch, zero_stage=0, bucket_mb=1.0)
    assert sync.allreduce == "nccl"
    comm.barrier()


def test_allreduce_option_parses():
    parser = build_parser(rank=0)
    assert parser.parse_args([]).allreduce == "nccl"
    assert parser.parse_args(["--allreduce", "peer"]).allreduce == "peer"
    with pytest.raises(ConfigurationError, match="invalid choice"):
        parser.parse_args(["--allreduce", "ring"])
    text = parser.format_help()
    assert "--allreduce" in text and "copy engines" in text


def test_benchmark_takes_the_allreduce_option():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    try:
        import train_ddp
    finally:
        sys.path.pop(0)
    assert train_ddp.parse_arguments([]).allreduce == "nccl"
    assert train_ddp.parse_arguments(["--allreduce", "peer"]).allreduce == "peer"


@pytest.mark.parametrize("args, expected", [
    (["--backend", "numpy", "--allreduce", "peer"], "it needs GPUs (--backend cupy)"),
    (["--allreduce", "peer", "--zero", "1"], "--zero 0 only"),
])
def test_app_refuses_peer_before_training(tmp_path, args, expected):
    from hpcgpu.jobs.launch import run_mpi

    result = run_mpi(2, [sys.executable, "-m", "apps.train", "--quiet", "--steps", "1",
                         "--output", str(tmp_path / "out"), *args], timeout=90)
    assert result.returncode == 2, result.output
    assert "--allreduce peer cannot be used" in result.output and expected in result.output, result.output
    assert result.output.count("error:") == 1, result.output
