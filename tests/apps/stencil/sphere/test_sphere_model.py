"""LatLonModel under MPI: the same state on 1, 2, 3, 4 ranks (any decomposition), equal to the
single-tile NumPy run, with mass conserved and the case-2 error reported."""

import contextlib
import math
import types

import numpy as np
import pytest


class _Timers:
    def phase(self, name):
        return contextlib.nullcontext()


def _options(**overrides):
    values = dict(nx=24, ny=12, init="williamson2", alpha=math.pi / 2 - 0.05, days=None, dt=900.0, cfl=None,
                  dims=None, precision="fp64", filter_latitude=45.0)  # fmt: skip
    values.update(overrides)
    return types.SimpleNamespace(**values)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
@pytest.mark.parametrize("dims", [None, (0, 1), (1, 0)])
def test_model_is_rank_count_independent(comm, dims):
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel
    from sphere_reference import global_state, run_tiled

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    if dims is not None and comm.size > 1:
        dims = tuple(comm.size if d == 0 else 1 for d in dims)
    model = LatLonModel(comm, arch, _options(dims=dims))
    for _ in range(4):
        model.step(_Timers())
    gathered = [f.gather() for f in model.fields]
    diagnostics = model.diagnostics()
    assert abs(diagnostics["mass_relative_change"]) < 1e-12
    assert 0 < diagnostics["height_error_l2"] < 1e-2
    if comm.rank == 0:
        state, _ = global_state(model.parameters)
        expected = run_tiled(state, model.parameters, [0, 12], [0, 24], model.dt, 4)
        for field, reference in zip(gathered, expected):
            np.testing.assert_array_equal(field, reference)


@pytest.mark.mpi(ranks=[6], timeout=180)
def test_model_on_six_ranks_matches_the_single_tile_run(comm):
    test_model_is_rank_count_independent(comm, None)


@pytest.mark.mpi(ranks=[1, 2])
def test_model_runs_the_mountain_and_rossby_haurwitz_cases(comm):
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for init in ("williamson5", "williamson6"):
        model = LatLonModel(comm, arch, _options(init=init, nx=32, ny=16, dt=None, cfl=0.8, days=0.5, filter_latitude=60.0))
        for _ in range(model.steps):
            model.step(_Timers())
            model.after_step(_Timers(), None, model.steps)
        result = model.diagnostics()
        assert abs(result["mass_relative_change"]) < 1e-12
        assert abs(result["energy_relative_change"]) < 1e-5
        assert len(model.history) >= 2 and "potential_enstrophy" in model.history[-1]
        assert model.describe().startswith("shallow water on the sphere")
    model.finish(tmp_output(comm), {}, plot=False)


def tmp_output(comm):
    import tempfile

    path = tempfile.mkdtemp() if comm.rank == 0 else None
    return comm.broadcast(path)
