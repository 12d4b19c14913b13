"""Data parallelism on GPUs: NCCL bucket allreduce, ZeRO-1 and the app, against the CPU reference.

On the GPU machine (1 and 2 GPUs)::

    python -m pytest tests/apps/train -m gpu
"""

import json
import sys

import numpy as np
import pytest
from distributed_cases import gpu_arch_or_skip, relative_difference, train_curve

pytestmark = pytest.mark.gpu


@pytest.mark.mpi(ranks=[1, 2])
def test_gpu_data_parallel_matches_the_cpu_reference(comm):
    arch = gpu_arch_or_skip(comm)
    reference, reference_params, _ = train_curve(None, 30, global_batch=24)
    losses, params, sync = train_curve(comm, 30, global_batch=24, arch=arch)
    # GPU and CPU BLAS round differently; the curves agree to float32 accuracy
    assert relative_difference(losses, reference) <= 1e-4, (losses[-3:], reference[-3:])
    assert np.allclose(params, reference_params, rtol=1e-3, atol=1e-4)
    accumulated, _, _ = train_curve(comm, 30, global_batch=24, accum_steps=2, arch=arch)
    assert relative_difference(accumulated, reference) <= 1e-4
    if comm.size > 1:
        sync.measure_allreduce_alone()
        stats = sync.overlap_stats()
        assert stats["buckets"] > 3 and stats["allreduce_busy_ms"] > 0
        assert 0.0 <= stats["hidden_fraction"] <= 1.0


@pytest.mark.mpi(ranks=[2])
def test_gpu_zero1_equals_plain_data_parallelism(comm):
    arch = gpu_arch_or_skip(comm)
    plain, plain_params, _ = train_curve(comm, 20, global_batch=24, arch=arch, clip_norm=0.5)
    sharded, sharded_params, _ = train_curve(comm, 20, global_batch=24, arch=arch, clip_norm=0.5, zero=1)
    assert relative_difference(sharded, plain) <= 1e-6
    assert np.allclose(sharded_params, plain_params, rtol=1e-6, atol=1e-7)


@pytest.mark.mpi(ranks=[1, 2])
def test_gpu_mixed_precision_tracks_fp32(comm):
    arch = gpu_arch_or_skip(comm)
    fp32, _, _ = train_curve(comm, 30, global_batch=24, arch=arch)
    fp16, params, _ = train_curve(comm, 30, global_batch=24, arch=arch, precision="fp16")
    assert params.dtype == np.float32 and np.all(np.isfinite(params))
    assert relative_difference(fp16, fp32) <= 2e-2


@pytest.mark.parametrize("n_ranks", [1, 2])
def test_gpu_app_end_to_end(tmp_path, n_ranks):
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() < n_ranks:
        pytest.skip(f"needs {n_ranks} GPUs")
    pytest.importorskip("mnist1d", reason="the default dataset is generated with the mnist1d package")
    from hpcgpu.jobs.launch import run_mpi

    summary_path = tmp_path / "summary.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.train", "--backend", "cupy", "--quiet",
                               "--model", "large-mlp", "--depth", "4", "--width", "512", "--batch-size", "256",
                               "--steps", "30", "--precision", "fp16", "--bucket-mb", "0.5",
                               "--checkpoint-every", "15", "--output", str(tmp_path / "out"),
                               "--summary", str(summary_path)], timeout=300)
    assert result.returncode == 0, result.output
    summary = json.loads(summary_path.read_text())
    assert summary["backend"] == "gpu" and summary["n_ranks"] == n_ranks
    assert summary["diagnostics"]["replicas_identical"] is True
    assert np.isfinite(summary["diagnostics"]["final_loss"])
    assert (tmp_path / "out" / "checkpoints" / "ckpt_000000030").is_dir()
