"""What real models need from the layer, each against a serial NumPy reference, bit for bit on 1-4 ranks:
several stages per step (SSP-RK3 through work fields; Adams-Bashforth 2 through a second state field),
Dirichlet and zero-gradient walls, a field read but never written, parameters that change with time,
and a global maximum inside the step (an adaptive time step)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.app.checksum import hash_arrays
from tests.examples.test_examples import indices, run_example

ROOT = Path(__file__).resolve().parents[2]
AB2 = ROOT / "tests" / "simulation" / "models" / "ab2_heat.py"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def laplacian(v, lower, upper):
    """The stencils' 5-point sum in their order; rows ``lower`` / ``upper`` are the ghosts along y, x periodic."""
    padded = np.concatenate([lower, v, upper], axis=0)
    return (((padded[:-2] + padded[2:]) + np.roll(v, 1, axis=1)) + np.roll(v, -1, axis=1)) - 4.0 * v


def heat_rk3_reference(ny, nx, steps, floor=1.0, amplitude=0.05, period=20.0, courant=0.4):
    example = load(ROOT / "examples" / "heat_rk3.py")
    y, x = indices((ny, nx))
    conductivity = np.broadcast_to(example.conductivity_pattern(y, x, ny, nx), (ny, nx)).astype(np.float64)
    largest = float(conductivity.max())
    u = np.zeros((ny, nx))

    def tendency(v, dt, source):
        kappa = conductivity * (1.0 + v * v)
        return dt * (kappa * laplacian(v, np.full((1, nx), floor), v[-1:]) + source)

    def source(t):
        return amplitude * np.sin(2 * np.pi * t / period)

    t = 0.0
    for _ in range(steps):
        peak = max(float(u.max()), -float(u.min()))
        dt = courant / (4 * largest * (1 + peak * peak))
        u1 = u + tendency(u, dt, source(t))
        u2 = 0.75 * u + (1.0 - 0.75) * (u1 + tendency(u1, dt, source(t + dt)))
        u = (1 / 3) * u + (1.0 - 1 / 3) * (u2 + tendency(u2, dt, source(t + dt / 2)))
        t = t + dt
    return {"u": u}


def ab2_reference(ny=14, nx=11, steps=20, alpha=0.2, dt=0.5):
    y, x = indices((ny, nx))
    u = np.broadcast_to(np.cos(np.pi * y / ny) + 0.5 * np.sin(2 * np.pi * x / nx), (ny, nx)).astype(np.float64)
    previous = np.zeros((ny, nx))
    for step in range(steps):
        a, b = (1.0, 0.0) if step == 0 else (1.5, 0.5)
        tendency = alpha * laplacian(u, u[:1], u[-1:])
        u, previous = u + dt * (a * tendency - b * previous), tendency
    return {"u": u, "previous": previous}


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4])
def test_ssp_rk3_with_walls_coefficients_and_an_adaptive_step_equals_numpy(n_ranks, tmp_path):
    summary = run_example("heat_rk3", n_ranks, ["--ny", "13", "--nx", "10", "--steps", "25"], tmp_path)
    assert summary["checksum"] == hash_arrays(list(heat_rk3_reference(13, 10, 25).items()))


@pytest.mark.parametrize("n_ranks", [1, 2, 3, 4])
def test_adams_bashforth_2_with_insulated_walls_equals_numpy(n_ranks, tmp_path):
    summary = run_example(str(AB2.with_suffix("")), n_ranks, ["--steps", "20"], tmp_path)
    assert summary["checksum"] == hash_arrays(list(ab2_reference().items()))


def test_model_time_is_restored_on_restart_across_rank_counts(tmp_path):
    run_example("heat_rk3", 2, ["--ny", "13", "--nx", "10", "--steps", "12", "--checkpoint-every", "12"], tmp_path)
    summary = run_example("heat_rk3", 3, ["--ny", "13", "--nx", "10", "--steps", "25", "--restart", "latest"],
                          tmp_path)
    assert summary["checksum"] == hash_arrays(list(heat_rk3_reference(13, 10, 25).items()))
