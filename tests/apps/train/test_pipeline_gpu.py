"""Pipeline and tensor parallelism on GPUs: NCCL point-to-point between stages, NCCL allreduce in
the tensor group, against the one-process run.

On the GPU machine::

    python -m pytest tests/apps/train/test_pipeline_gpu.py -m gpu            # 1 GPU: the 1-rank cases
    (2 GPUs: the 1 x 1 x 2 and 1 x 2 x 1 cases; 4 GPUs: 1 x 2 x 2)

NCCL refuses two ranks of one communicator on the same GPU, so every multi-rank NCCL case needs one
GPU per rank (the ``mpi`` + ``gpu`` markers skip it otherwise). On ONE GPU,
:func:`test_gpu_split_model_on_one_shared_gpu_host_staged` runs 1 x 1 x 2 and 1 x 2 x 1 with two
ranks sharing the GPU (``HPCGPU_ALLOW_GPU_SHARING=1``) over the host-staged transport
(``HPCGPU_TRANSPORT=mpi-staged``): the GPU engine, the staged pipeline sender and the staged tensor
allreduce, not NCCL. Tolerance: the CPU tests' 1e-10 relative
over 50 fp64 steps (the split products and micro-batches add partial sums in another order; GPU
BLAS rounds differently from the CPU's only in those last places in fp64).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from distributed_cases import gpu_arch_or_skip, synthetic_data, train_steps
from test_comm_volume import assert_measured_equals_computed
from test_tensor_parallel import LOSS_TOLERANCE, SPEC, relative, train_config

from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer

pytestmark = pytest.mark.gpu
STEPS = 50


def gpu_curve(grid, arch, micro_batches=1, schedule="1f1b"):
    """Losses and unsplit final parameters of ``STEPS`` fp64 steps on ``grid`` (every rank)."""
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(STEPS), arch=arch, micro_batches=micro_batches,
                             schedule=schedule, bucket_mb=0.002)
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=grid.data_rank, n_ranks=grid.data_size,
                       arch=arch) as loader:
        losses = np.array(train_steps(runner, loader, STEPS))
    return losses, runner.full_parameters(), runner


def references(comm, arch):
    """The 1 x 1 x 1 run of this rank alone: on the CPU, and on this rank's GPU."""
    import hpcgpu

    alone = hpcgpu.Communicator(comm.mpi.Split(comm.rank, 0))
    cpu = gpu_curve(make_grid(alone, 1, 1, 1), hpcgpu.arch.CPU())
    gpu = gpu_curve(make_grid(alone, 1, 1, 1), arch)
    return cpu, gpu


@pytest.mark.mpi(ranks=[1], timeout=300)
def test_gpu_one_rank_micro_batches_match_the_cpu(comm):
    """1 x 1 x 1 on one GPU with M = 1 and M = 4 (accumulation through the engine) equals the CPU
    one-process run to 1e-10 relative."""
    arch = gpu_arch_or_skip(comm)
    (cpu_losses, cpu_params, _), (gpu_losses, gpu_params, _) = references(comm, arch)
    assert relative(gpu_losses, cpu_losses) <= LOSS_TOLERANCE
    assert relative(gpu_params, cpu_params) <= LOSS_TOLERANCE
    losses, params, _ = gpu_curve(make_grid(comm, 1, 1, 1), arch, micro_batches=4)
    assert relative(losses, cpu_losses) <= LOSS_TOLERANCE


@pytest.mark.mpi(ranks=[2], timeout=300)
def test_gpu_two_stage_pipeline_over_nccl_matches_one_process(comm):
    """1 x 1 x 2, M = 4, 1F1B and GPipe, activations and gradients over NCCL send/recv: the losses and
    final parameters equal the one-process runs (GPU and CPU) to 1e-10; the bytes sent equal the
    formula; 1F1B and GPipe give the same run."""
    arch = gpu_arch_or_skip(comm)
    (cpu_losses, cpu_params, _), (gpu_losses, _, _) = references(comm, arch)
    grid = make_grid(comm, 1, 1, 2)
    runs = {}
    for schedule in ("1f1b", "gpipe"):
        losses, params, runner = gpu_curve(grid, arch, micro_batches=4, schedule=schedule)
        if runner.grid.world.job_transport.choices["gpu"].name == "nccl":
            assert runner.engine.p2p.movers.name == "nccl"
        assert relative(losses, cpu_losses) <= LOSS_TOLERANCE, (schedule, losses[-3:], cpu_losses[-3:])
        assert relative(losses, gpu_losses) <= LOSS_TOLERANCE, schedule
        assert relative(params, cpu_params) <= LOSS_TOLERANCE, schedule
        assert_measured_equals_computed(runner)
        runs[schedule] = losses
    assert np.array_equal(runs["1f1b"], runs["gpipe"])


@pytest.mark.mpi(ranks=[2], timeout=300)
def test_gpu_tensor_parallel_over_nccl_matches_one_process(comm):
    """1 x 2 x 1: the tensor group's allreduces run with NCCL on device arrays (no host copies);
    50 steps equal the one-process runs to 1e-10."""
    arch = gpu_arch_or_skip(comm)
    (cpu_losses, cpu_params, _), _ = references(comm, arch)
    losses, params, runner = gpu_curve(make_grid(comm, 1, 2, 1), arch)
    group = runner.communication.tensor_group
    if runner.grid.world.job_transport.choices["gpu"].name == "nccl":
        assert type(group.collectives).__name__ == "NcclCollectives"
    assert relative(losses, cpu_losses) <= LOSS_TOLERANCE
    assert relative(params, cpu_params) <= LOSS_TOLERANCE
    assert_measured_equals_computed(runner)


@pytest.mark.mpi(ranks=[4], timeout=400)
def test_gpu_tensor_and_pipeline_grid_matches_one_process(comm):
    """1 x 2 x 2, M = 3 (four GPUs): NCCL allreduce in each stage's tensor pair, NCCL send/recv
    between the stages."""
    arch = gpu_arch_or_skip(comm)
    (cpu_losses, _, _), _ = references(comm, arch)
    losses, _, runner = gpu_curve(make_grid(comm, 1, 2, 2), arch, micro_batches=3)
    assert relative(losses, cpu_losses) <= LOSS_TOLERANCE
    assert_measured_equals_computed(runner)


def shared_gpu_body():
    """Two ranks on one GPU, host-staged: 1 x 1 x 2 (M = 4, 1F1B) and 1 x 2 x 1 against the CPU."""
    import hpcgpu

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="cupy")
    (cpu_losses, cpu_params, _), _ = references(comm, arch)
    for sizes, micro_batches in (((1, 1, 2), 4), ((1, 2, 1), 1)):
        losses, params, runner = gpu_curve(make_grid(comm, *sizes), arch, micro_batches=micro_batches)
        if sizes[2] > 1:
            assert runner.engine.p2p.movers.name == "mpi-staged", runner.engine.p2p.movers
        assert relative(losses, cpu_losses) <= LOSS_TOLERANCE, (sizes, losses[-3:], cpu_losses[-3:])
        assert relative(params, cpu_params) <= LOSS_TOLERANCE, sizes
        assert_measured_equals_computed(runner)
        report = runner.pipeline_report()
        assert all(0.0 <= value < 1.0 for value in report["bubble_measured"]), report
        if comm.rank == 0:
            print(f"{sizes}: loss {relative(losses, cpu_losses):.2e}, bubble {report['bubble_measured']}")
    print(f"[rank {comm.rank}] shared-GPU body passed", flush=True)


@pytest.mark.gpus(1)
def test_gpu_split_model_on_one_shared_gpu_host_staged():
    from hpcgpu.jobs.launch import run_mpi

    here = Path(__file__).parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parents[2])!r}]; "
            "import test_pipeline_gpu; test_pipeline_gpu.shared_gpu_body()")
    result = run_mpi(2, [sys.executable, "-c", code], timeout=400,
                     env={"HPCGPU_ALLOW_GPU_SHARING": "1", "HPCGPU_TRANSPORT": "mpi-staged"})
    assert result.returncode == 0, result.output
    assert result.output.count("shared-GPU body passed") == 2, result.output
