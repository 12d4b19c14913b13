"""The CPU sweeps of Jacobi and heat3d are the kernel layer's: on the padded arrays of Fields, the app's
sweep over the owned block equals ``kernel.apply(..., region="owned")`` of the same @hpcgpu.stencil
function bit for bit (and Jacobi leaves its fixed columns alone)."""

from __future__ import annotations

import numpy as np
import pytest

from apps.stencil.heat3d import heat3d_step
from apps.stencil.heat3d.stencil import heat3d
from apps.stencil.jacobi import jacobi_sweep
from apps.stencil.jacobi.stencil import jacobi


@pytest.mark.mpi(ranks=[1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_app_sweeps_equal_the_layers_apply(comm, dtype):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    rng = np.random.default_rng(3)
    for kernel, shape, params in ((jacobi, (9, 13), {}), (heat3d, (5, 7, 6), {"r": 0.13})):
        grid = hpcgpu.Decomposition(comm, shape, periodic=True)
        old, layer_new, app_new = (hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype) for _ in range(3))
        old.data[...] = rng.standard_normal(old.data.shape)
        layer_new.data[...] = app_new.data[...] = rng.standard_normal(old.data.shape)
        kernel.apply(layer_new, [old], params, region="owned")
        owned = tuple(bound for n in shape for bound in (1, n + 1))
        before = app_new.data.copy()
        if kernel is jacobi:
            jacobi_sweep(app_new.data, old.data, owned, fixed_columns=(4,))
            np.testing.assert_array_equal(app_new.data[:, 4], before[:, 4])   # a fixed column: not written
            layer_new.data[:, 4] = before[:, 4]
        else:
            heat3d_step(app_new.data, old.data, owned, params["r"])
        np.testing.assert_array_equal(app_new.data, layer_new.data)
