"""The examples in examples/ on 1-4 CPU ranks equal a serial NumPy reference bit for bit; restarts across
rank counts and a stop request (exit 75, then --restart latest) give the uninterrupted run's state and
netCDF file."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.app.checksum import hash_arrays
from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name, n_ranks, args, out: Path, expect_exit=0):
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    summary = out / "summary.json"
    result = run_mpi(n_ranks, [sys.executable, str(EXAMPLES / f"{name}.py"), *args, "--output", str(out),
                               "--summary", str(summary), "--quiet"], timeout=120, env=environment, cwd=str(ROOT))
    assert result.returncode == expect_exit, result.output[-3000:]
    return json.loads(summary.read_text()) if expect_exit == 0 else None


def indices(shape):
    return np.ix_(*[np.arange(n) for n in shape])


def shift(a, offset):
    """``shift(a, (dy, dx))[i, j] == a[i + dy, j + dx]`` on a periodic grid."""
    return np.roll(a, tuple(-d for d in offset), axis=tuple(range(a.ndim)))


# ---------------------------------------------------------------------- serial references
def gray_scott_reference(n, steps, feed=0.037, kill=0.06, diffusion_u=0.2, diffusion_v=0.1, dt=1.0):
    example = load_example("gray_scott")
    y, x = indices((n, n))
    u, v = (np.broadcast_to(a, (n, n)).astype(np.float64) for a in example.initial_state(y, x, n))

    def laplacian(a):
        return (((shift(a, (-1, 0)) + shift(a, (1, 0))) + shift(a, (0, -1))) + shift(a, (0, 1))) - 4.0 * a
    for _ in range(steps):
        reaction = (u * v) * v
        u, v = (u + dt * ((diffusion_u * laplacian(u) - reaction) + feed * (1.0 - u)),
                v + dt * ((diffusion_v * laplacian(v) + reaction) - (feed + kill) * v))
    return {"u": u, "v": v}


def diffusion_reference(n, steps, r=0.1):
    example = load_example("diffusion_3d")
    T = np.broadcast_to(example.hot_blob(*indices((n, n, n)), n), (n, n, n)).astype(np.float64)
    for _ in range(steps):
        neighbours = shift(T, (-1, 0, 0))
        for offset in ((1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)):
            neighbours = neighbours + shift(T, offset)
        T = T + r * (neighbours - 6.0 * T)
    return {"T": T}


def advection_reference(n, steps, cx=0.5, cy=0.25):
    y, x = indices((n, n))
    q = np.broadcast_to(1.0 * ((abs(y - n // 4) < n // 8) & (abs(x - n // 4) < n // 8)), (n, n)).astype(np.float64)
    for _ in range(steps):
        along_x = max(cx, 0.0) * (q - shift(q, (0, -1))) + min(cx, 0.0) * (shift(q, (0, 1)) - q)
        along_y = max(cy, 0.0) * (q - shift(q, (-1, 0))) + min(cy, 0.0) * (shift(q, (1, 0)) - q)
        q = (q - along_x) - along_y
    return {"q": q}


CASES = {
    "gray_scott": (["--n", "20", "--steps", "30"], lambda: gray_scott_reference(20, 30)),
    "diffusion_3d": (["--n", "9", "--steps", "12", "--r", "0.15"], lambda: diffusion_reference(9, 12, r=0.15)),
    "advection_2d": (["--n", "18", "--steps", "25", "--courant-x", "-0.3", "--courant-y", "0.45"],
                     lambda: advection_reference(18, 25, cx=-0.3, cy=0.45)),
}


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_equals_the_serial_reference(name, n_ranks, tmp_path):
    args, reference = CASES[name]
    summary = run_example(name, n_ranks, args, tmp_path)
    expected = reference()
    assert summary["checksum"] == hash_arrays(list(expected.items()))
    assert summary["n_ranks"] == n_ranks and summary["app"] == name and summary["app_version"] == "1.0"
    import xarray

    with xarray.open_dataset(tmp_path / f"{name}.nc") as data:
        for field, values in expected.items():
            np.testing.assert_array_equal(data[field].isel(step=-1).values,
                                          values.astype(data[field].dtype))


def test_dims_flag_is_validated_and_used(tmp_path):
    args, reference = CASES["gray_scott"]
    summary = run_example("gray_scott", 4, [*args, "--dims", "1,4"], tmp_path / "ok")
    assert summary["decomposition"]["dims"] == [1, 4]
    assert summary["checksum"] == hash_arrays(list(reference().items()))
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    result = run_mpi(2, [sys.executable, str(EXAMPLES / "gray_scott.py"), "--dims", "2,2,1", "--output",
                         str(tmp_path / "bad")], timeout=60, env=environment, cwd=str(ROOT))
    assert result.returncode != 0
    assert "--dims: expected 2 ranks per axis" in result.output


def test_restart_across_rank_counts_and_a_stop_request_give_the_uninterrupted_run(tmp_path):
    """Uninterrupted on 2 ranks; in pieces: 4 ranks stopped by the wall-time limit at its first stop check
    (step 10, exit 75; AtEnd writes the record of step 10), 3 ranks to step 20 (checkpoint), 1 rank to 30."""
    common = ["--n", "16", "--output-every", "15", "--checkpoint-every", "20"]
    whole = run_example("gray_scott", 2, [*common, "--steps", "30"], tmp_path / "whole")
    pieces = tmp_path / "pieces"
    run_example("gray_scott", 4, [*common, "--steps", "30", "--wall-time-limit", "0.000001"], pieces, expect_exit=75)
    import xarray

    with xarray.open_dataset(pieces / "gray_scott.nc") as data:
        assert data["step"].values.tolist() == [0, 10]   # the end-of-run record of the stopped job
    run_example("gray_scott", 3, [*common, "--steps", "20", "--restart", "latest"], pieces)
    last = run_example("gray_scott", 1, [*common, "--steps", "30", "--restart", "latest"], pieces)
    assert last["checksum"] == whole["checksum"] == hash_arrays(list(gray_scott_reference(16, 30).items()))
    assert last["diagnostics"] == whole["diagnostics"]
    with xarray.open_dataset(pieces / "gray_scott.nc") as split, \
            xarray.open_dataset(tmp_path / "whole" / "gray_scott.nc") as uninterrupted:
        assert split["step"].values.tolist() == uninterrupted["step"].values.tolist() == [0, 15, 30]
        for field in ("u", "v"):
            np.testing.assert_array_equal(split[field].values, uninterrupted[field].values)


def test_a_changed_model_option_is_refused_on_restart_but_a_declared_one_is_not(tmp_path):
    run_example("advection_2d", 2, ["--n", "12", "--steps", "10", "--checkpoint-every", "10"], tmp_path)
    run_example("advection_2d", 3, ["--n", "12", "--steps", "20", "--checkpoint-every", "10",
                                    "--output-every", "5", "--restart", "latest"], tmp_path)   # declared: allowed
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = run_mpi(2, [sys.executable, str(EXAMPLES / "advection_2d.py"), "--n", "12", "--steps", "30",
                         "--courant-x", "0.2", "--restart", "latest", "--output", str(tmp_path)],
                     timeout=60, env=environment, cwd=str(ROOT))
    assert result.returncode != 0
    assert "--courant-x" in result.output


def test_every_example_is_run_by_a_test():
    """Each examples/NAME.py runs in CI: it is a case above, has its own tests/examples/test_NAME.py, or a
    test here runs it (``run_example("NAME", ...)``)."""
    test_files = sorted(Path(__file__).parent.glob("test_*.py"))
    own_tests = {path.name for path in test_files}
    sources = "\n".join(path.read_text() for path in test_files)
    unrun = [path.name for path in sorted(EXAMPLES.glob("*.py"))
             if path.stem not in CASES and f"test_{path.stem}.py" not in own_tests
             and f'run_example("{path.stem}"' not in sources]
    assert not unrun, f"examples without a test: {unrun}; add a case to CASES or tests/examples/test_NAME.py"


@pytest.mark.slow
def test_gray_scott_whose_v_decays_over_hundreds_of_binary_orders_ends_with_exact_diagnostics(tmp_path):
    """At n = 512 after 200 steps v spans 1 down to 2.4e-201 (and zeros): the exact sum behind the mean
    holds more partials at once than a fixed small buffer would (this run used to abort with heap
    corruption at its final diagnostics); it ends normally and its means equal math.fsum of the cells."""
    import math

    import xarray

    summary = run_example("gray_scott", 1, ["--n", "512", "--steps", "200", "--backend", "numpy",
                                            "--output-every", "200"], tmp_path)
    with xarray.open_dataset(tmp_path / "gray_scott.nc") as data:
        v = data["v"].isel(step=-1).values.astype(np.float64)
    assert 0.0 < v[v > 0].min() < 1e-150
    assert summary["diagnostics"]["mean_v"] == math.fsum(v.ravel().tolist()) / v.size
