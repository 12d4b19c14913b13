"""The lat-lon step as CUDA graphs: the persistent-buffer polar filter and the graph windows.

CPU tests: which runs may be captured (whole latitude circles, on a GPU) and which steps a window
must not contain (history entries, snapshots). GPU tests (``gpu`` marker) on the GPU machine::

    python -m pytest tests/apps/stencil/sphere/test_sphere_graph.py -m gpu -q

check that the persistent-buffer cuFFT filter gives bitwise the result of the formula it replaced
(``cupy.fft.irfft(cupy.fft.rfft(raw) * factors).astype(dtype)``, kept here as the reference), that
the filter (the fused kernel at these lengths) replays as a CUDA graph, and that ``--grid latlon`` with graphs gives the eager run's bits.
"""

import contextlib
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[4]


class _Timers:
    def phase(self, name):
        return contextlib.nullcontext()


def _options(**overrides):
    values = dict(nx=24, ny=12, init="williamson2", alpha=0.0, days=None, dt=900.0, cfl=None, dims=None,
                  precision="fp64", filter_latitude=45.0, snapshot_every=0)  # fmt: skip
    values.update(overrides)
    return types.SimpleNamespace(**values)


# ---------------------------------------------------------------------------------------------- CPU
@pytest.mark.mpi(ranks=[1])
def test_capturable_on_a_gpu_with_whole_circles_and_never_across_output_steps(comm):
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel

    model = LatLonModel(comm, hpcgpu.arch.auto(comm, backend="numpy"), _options(snapshot_every=None))
    assert model.graph_unsupported is None
    model.set_final_step(400)            # history every 8 steps; default snapshots every 400 // 50 = 8
    assert model.snapshot_every == 8
    assert not model.capturable(2)       # a CPU has no graphs
    model.arch = types.SimpleNamespace(is_gpu=True)
    # A window may end on a history / snapshot step (after_step sees its last step), never contain one.
    assert model.capturable(8) and not model.capturable(16)
    model.step_index = 2
    assert model.capturable(4) and model.capturable(6) and not model.capturable(8)
    model.snapshot_every = 5
    model.step_index = 0
    assert model.capturable(4) and model.capturable(5) and not model.capturable(8)
    model.snapshot_every = 0             # no snapshots: only the history counts
    assert model.capturable(8) and not model.capturable(9)


@pytest.mark.mpi(ranks=[2])
def test_split_longitude_is_never_captured_and_refuses_graph_on_a_gpu(comm):
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel
    from hpcgpu.errors import ConfigurationError

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    bands = LatLonModel(comm, arch, _options(dims=(2, 1), graph=True))
    assert bands.graph_unsupported is None
    split = LatLonModel(comm, arch, _options(dims=(1, 2), graph=True))   # the CPU ignores --graph
    assert "2 ranks along longitude" in split.graph_unsupported
    split.arch = types.SimpleNamespace(is_gpu=True)
    split.set_final_step(400)
    assert not split.capturable(2)
    with pytest.raises(ConfigurationError, match=r"--graph does not apply to --grid latlon with --dims 1,2"):
        split._check_graph_option(True)
    split._check_graph_option(None)      # the default (graphs where possible) is no error


@pytest.mark.mpi(ranks=[1])
def test_history_and_cpu_steps_unchanged_by_the_graph_bookkeeping(comm):
    """after_step records the history every total // 50 steps, as before (the first entry at step 0)."""
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel

    model = LatLonModel(comm, hpcgpu.arch.auto(comm, backend="numpy"), _options())
    model.set_final_step(100)
    model.prepare()                      # nothing to prepare on a CPU
    for _ in range(6):
        model.step(_Timers())
        model.after_step(_Timers(), None, 100)
    assert [round(entry["days"] * 86400.0 / model.dt) for entry in model.history] == [0, 2, 4, 6]


# ---------------------------------------------------------------------------------------------- GPU
def _old_filter_and_combine_gpu(out, base, stage, increment, a, b, plan):
    """The whole-circles device filter before the persistent buffers (the reference; allocates)."""
    import cupy

    from apps.stencil.sphere.polar_filter_gpu import _REAL, _THREADS, _module, device_tables

    tables = device_tables(plan)
    dtype = np.dtype(out[0].dtype)
    module = _module()
    n_rows, n, n_columns = len(plan.rows), plan.n_columns, out[0].shape[1]
    grid = (-(-n // _THREADS), n_rows, 3)
    sizes = (np.int32(n_rows), np.int32(plan.halo_width), np.int32(n), np.int32(n_columns))
    raw = cupy.empty((3, n_rows, n), dtype=dtype)
    module.get_function(f"polar_gather<{_REAL[dtype]}>")(grid, (_THREADS,), (raw, *increment, tables.rows, *sizes))
    spectrum = cupy.fft.rfft(raw.reshape(3 * n_rows, n), axis=-1) * tables.factors
    filtered = cupy.fft.irfft(spectrum, n=n, axis=-1).astype(dtype, copy=False)
    module.get_function(f"polar_combine<{_REAL[dtype]}, {_REAL[dtype]}>")(   # the stored values, divided by 1
        grid, (_THREADS,),
        (*out, *base, *stage, raw, filtered, np.float64(1.0), tables.use_filtered, tables.rows, dtype.type(a), dtype.type(b), *sizes),
    )  # fmt: skip
    return filtered.reshape(3 * n_rows, n)


def _random_fields(rng, shape, dtype, scale=1.0):
    return [(scale * rng.standard_normal(shape)).astype(dtype) for _ in range(3)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nx, ny", [(48, 24), (45, 22)])
def test_persistent_filter_is_bitwise_the_old_formula(cupy, monkeypatch, dtype, nx, ny):
    """The cuFFT path's persistent buffers and plans give the bits of rfft * factors -> irfft -> astype,
    call after call (the path of circle lengths the fused kernel does not take, forced here)."""
    from apps.stencil.sphere import SphereParameters, local_gather, make_filter_plan
    from apps.stencil.sphere.polar_filter_gpu import DEVICE_FILTER, device_workspace, filter_and_combine_gpu

    monkeypatch.setitem(DEVICE_FILTER, "method", "cufft")

    p = SphereParameters(nx=nx, ny=ny, filter_latitude=math.radians(45.0))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    rng = np.random.default_rng(11)
    shape = (p.ny + 2, p.nx + 2)
    base, stage = (_random_fields(rng, shape, dtype) for _ in range(2))
    for call in range(3):   # the buffers are reused: no result of an earlier call may leak into a later one
        increment = [cupy.asarray(x) for x in _random_fields(rng, shape, dtype, scale=10.0 ** call)]
        out_new = [cupy.full(shape, 7.0, dtype=dtype) for _ in range(3)]
        out_old = [cupy.full(shape, 7.0, dtype=dtype) for _ in range(3)]
        args = ([cupy.asarray(x) for x in base], [cupy.asarray(x) for x in stage], increment, 0.75, 0.25, plan)
        filter_and_combine_gpu(out_new, *args, local_gather)
        filtered_old = _old_filter_and_combine_gpu(out_old, *args)
        workspace = device_workspace(plan, dtype)
        assert workspace.raw.dtype == dtype and workspace.product.dtype == np.complex128
        # The workspace keeps the transform before irfft's division by n (the combine kernel divides).
        np.testing.assert_array_equal(cupy.asnumpy((workspace.inverse / p.nx).astype(dtype)), cupy.asnumpy(filtered_old))
        for new, old in zip(out_new, out_old):
            np.testing.assert_array_equal(cupy.asnumpy(new), cupy.asnumpy(old))
    assert device_workspace(plan, dtype) is workspace   # built once per plan, device and dtype


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["fused", "cufft"])
def test_filter_replays_as_a_cuda_graph(cupy, monkeypatch, dtype, method):
    """One stage's filter captured on a stream and replayed on new increments: the eager bits."""
    from apps.stencil.sphere import SphereParameters, local_gather, make_filter_plan
    from apps.stencil.sphere.polar_filter_gpu import DEVICE_FILTER, filter_and_combine_gpu
    from hpcgpu.runtime.capture import capture_graph

    monkeypatch.setitem(DEVICE_FILTER, "method", method)

    p = SphereParameters(nx=64, ny=32, filter_latitude=math.radians(50.0))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    rng = np.random.default_rng(5)
    shape = (p.ny + 2, p.nx + 2)
    base, stage, increment = ([cupy.asarray(x) for x in _random_fields(rng, shape, dtype)] for _ in range(3))
    out = [cupy.zeros(shape, dtype=dtype) for _ in range(3)]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        filter_and_combine_gpu(out, base, stage, increment, 0.75, 0.25, plan, local_gather)   # builds the buffers
        graph = capture_graph(stream, lambda: filter_and_combine_gpu(out, base, stage, increment, 0.75, 0.25,
                                                                     plan, local_gather))
        for field, values in zip(increment, _random_fields(rng, shape, dtype)):
            field.set(values, stream=stream)
        graph.launch(stream)
        expected = [cupy.zeros(shape, dtype=dtype) for _ in range(3)]
        filter_and_combine_gpu(expected, base, stage, increment, 0.75, 0.25, plan, local_gather)
    stream.synchronize()
    for replayed, eager in zip(out, expected):
        np.testing.assert_array_equal(cupy.asnumpy(replayed), cupy.asnumpy(eager))


def _run_latlon(tmp_path, name, *args, ranks=1):
    """(summary, history) of ``python -m apps.stencil --grid latlon ARGS`` on the GPU."""
    output, summary = tmp_path / name, tmp_path / f"{name}.json"
    command = [sys.executable, "-m", "apps.stencil", "--grid", "latlon", *args, "--backend", "cupy", "--no-plot",
               "--quiet", "--output", str(output), "--summary", str(summary)]
    result = run_mpi(ranks, command, timeout=300, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    history = json.loads((output / "latlon_history.json").read_text())
    return json.loads(summary.read_text()), history


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("snapshot_every", ["0", "12"])
def test_latlon_graph_equals_eager(tmp_path, precision, snapshot_every):
    """200 x 100, 400 steps (history every 8 steps, NaN check every 100, snapshots every 12 or none:
    windows of 2, 4 and 8 steps): graphs (the default and --graph) give the eager checksum and history
    bit for bit (a replay that did no work could not: the eager run advances the state)."""
    args = ["--nx", "200", "--ny", "100", "--steps", "400", "--precision", precision,
            "--snapshot-every", snapshot_every]
    default, default_history = _run_latlon(tmp_path, "default", *args)
    graph, graph_history = _run_latlon(tmp_path, "graph", *args, "--graph")
    eager, eager_history = _run_latlon(tmp_path, "eager", *args, "--no-graph")
    assert default["graph"] is True and graph["graph"] is True and eager["graph"] is False
    assert default["checksum"] == graph["checksum"] == eager["checksum"]
    assert default_history == graph_history == eager_history
    assert len(eager_history["history"]) == 51   # the initial state and every 8th step
    if snapshot_every != "0":   # every 12th step's state, written after a replay or an eager step
        assert _datasets(tmp_path / "graph" / "latlon.nc") == _datasets(tmp_path / "eager" / "latlon.nc")


def _datasets(path):
    """{name: bytes} of every variable of a netCDF classic file (fixed ones whole, record ones per record),
    read with hpcgpu's own reader so that the GPU machine needs no netCDF library."""
    from hpcgpu.output.netcdf_classic import RecordFile

    found = {}
    with RecordFile.open(path, durable=False) as f:
        for variable in f.schema.variables.values():
            if variable in f.layout.record_variables:
                for index in range(f.count):
                    found[f"{variable.name}[{index}]"] = f.read(variable.name, index).tobytes()
            else:
                found[variable.name] = f.read(variable.name, 0).tobytes()
    assert any(name.startswith("h[") for name in found), sorted(found)
    return found


@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_latlon_split_longitude_refuses_graph_and_runs_eagerly(tmp_path):
    """Longitude split over 2 GPUs (host-staged filter): --graph is refused, the default runs eagerly."""
    command = [sys.executable, "-m", "apps.stencil", "--grid", "latlon", "--nx", "72", "--ny", "36", "--steps", "4",
               "--dims", "1,2", "--backend", "cupy", "--graph", "--quiet", "--output", str(tmp_path / "refused")]
    result = run_mpi(2, command, timeout=120, cwd=str(ROOT))
    assert result.returncode != 0
    assert "--graph does not apply to --grid latlon with --dims 1,2" in result.output
    summary, _ = _run_latlon(tmp_path, "split", "--nx", "72", "--ny", "36", "--steps", "4", "--dims", "1,2",
                              "--snapshot-every", "0", ranks=2)
    assert summary["graph"] is False
