"""Jacobi sweep on the GPU: every variant and launch shape bitwise equal to the CPU kernel."""

import numpy as np
import pytest

from apps.stencil.jacobi import GPU_VARIANTS, jacobi_sweep
from hpcgpu.errors import ConfigurationError

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


def cpu_result(out, inp, region, fixed):
    out_cpu, residual = out.copy(), np.zeros(1)
    jacobi_sweep(out_cpu, inp, region, fixed, residual)
    return out_cpu, residual[0]


VECTOR_WIDTH = {"simple": 1, "march": 1, "march_vec2": 2, "march_vec4": 4}
CASES = [
    # padded shape, region, fixed columns
    ((12, 18), (1, 11, 1, 17), (1, 16)),
    ((13, 36), (2, 12, 3, 33), (3, 20)),
    ((40, 67), (1, 39, 1, 66), (1,)),
    ((70, 300), (5, 61, 2, 299), (298,)),
    ((70, 300), (1, 69, 7, 8), ()),
]
LAUNCHES = [(None, None, None), (32, 1, 1), (64, 2, 3), (32, 4, 5)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", GPU_VARIANTS + ("auto",))
@pytest.mark.parametrize("shape, region, fixed", CASES)
def test_variants_match_cpu_bitwise(dtype, variant, shape, region, fixed):
    rng = np.random.default_rng(sum(shape))
    inp = rng.standard_normal(shape).astype(dtype)
    out = rng.standard_normal(shape).astype(dtype)
    expected, expected_residual = cpu_result(out, inp, region, fixed)
    width = VECTOR_WIDTH.get(variant, 1)
    for threads_x, threads_y, rows in LAUNCHES:
        out_gpu, inp_gpu, residual = cupy.asarray(out), cupy.asarray(inp), cupy.zeros(1)
        arguments = dict(variant=variant, threads_x=threads_x, threads_y=threads_y, rows_per_thread=rows)
        if shape[1] % width:
            with pytest.raises(ConfigurationError, match="multiples of"):
                jacobi_sweep(out_gpu, inp_gpu, region, fixed, residual, **arguments)
            return
        jacobi_sweep(out_gpu, inp_gpu, region, fixed, residual, **arguments)
        np.testing.assert_array_equal(cupy.asnumpy(out_gpu), expected, err_msg=f"{variant} {arguments}")
        assert float(residual[0]) == pytest.approx(expected_residual, rel=1e-12)
        # and without the residual, the same bits
        out_gpu = cupy.asarray(out)
        jacobi_sweep(out_gpu, inp_gpu, region, fixed, **arguments)
        np.testing.assert_array_equal(cupy.asnumpy(out_gpu), expected)


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_row_pitch_larger_than_width(variant):
    rng = np.random.default_rng(7)
    backing_in = rng.standard_normal((30, 48)).astype(np.float32)
    backing_out = rng.standard_normal((30, 48)).astype(np.float32)
    inp, out = backing_in[:, :36], backing_out[:, :36]
    region, fixed = (1, 29, 1, 35), (1, 34)
    expected, expected_residual = cpu_result(np.ascontiguousarray(out), np.ascontiguousarray(inp), region, fixed)
    out_gpu_backing = cupy.asarray(backing_out)
    residual = cupy.zeros(1)
    jacobi_sweep(out_gpu_backing[:, :36], cupy.asarray(backing_in)[:, :36], region, fixed, residual, variant=variant)
    result = cupy.asnumpy(out_gpu_backing)
    np.testing.assert_array_equal(result[:, :36], expected)
    np.testing.assert_array_equal(result[:, 36:], backing_out[:, 36:])  # beyond the width: untouched
    assert float(residual[0]) == pytest.approx(expected_residual, rel=1e-12)


def test_split_regions_on_gpu_match_the_whole_region():
    rng = np.random.default_rng(8)
    inp = cupy.asarray(rng.standard_normal((50, 82)).astype(np.float32))
    whole, pieces = cupy.zeros_like(inp), cupy.zeros_like(inp)
    whole_residual, pieces_residual = cupy.zeros(1), cupy.zeros(1)
    jacobi_sweep(whole, inp, (1, 49, 1, 81), (1, 80), whole_residual)
    for sub_region in [(1, 2, 1, 81), (2, 49, 1, 2), (2, 30, 2, 81), (30, 49, 2, 41), (30, 49, 41, 81)]:
        jacobi_sweep(pieces, inp, sub_region, (1, 80), pieces_residual, variant="march")
    np.testing.assert_array_equal(cupy.asnumpy(pieces), cupy.asnumpy(whole))
    assert float(pieces_residual[0]) == pytest.approx(float(whole_residual[0]), rel=1e-12)


def test_gpu_bad_arguments():
    inp = cupy.zeros((10, 18), dtype=cupy.float32)
    out = cupy.zeros_like(inp)
    with pytest.raises(ConfigurationError, match="unknown GPU variant"):
        jacobi_sweep(out, inp, (1, 9, 1, 17), variant="fastest")
    with pytest.raises(ConfigurationError, match="multiple of 32"):
        jacobi_sweep(out, inp, (1, 9, 1, 17), variant="march", threads_x=48, threads_y=2)
    with pytest.raises(ConfigurationError, match="multiples of 4"):
        jacobi_sweep(out, inp, (1, 9, 1, 17), variant="march_vec4")
    with pytest.raises(ConfigurationError, match="cupy \\(device\\) array"):
        jacobi_sweep(out, inp, (1, 9, 1, 17), (), np.zeros(1))
    with pytest.raises(ConfigurationError, match="same backend"):
        jacobi_sweep(out, cupy.asnumpy(inp), (1, 9, 1, 17))
    with pytest.raises(ConfigurationError, match="aligned"):
        jacobi_sweep(out.ravel()[1:145].reshape(8, 18), inp.ravel()[1:145].reshape(8, 18), (1, 7, 1, 17),
                     variant="march_vec2")


@pytest.mark.parametrize("schedule", [(), ("--no-overlap",), ("--graph",), ("--no-overlap", "--graph"),
                                      ("--peer-halo",), ("--peer-halo", "--graph")],
                         ids=["overlap", "no-overlap", "graph", "no-overlap-graph", "peer-halo", "peer-halo-graph"])
def test_app_schedules_on_gpus_match_the_cpu_checksum(tmp_path, schedule):
    """Rim on the communication stream, one-launch no-overlap, graphs: the CPU's final state, bit for bit."""
    import json
    import sys

    from hpcgpu.jobs.launch import run_mpi

    def checksum(n_ranks, backend, *extra):
        name = f"{backend}{n_ranks}{'_'.join(extra)}"
        summary = tmp_path / f"{name}.json"
        result = run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", "--model", "jacobi", "--nx", "256",
                                   "--ny", "192", "--steps", "40", "--norm-every", "10", "--quiet",
                                   "--backend", backend, "--output", str(tmp_path / name),
                                   "--summary", str(summary), *extra], timeout=240)
        assert result.returncode == 0, result.output[-3000:]
        return json.loads(summary.read_text())

    reference = checksum(1, "numpy")
    rank_counts = sorted({1, min(2, cupy.cuda.runtime.getDeviceCount())})
    if "--peer-halo" in schedule:
        rank_counts = [n for n in rank_counts if n >= 2]   # neighbours on other GPUs only
        if not rank_counts:
            pytest.skip("--peer-halo needs 2 GPUs")
    for n_ranks in rank_counts:
        summary = checksum(n_ranks, "cupy", *schedule)
        assert summary["checksum"] == reference["checksum"], (n_ranks, schedule, summary["checksum"], reference["checksum"])
        assert summary["diagnostics"]["residual_l2"] == pytest.approx(
            reference["diagnostics"]["residual_l2"], rel=1e-10)
