"""Stencils applied to distributed Fields equal a serial NumPy reference bit for bit, on 1-4 ranks in
every split of the process grid, overlapped (interior, exchange, rim) or not."""

from __future__ import annotations

import numpy as np
import pytest

from tests.stencils import kernels

CASES = [
    # kernel, reference, global shape, periodic, params, halo_width of the fields, dtype
    (kernels.gray_scott, kernels.gray_scott_reference, (13, 11), True,
     dict(feed=0.037, kill=0.06, diffusion_u=0.2, diffusion_v=0.1, dt=0.9), 1, "float64"),
    (kernels.box_blur_wide, kernels.box_blur_wide_reference, (9, 14), True, dict(w=0.3), (1, 2), "float64"),
    (kernels.heat, kernels.heat_reference, (10, 12), True, dict(alpha=0.21), 2, "float32"),
    (kernels.diffusion_3d, kernels.diffusion_3d_reference, (7, 6, 9), True, dict(k=0.15), 1, "float64"),
    (kernels.upwind_1d, kernels.upwind_1d_reference, (23,), True, dict(courant=0.4), 1, "float64"),
    (kernels.smooth_sqrt, kernels.smooth_sqrt_reference, (8, 9), True, {}, (1, 0), "float64"),
]


def _splits(n_ranks, ndim):
    from hpcgpu.decomposition.shape import factorizations

    return list(factorizations(n_ranks, ndim))


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=240)
def test_update_equals_the_serial_reference_in_every_split(comm):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for case_index, (kernel, reference, shape, periodic, params, halo, dtype) in enumerate(CASES):
        rng = np.random.default_rng(case_index)
        initial = [rng.random(shape).astype(dtype) for _ in kernel.fields]
        expected = reference(*initial, **params)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for dims in _splits(comm.size, len(shape)):
            grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=periodic)
            inputs = {name: hpcgpu.Field(grid, arch, halo_width=halo, dtype=dtype, name=name) for name in kernel.fields}
            outputs = [hpcgpu.Field(grid, arch, halo_width=halo, dtype=dtype, name=f"out{k}")
                       for k in range(kernel.n_outputs)]
            for field, values in zip(inputs.values(), initial):
                field.scatter(values if comm.rank == 0 else None)
            kernel.update(outputs=outputs, inputs=inputs, params=params)
            for k, out in enumerate(outputs):
                result = out.gather()
                if comm.rank == 0:
                    assert result.dtype == np.dtype(dtype)
                    np.testing.assert_array_equal(result, np.asarray(expected[k], dtype=dtype),
                                                  err_msg=f"{kernel.__name__} output {k}, dims {dims}")


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_walls_leave_ghosts_untouched_and_regions_cover_the_owned_cells_once(comm):
    """Non-periodic y: the ghost rows beyond the walls stay 0, so the reference pads with zeros; and
    interior + rim (applied separately after a full exchange) equal the one-pass update."""
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    shape, alpha = (11, 10), 0.2
    rng = np.random.default_rng(5)
    initial = rng.random(shape)
    padded = np.pad(initial, ((1, 1), (0, 0)))
    padded = np.concatenate([padded[:, -1:], padded, padded[:, :1]], axis=1)   # periodic x
    expected = kernels.heat_reference(padded, alpha)[1:-1, 1:-1]
    for dims in _splits(comm.size, 2):
        grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=(False, True))
        u, overlapped, by_region = (hpcgpu.Field(grid, arch, halo_width=1, name=n) for n in ("u", "a", "b"))
        u.scatter(initial if comm.rank == 0 else None)
        kernels.heat.update(outputs=overlapped, inputs={"u": u}, params={"alpha": alpha})
        u.exchange_halos(corners=False)
        by_region.data[...] = np.nan
        kernels.heat.apply(by_region, {"u": u}, {"alpha": alpha}, region="interior")
        kernels.heat.apply(by_region, {"u": u}, {"alpha": alpha}, region="rim")
        assert not np.isnan(by_region.interior).any()
        a, b = overlapped.gather(), by_region.gather()
        if comm.rank == 0:
            np.testing.assert_array_equal(a, expected, err_msg=f"dims {dims}")
            np.testing.assert_array_equal(b, expected, err_msg=f"dims {dims}")


def test_regions_partition_the_owned_cells():
    from hpcgpu.halo.regions import split_owned

    for local_shape, reach in [((5, 7), (1, 1)), ((1, 4), (1, 2)), ((2, 2), (1, 1)), ((6, 5, 4), (1, 2, 0)),
                               ((9,), (3,))]:
        interior, rim = split_owned(local_shape, (0,) * len(local_shape), reach)
        count = np.zeros(local_shape, dtype=int)
        for bounds in ([interior] if interior else []) + rim:
            count[tuple(slice(bounds[2 * a], bounds[2 * a + 1]) for a in range(len(local_shape)))] += 1
        assert (count == 1).all(), (local_shape, reach)


def _serial_fields(shape, halo=1, dtype="float64", names=("u", "out")):
    import hpcgpu

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, shape, periodic=True)
    return grid, arch, [hpcgpu.Field(grid, arch, halo_width=halo, dtype=dtype, name=n) for n in names]


def test_bad_fields_and_parameters_are_refused_with_a_fix():
    import hpcgpu
    from hpcgpu.errors import ConfigurationError

    grid, arch, (u, out) = _serial_fields((6, 6), halo=1)
    thin = hpcgpu.Field(grid, arch, halo_width=(1, 1), name="thin")
    wide_out = hpcgpu.Field(grid, arch, halo_width=1, name="o")
    with pytest.raises(ConfigurationError, match=r"reads 'u' up to \(1, 2\) cells .* halo_width \(1, 1\)"):
        kernels.box_blur_wide.apply(wide_out, {"u": thin}, {"w": 0.5})
    single = hpcgpu.Field(grid, arch, halo_width=1, dtype="float32", name="single")
    with pytest.raises(ConfigurationError, match="expected all fields float32 or all float64"):
        kernels.heat.apply(out, {"u": single}, {"alpha": 0.1})
    integer = hpcgpu.Field(grid, arch, halo_width=1, dtype="int32", name="integer")
    integer_out = hpcgpu.Field(grid, arch, halo_width=1, dtype="int32", name="integer_out")
    with pytest.raises(ConfigurationError, match="found integer_out: int32"):
        kernels.heat.apply(integer_out, {"u": integer}, {"alpha": 0.1})
    with pytest.raises(ConfigurationError, match="is also an input"):
        kernels.heat.apply(u, {"u": u}, {"alpha": 0.1})
    with pytest.raises(ConfigurationError, match="missing alpha; unknown beta"):
        kernels.heat.apply(out, {"u": u}, {"beta": 0.1})
    with pytest.raises(ConfigurationError, match="lack u; name unknown field"):
        kernels.heat.apply(out, {"q": u}, {"alpha": 0.1})
    with pytest.raises(ConfigurationError, match="returns 2 value"):
        kernels.gray_scott.apply(out, (u, u), {})
    with pytest.raises(ConfigurationError, match="region must be one of owned, interior, rim"):
        kernels.heat.apply(out, {"u": u}, {"alpha": 0.1}, region="halo")
    cube_grid, _, (c, c_out) = _serial_fields((4, 4, 4))
    with pytest.raises(ConfigurationError, match="indexes 2 axes, but the fields have 3"):
        kernels.heat.apply(c_out, {"u": c}, {"alpha": 0.1})


def test_generated_cpu_source_is_readable_and_specialised_for_the_ghost_widths():
    grid, arch, (u, out) = _serial_fields((6, 6), halo=2)
    source = kernels.heat.generated_source(out, {"u": u})
    assert "@njit(parallel=True" in source and "fastmath" not in source
    assert "field_u[i_0 + U(1), i_1 + U(2)]" in source   # offset -1 on axis 0 with ghost width 2
    assert "out_0[i_0 + U(2), i_1 + U(2)]" in source
