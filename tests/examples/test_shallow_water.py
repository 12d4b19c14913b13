"""examples/shallow_water.py, the channel's shallow water written on the kernel layer, equals the bundled
``python -m apps.stencil --model swe`` bit for bit: same grid, same steps, 1 and 2 ranks (the 2-rank run
splits the channel between its walls, so each rank owns one wall)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shallow_water.py"
#: Small enough for CI, long enough for the jet to be visibly perturbed: 300 steps of about 70 s.
GRID = ["--backend", "numpy", "--nx", "40", "--ny", "24", "--steps", "300"]


def load_example():
    spec = importlib.util.spec_from_file_location("example_shallow_water", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(command, n_ranks, out: Path, *extra):
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = run_mpi(n_ranks, [sys.executable, *command, *GRID, *extra, "--output", str(out),
                               "--summary", str(out / "summary.json"), "--quiet"],
                     timeout=300, env=environment, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def app_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("app")
    return run(["-m", "apps.stencil"], 1, out, "--no-plot", "--snapshot-every", "300"), out


@pytest.mark.parametrize("n_ranks, dims", [(1, None), (2, "2,1"), (2, "1,2")])
def test_example_equals_the_bundled_app_bit_for_bit(app_run, n_ranks, dims, tmp_path):
    app, app_output = app_run
    example = run([str(EXAMPLE)], n_ranks, tmp_path, *(["--dims", dims] if dims else []))
    assert example["checksum"] == app["checksum"]
    assert example["steps"] == app["steps"] == 300 and example["n_ranks"] == n_ranks
    import xarray

    # The same state in the two files (the app's snapshot stores float32), and a jet that moved.
    with xarray.open_dataset(tmp_path / "shallow_water.nc") as mine, \
            xarray.open_dataset(app_output / "swe.nc") as theirs:
        h = mine["h"].isel(time=-1).values
        np.testing.assert_array_equal(h.astype(np.float32), theirs["h"].isel(time=-1).values)
        assert np.abs(h - mine["h"].isel(time=0).values).max() > 1e-3


def test_the_stage_compiles_for_the_gpu_without_fma():
    """NVRTC compiles the stage's CUDA C for sm_90 with the model's own fields (the GPU form, without a GPU)."""
    nvrtc = pytest.importorskip("hpcgpu.stencils.nvrtc")
    import hpcgpu
    from hpcgpu.app.cli import FrozenOptions
    from hpcgpu.errors import BackendError
    from hpcgpu.stencils import codegen_cuda

    example = load_example()
    comm = hpcgpu.Communicator()
    model = example.ShallowWater(comm, hpcgpu.arch.auto(comm, backend="numpy"),
                                 FrozenOptions(example.build_parser().parse_args(["--nx", "40", "--ny", "24"])))
    state = model.current
    inputs = {**state, "h0": state["h"], "u0": state["u"], "v0": state["v"], **model.coefficients}
    source = example.stage.bind([model.stages[0][name] for name in "huv"], inputs).cuda_source()
    try:
        ptx = nvrtc.compile_to_ptx(source, codegen_cuda.NVRTC_OPTIONS, architecture="sm_90")
    except BackendError as error:
        if "not found" in str(error):
            pytest.skip(str(error))
        raise
    assert ".entry stencil_stage" in ptx and "fma." not in ptx
