"""``--allreduce peer`` on 2 GPUs: bitwise NCCL's sums, in the reducer, in training and in the app.

On the GPU machine (2 GPUs of one node)::

    python -m pytest tests/apps/train/test_train_peer_reduce_gpu.py -m gpu

For two ranks NCCL's sum of an element is one IEEE addition ``a + b`` in the gradient dtype,
so the copy-engine reduction must give the same bits: compared directly (random buffers with
subnormals, zeros and signed zeros, also against NumPy's ``a + b``), over training steps
(losses, reduced gradients and parameters) and through the app (loss curve and checksum).
Buckets of 0.001998 MB hold an odd number of elements (999 float16, 499 float32), so the two
halves of a bucket differ in length, and a 1-element bucket leaves rank 0 an empty half.
"""

import json
import sys

import numpy as np
import pytest
from distributed_cases import gpu_arch_or_skip, make_model, synthetic_data

pytestmark = pytest.mark.gpu

ODD_BUCKET_MB = 0.001998
KINDS = ("nccl", "peer")


def gradient_like(rng, n, dtype):
    """Signed values of many magnitudes plus exact subnormals, zeros and negative zeros."""
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    special = rng.choice(n, size=n // 8, replace=False)
    if dtype == np.float16:
        subnormals = rng.integers(1, 1 << 10, special.size) * 2.0**-24
    else:
        subnormals = rng.integers(1, 1 << 23, special.size) * 2.0**-149
    values[special] = subnormals * rng.choice([-1.0, 1.0], special.size)
    values[special[: special.size // 4]] = rng.choice([0.0, -0.0], special.size // 4)
    return values.astype(dtype)


def bits(array):
    array = np.ascontiguousarray(array)
    return array.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[array.itemsize])


def assert_bitwise_equal(actual, expected, what):
    differ = np.flatnonzero(bits(actual) != bits(expected))
    assert differ.size == 0, (f"{what}: {differ.size} of {actual.size} elements differ, e.g. at {differ[:5]}: "
                              f"{actual[differ[:5]]} vs {expected[differ[:5]]}")


def reduce_round(sync, arch, host_values):
    """Load ``host_values`` into the bound buffer, sum it over the ranks as a training step does."""
    import cupy

    sync.grads[...] = cupy.asarray(host_values)
    sync.before_backward()
    sync.finish_gradients(sync.grads)   # starts every bucket, then waits
    return arch.to_host(sync.grads)


@pytest.mark.mpi(ranks=[2], timeout=300)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_peer_sums_are_bitwise_nccls(comm, dtype):
    import cupy

    from apps.train.parallel.distributed import DataParallel

    arch = gpu_arch_or_skip(comm)
    n_params = 2995   # float16: buckets 999, 999, 997; float32: six of 499 and one of 1 element
    syncs = {}
    for kind in KINDS:
        syncs[kind] = DataParallel(comm, arch, ODD_BUCKET_MB, allreduce=kind)
        syncs[kind].bind(cupy.zeros(n_params, dtype=dtype))
    buckets = syncs["peer"].buckets
    assert len(buckets) >= 3 and any((hi - lo) % 2 for lo, hi in buckets)

    def check_round(seed):
        mine = gradient_like(np.random.default_rng([seed, comm.rank]), n_params, dtype)
        a, b = comm.mpi.allgather(mine)
        expected = a + b   # NumPy: one correctly rounded addition per element
        sums = {kind: reduce_round(syncs[kind], arch, mine) for kind in KINDS}
        assert_bitwise_equal(sums["peer"], expected, f"peer vs NumPy, round {seed}")
        assert_bitwise_equal(sums["peer"], sums["nccl"], f"peer vs NCCL, round {seed}")

    for seed in range(3):   # several rounds: the epochs advance and the buffers are reused
        check_round(seed)
    alone = syncs["peer"].measure_allreduce_alone(repeats=2)
    assert alone > 0
    assert not cupy.any(syncs["peer"].grads)   # measure_allreduce_alone leaves zeros
    check_round(3)   # rounds after the measurement still pair up
    stats = syncs["peer"].overlap_stats()
    assert stats["buckets"] == len(buckets) and stats["allreduce_busy_ms"] > 0
    assert 0.0 <= stats["hidden_fraction"] <= 1.0


def train(comm, arch, allreduce, precision, n_steps, accum_steps=1):
    """Losses, final reduced gradients and master parameters (host) of a short data-parallel run."""
    from apps.train.kernels.backend import to_numpy
    from apps.train.parallel.distributed import DataParallel
    from apps.train.data.loader import ArraySource, ShardedLoader
    from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step

    config = TrainConfig(optimizer="adamw", lr=3e-3, weight_decay=0.01, warmup_steps=2, total_steps=n_steps,
                         global_batch_size=24, accum_steps=accum_steps, precision=precision,
                         init_loss_scale=2.0**10, seed=7)
    trainer = Trainer(make_model(), config)
    sync = DataParallel(comm, arch, ODD_BUCKET_MB, allreduce=allreduce)
    state = init_train_state(trainer, arch.xp, sync)
    x, y = synthetic_data()
    losses = []
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=comm.rank, n_ranks=comm.size, arch=arch) as loader:
        for _ in range(n_steps):
            batch = loader.next()
            losses.append(train_step(trainer, state, batch.x, batch.y, batch.sample_index, sync).loss)
    return (losses, to_numpy(state.precision.compute_grads).copy(),
            to_numpy(state.precision.master_params).copy(), sync)


@pytest.mark.mpi(ranks=[2], timeout=300)
def test_training_with_peer_is_bitwise_training_with_nccl(comm):
    arch = gpu_arch_or_skip(comm)
    for precision, accum_steps in (("fp32", 2), ("fp16", 1)):
        runs = {kind: train(comm, arch, kind, precision, n_steps=8, accum_steps=accum_steps) for kind in KINDS}
        (nccl_losses, nccl_grads, nccl_params, _), (peer_losses, peer_grads, peer_params, sync) = \
            runs["nccl"], runs["peer"]
        assert len(sync.buckets) >= 3 and any((hi - lo) % 2 for lo, hi in sync.buckets)
        assert peer_losses == nccl_losses, precision
        assert_bitwise_equal(peer_grads, nccl_grads, f"{precision}: reduced gradients of the last step")
        assert_bitwise_equal(peer_params, nccl_params, f"{precision}: master parameters")
        assert np.all(np.isfinite(peer_params))


def test_app_with_peer_gives_nccls_losses_and_checksum(tmp_path):
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    import h5py

    from hpcgpu.jobs.launch import run_mpi

    rng = np.random.default_rng(0)
    projections = rng.standard_normal((12, 4))
    data = tmp_path / "small.h5"
    with h5py.File(data, "w") as handle:
        for suffix, count in (("", 240), ("_test", 60)):
            x = rng.standard_normal((count, 12)).astype(np.float32)
            handle[f"x{suffix}"], handle[f"y{suffix}"] = x, np.argmax(x @ projections, axis=1)
    summaries = {}
    for kind in KINDS:
        summary = tmp_path / f"{kind}.json"
        result = run_mpi(2, [sys.executable, "-m", "apps.train", "--backend", "cupy", "--quiet", "--no-plot",
                             "--data", str(data), "--model", "large-mlp", "--depth", "2", "--width", "64",
                             "--batch-size", "24", "--steps", "12", "--eval-every", "6", "--precision", "fp16",
                             "--loss-scale", "1024", "--bucket-mb", str(ODD_BUCKET_MB), "--allreduce", kind,
                             "--output", str(tmp_path / kind), "--summary", str(summary)], timeout=300)
        assert result.returncode == 0, result.output
        summaries[kind] = json.loads(summary.read_text())
    nccl, peer = summaries["nccl"], summaries["peer"]
    assert peer["decomposition"]["allreduce"] == "peer" and peer["decomposition"]["buckets"] >= 3
    assert peer["diagnostics"]["loss_curve"] == nccl["diagnostics"]["loss_curve"]
    assert peer["checksum"] == nccl["checksum"]
    assert peer["diagnostics"]["replicas_identical"] is True
    assert peer["diagnostics"]["overlap"]["hidden_fraction"] is not None
