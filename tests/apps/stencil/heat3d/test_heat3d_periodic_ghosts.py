"""heat3d on one rank: the sweep that fills its own periodic face ghosts equals sweep + halo exchange.

A one-rank heat3d step is a single sweep that also stores each boundary value into the opposite ghost
(``periodic_ghosts=True``); the general path sweeps, then exchanges the halos (a periodic exchange
without corners). Both buffers, ghosts included, must hold bitwise the same values step after step.
"""

import types

import numpy as np
import pytest

from apps.stencil.heat3d import heat3d_step
from hpcgpu.app.graph import NullTimers
from hpcgpu.errors import ConfigurationError

SHAPES = [(7, 5, 9), (1, 6, 4), (3, 1, 2)]   # (nz, ny, nx): odd, and one cell thick along an axis


def _options(shape, precision):
    nz, ny, nx = shape
    return types.SimpleNamespace(nx=nx, ny=ny, nz=nz, precision=precision, dims=None, diffusion_number=0.15,
                                 modes=(1, 2, 1), overlap=True)


def _run_both_ways(comm, backend, shape, precision, n_steps=5):
    import hpcgpu
    from apps.stencil.heat3d.model import Heat3DModel

    arch = hpcgpu.arch.auto(comm, backend=backend)
    models = []
    for self_filling in (True, False):
        model = Heat3DModel(comm, arch, _options(shape, precision))
        assert model.stencil.sweep_fills_ghosts   # one rank, periodic everywhere
        model.stencil.sweep_fills_ghosts = self_filling
        rng = np.random.default_rng(7)   # values that differ on every cell and ghost, the same for both
        for field in (model.stencil.current, model.stencil.next):
            field.data[...] = arch.from_host(rng.standard_normal(field.data.shape).astype(field.data.dtype))
        model.stencil.exchange_current()
        for _ in range(n_steps):
            model.step(NullTimers())
        models.append(model)
    fast, general = models
    assert fast.stencil.parity == general.stencil.parity
    for a, b in ((fast.stencil.current, general.stencil.current), (fast.stencil.next, general.stencil.next)):
        np.testing.assert_array_equal(arch.to_host(a.data), arch.to_host(b.data))
    return arch.to_host(fast.stencil.current.data)


@pytest.mark.mpi(ranks=[1])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_self_filling_step_equals_sweep_and_exchange_on_the_cpu(comm, shape, precision):
    _run_both_ways(comm, "numpy", shape, precision)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1])
@pytest.mark.parametrize("shape", SHAPES + [(66, 35, 130)])
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_self_filling_step_equals_sweep_and_exchange_on_the_gpu_and_the_cpu(comm, shape, precision):
    on_gpu = _run_both_ways(comm, "cupy", shape, precision)
    np.testing.assert_array_equal(on_gpu, _run_both_ways(comm, "numpy", shape, precision))


def test_periodic_ghosts_need_the_whole_owned_block():
    out, inp = np.zeros((6, 5, 7)), np.ones((6, 5, 7))
    with pytest.raises(ConfigurationError, match="whole owned block"):
        heat3d_step(out, inp, (1, 5, 1, 4, 2, 6), 0.1, periodic_ghosts=True)
    heat3d_step(out, inp, (1, 5, 1, 4, 1, 6), 0.1, periodic_ghosts=True)
    np.testing.assert_array_equal(out[1:-1, 1:-1, 1:-1], 1.0)
    assert out[0, 1:-1, 1:-1].min() == 1.0 and out[1:-1, 1:-1, -1].min() == 1.0
    assert out[0, 0, :].max() == 0.0   # edges and corners untouched
