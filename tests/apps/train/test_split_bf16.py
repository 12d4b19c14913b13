"""bf16 mixed precision of the split model (``--model residual-mlp`` on a D x T x P grid).

bf16 as in the data-parallel path (:mod:`apps.train.training.precision`): bfloat16 activations, gradients and
compute copy of the weights, fp32 masters and optimiser state, no loss scaling, data-parallel
gradients summed in float32 and rounded once. The tensor allreduces sum bfloat16 activations (CPU:
float32 copies, rounded once; NCCL: bfloat16), the pipeline sends bfloat16 activations exactly.

Tolerances, justified by bf16's unit roundoff 2**-8 = 3.9e-3:

* a split grid against the 1 x 1 x 1 bf16 run: ``BF16_GRID = 1e-2`` (relative to the largest loss).
  The split moves roundings: T rounds each rank's partial product to bfloat16 before the sum (two
  roundings where the unsplit GEMM has one), D rounds the float32 sum of the replicas' gradients
  instead of one GEMM's, M accumulates micro-batch gradients in the bfloat16 buffer. Each is an
  error of about one bfloat16 unit in single values; over 50 AdamW steps the curves measured
  1.0e-3 (1 x 2 x 1, 2 x 1 x 1) and 1.3e-3 (1 x 1 x 2, M = 2): the bound is ~8x that, ~2.5 units,
  still far below what a real error (a missing allreduce, a double-counted shard) does to the loss.
  The fp16 split tests use 2e-3; bf16 has 3 fewer mantissa bits (8x the roundoff), which gives 1.6e-2.
* against the fp32 run, loosely: ``BF16_VS_FP32 = 2e-2`` (measured 1.3e-3 - 1.8e-3).
* P alone adds no bf16 rounding (the activations are bfloat16 on both sides of the stage boundary
  and travel exactly); what remains is the gradient norm summed per stage, which moves the clipping
  factor by an ulp now and then (fp32 shows the same: 1e-7). 1F1B and GPipe are bitwise equal.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from distributed_cases import gpu_arch_or_skip, synthetic_data, train_steps
from test_comm_volume import assert_measured_equals_computed
from test_tensor_parallel import SPEC, relative, train_config
from test_train_parallel_app import SPLIT, run_app

from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer

STEPS = 50
#: a split grid's bf16 loss curve against the 1 x 1 x 1 bf16 one (see the module docstring)
BF16_GRID = 1e-2
#: bf16 against fp32, loosely
BF16_VS_FP32 = 2e-2


def curve(grid, precision="bf16", micro_batches=1, schedule="1f1b", zero_stage=0, arch=None):
    """Losses, unsplit final parameters and the runner of ``STEPS`` steps on ``grid`` (every rank)."""
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(STEPS, precision), arch=arch,
                             micro_batches=micro_batches, schedule=schedule, bucket_mb=0.002,
                             zero_stage=zero_stage)
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=grid.data_rank, n_ranks=grid.data_size,
                       arch=arch) as loader:
        losses = np.array(train_steps(runner, loader, STEPS))
    return losses, runner.full_parameters(), runner


def alone(comm):
    """A communicator of this rank only (for the one-process references)."""
    import hpcgpu

    return hpcgpu.Communicator(comm.mpi.Split(comm.rank, 0))


def check_bf16_runner(runner):
    """fp32 masters and optimiser state, a 2-byte compute copy, no loss scaling."""
    precision = runner.state.precision
    assert precision.name == "bf16" and precision.loss_scale == 1.0
    assert precision.master_params.dtype == np.float32 and runner.itemsize == 2
    assert all(value.dtype == np.float32 for value in runner.state.optimizer_state.values()
               if getattr(value, "ndim", 0) > 0)


@pytest.mark.mpi(ranks=[2], timeout=400)
def test_bf16_grids_track_the_one_process_bf16_run(comm):
    """50 steps (AdamW, clipping, dropout) at 1 x 2 x 1, 1 x 1 x 2 (M = 2) and 2 x 1 x 1 follow the
    1 x 1 x 1 bf16 curve to BF16_GRID and the fp32 one to BF16_VS_FP32; 1F1B and GPipe give the same
    run bitwise; the bytes passed to the tensor allreduces and the pipeline sends are the formula's
    at 2 bytes a value."""
    one = make_grid(alone(comm), 1, 1, 1)
    reference, reference_params, runner = curve(one)
    check_bf16_runner(runner)
    fp32, _, _ = curve(one, precision="fp32")
    assert reference[-1] < 0.7 * reference[0]     # it learns
    assert relative(reference, fp32) <= BF16_VS_FP32
    for sizes, micro_batches in (((1, 2, 1), 1), ((1, 1, 2), 2), ((2, 1, 1), 1)):
        grid = make_grid(comm, *sizes)
        losses, params, runner = curve(grid, micro_batches=micro_batches)
        check_bf16_runner(runner)
        assert np.all(np.isfinite(params))
        assert relative(losses, reference) <= BF16_GRID, (sizes, losses[-3:], reference[-3:])
        assert relative(losses, fp32) <= BF16_VS_FP32, sizes
        assert relative(params, reference_params) <= BF16_VS_FP32, sizes
        assert_measured_equals_computed(runner)
        if comm.rank == 0:
            print(f"{grid.describe()} bf16 M={micro_batches}: loss {relative(losses, reference):.2e} vs "
                  f"1x1x1 bf16, {relative(losses, fp32):.2e} vs fp32")
        if sizes == (1, 1, 2):
            gpipe, _, _ = curve(grid, micro_batches=micro_batches, schedule="gpipe")
            assert np.array_equal(gpipe, losses)


@pytest.mark.mpi(ranks=[4], timeout=500)
def test_bf16_hybrid_grid_with_zero(comm):
    """2 x 2 x 1 in bf16, without and with ZeRO-1 over the data axis (the bfloat16 gradients
    reduce-scattered as float32 copies): both follow the one-process bf16 run to BF16_GRID, and
    ZeRO-1 the plain grid to the same bound (the norm and the reductions add in another order)."""
    reference, _, _ = curve(make_grid(alone(comm), 1, 1, 1))
    grid = make_grid(comm, 2, 2, 1)
    plain, _, _ = curve(grid)
    sharded, _, runner = curve(grid, zero_stage=1)
    check_bf16_runner(runner)
    for losses in (plain, sharded):
        assert relative(losses, reference) <= BF16_GRID, (losses[-3:], reference[-3:])
    assert relative(sharded, plain) <= BF16_GRID
    if comm.rank == 0:
        print(f"2x2x1 bf16: {relative(plain, reference):.2e}, ZeRO-1 {relative(sharded, reference):.2e}")


BF16_SPLIT = [a if a != "fp64" else "bf16" for a in SPLIT]


@pytest.mark.parametrize("flags", [["--tensor-parallel", "2"], ["--zero", "1"],
                                   ["--pipeline-parallel", "2", "--micro-batches", "2"]],
                         ids=["tensor2", "data2-zero1", "pipeline2"])
def test_bf16_split_model_restarts_bitwise(tmp_path, data_file, flags):
    """``--precision bf16 --model residual-mlp`` on 2 ranks: the run restarted from its step-10
    sharded checkpoint (fp32 masters and moments; the bfloat16 copy is their rounding) reproduces
    the uninterrupted one bit for bit; the summary records bf16 and no skipped steps."""
    checkpoints = tmp_path / "ckpt"
    args = [*BF16_SPLIT, *flags, "--data", data_file, "--steps", "20"]
    full = run_app(tmp_path / "full", 2, *args, "--checkpoint-dir", str(checkpoints),
                   "--checkpoint-every", "10")
    assert full["precision"] == "bf16"
    assert full["diagnostics"]["skipped_steps"] == 0
    assert full["diagnostics"]["loss_curve"][-1] < full["diagnostics"]["loss_curve"][0]
    same = run_app(tmp_path / "same", 2, *args, "--checkpoint-dir", str(tmp_path / "unused"),
                   "--restart", str(checkpoints / "ckpt_000000010"))
    assert same["first_step"] == 10
    assert same["diagnostics"]["loss_curve"] == full["diagnostics"]["loss_curve"]
    assert same["checksum"] == full["checksum"]


# ------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1], timeout=300)
def test_gpu_bf16_split_model_on_one_gpu(comm):
    """1 x 1 x 1 on one GPU (bfloat16 bit patterns, the 16-bit kernels) with M = 1 and M = 4: the
    curves follow the CPU bf16 run to BF16_GRID (cuBLAS sums the float32 products in another order
    than the CPU's BLAS before the one rounding) and the GPU fp32 run to BF16_VS_FP32."""
    arch = gpu_arch_or_skip(comm)
    cpu, _, _ = curve(make_grid(alone(comm), 1, 1, 1))
    gpu, params, runner = curve(make_grid(comm, 1, 1, 1), arch=arch)
    assert runner.state.precision.compute_params.dtype.name == "uint16"
    assert np.all(np.isfinite(params))
    assert relative(gpu, cpu) <= BF16_GRID, (gpu[-3:], cpu[-3:])
    fp32, _, _ = curve(make_grid(comm, 1, 1, 1), precision="fp32", arch=arch)
    assert relative(gpu, fp32) <= BF16_VS_FP32
    accumulated, _, _ = curve(make_grid(comm, 1, 1, 1), micro_batches=4, arch=arch)
    assert relative(accumulated, cpu) <= BF16_GRID


def gpu_split_body(comm, arch):
    """1 x 2 x 1 (tensor allreduce of bfloat16) and 1 x 1 x 2 (M = 4, bfloat16 activations between
    the stages) against the one-GPU bf16 run (at the same M): BF16_GRID."""
    one, _, _ = curve(make_grid(alone(comm), 1, 1, 1), arch=arch)
    one_micro, _, _ = curve(make_grid(alone(comm), 1, 1, 1), micro_batches=4, arch=arch)
    for sizes, micro_batches in (((1, 2, 1), 1), ((1, 1, 2), 4)):
        losses, params, runner = curve(make_grid(comm, *sizes), micro_batches=micro_batches, arch=arch)
        assert np.all(np.isfinite(params))
        assert relative(losses, one) <= BF16_GRID, (sizes, losses[-3:], one[-3:])
        assert_measured_equals_computed(runner)
        if sizes[2] > 1:
            assert relative(losses, one_micro) <= BF16_GRID   # bitwise on the CPU; not asserted here
        if comm.rank == 0:
            print(f"{sizes} bf16 on GPUs: {relative(losses, one):.2e} vs one GPU", flush=True)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=400)
def test_gpu_bf16_split_model_over_nccl(comm):
    """Two GPUs: the tensor allreduce in NCCL's bfloat16 (for T = 2 the same ``round(a + b)`` as the
    float32 sum), the stages' bfloat16 activations over NCCL send/recv (as bytes)."""
    gpu_split_body(comm, gpu_arch_or_skip(comm))


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=400)
def test_gpu_bf16_zero_reduce_scatter_in_float32(comm):
    """Two GPUs, ZeRO-1 in bf16 (the bfloat16 gradients widened to float32, reduce-scattered with NCCL,
    the owned part rounded back once): the data-parallel MLP and the split model at 2 x 1 x 1 follow
    their runs without ZeRO (bucket allreduce in float32) to BF16_GRID; the masters stay identical
    on both replicas."""
    from distributed_cases import relative_difference, train_curve

    from apps.train.parallel.distributed import replicas_identical

    arch = gpu_arch_or_skip(comm)
    plain, _, _ = train_curve(comm, 30, global_batch=24, precision="bf16", arch=arch)
    sharded, sharded_params, _ = train_curve(comm, 30, global_batch=24, precision="bf16", zero=1, arch=arch)
    assert relative_difference(sharded, plain) <= 2e-2
    assert replicas_identical(comm, sharded_params)
    grid = make_grid(comm, 2, 1, 1)
    split_plain, _, _ = curve(grid, arch=arch)
    split_sharded, params, runner = curve(grid, zero_stage=1, arch=arch)
    check_bf16_runner(runner)
    assert np.all(np.isfinite(params))
    assert relative(split_sharded, split_plain) <= BF16_GRID, (split_sharded[-3:], split_plain[-3:])


def shared_gpu_body():
    import hpcgpu

    comm = hpcgpu.Communicator()
    gpu_split_body(comm, hpcgpu.arch.auto(comm, backend="cupy"))
    print(f"[rank {comm.rank}] shared-GPU bf16 body passed", flush=True)


@pytest.mark.gpu
@pytest.mark.gpus(1)
def test_gpu_bf16_split_model_on_one_shared_gpu_host_staged():
    """The same on ONE GPU shared by two ranks over the host-staged transport (the float32 sum of
    the tensor allreduce, MPI moving the bit patterns between stages)."""
    from hpcgpu.jobs.launch import run_mpi

    here = Path(__file__).parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parents[2])!r}]; "
            "import test_split_bf16; test_split_bf16.shared_gpu_body()")
    result = run_mpi(2, [sys.executable, "-c", code], timeout=400,
                     env={"HPCGPU_ALLOW_GPU_SHARING": "1", "HPCGPU_TRANSPORT": "mpi-staged"})
    assert result.returncode == 0, result.output
    assert result.output.count("shared-GPU bf16 body passed") == 2, result.output
