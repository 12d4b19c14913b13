"""netCDF snapshots and map plots of the latlon model: CF coordinates that xarray decodes without
warnings, the gathered fields, and the vorticity of solid-body rotation (2 u0 sin(lat) / a)."""

import contextlib
import math
import types
import warnings

import numpy as np
import pytest

from apps.stencil.sphere import SphereParameters
from apps.stencil.sphere.output import grid_coordinates, relative_vorticity


def test_coordinates_and_bounds_cover_the_sphere():
    p = SphereParameters(nx=8, ny=4)
    c = grid_coordinates(p)
    np.testing.assert_allclose(c["lat"], [-67.5, -22.5, 22.5, 67.5], rtol=0, atol=1e-12)
    np.testing.assert_allclose(c["lon"], 22.5 + 45.0 * np.arange(8), rtol=0, atol=1e-12)
    assert c["lat_bnds"][0, 0] == -90.0 and c["lat_bnds"][-1, 1] == 90.0
    np.testing.assert_array_equal(c["lat_bnds"][1:, 0], c["lat_bnds"][:-1, 1])
    assert c["lon_bnds"][0, 0] == 0.0 and c["lon_bnds"][-1, 1] == pytest.approx(360.0, abs=1e-12)


def test_vorticity_of_solid_body_rotation_is_2_u0_sin_lat_over_a():
    """u = u0 cos(lat), v = 0 has zeta = 2 u0 sin(lat) / a; the discrete curl is second-order accurate
    (the corner average adds O(dlat^2)), exact in the zonal mean structure."""
    errors = []
    for ny in (16, 32):
        p = SphereParameters(nx=2 * ny, ny=ny)
        u0 = 40.0
        lat = p.center_latitudes(np.arange(p.ny))
        u = np.broadcast_to(u0 * np.cos(lat)[:, None], (p.ny, p.nx))
        zeta = relative_vorticity(u, np.zeros((p.ny, p.nx)), p)
        exact = 2 * u0 * np.sin(lat)[:, None] / p.radius
        interior = slice(1, -1)  # the polar rows average one-sided corners (first order)
        errors.append(np.max(np.abs(zeta[interior] - exact[interior])) / np.max(np.abs(exact)))
        assert np.all(np.sign(zeta[:, 0]) == np.sign(lat))
    assert errors[0] < 2e-2 and errors[1] < errors[0] / 3.5, errors


class _Timers:
    def phase(self, name):
        return contextlib.nullcontext()


@pytest.mark.mpi(ranks=[2])
def test_snapshots_open_in_xarray_with_cf_coordinates_and_plots_are_written(comm):
    import tempfile
    from pathlib import Path

    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    output = Path(comm.broadcast(tempfile.mkdtemp() if comm.rank == 0 else None))
    options = types.SimpleNamespace(nx=24, ny=12, init="williamson5", alpha=0.0, days=None, dt=900.0, cfl=None,
                                    dims=(1, 2), precision="fp64", filter_latitude=60.0, snapshot_every=2)  # fmt: skip
    model = LatLonModel(comm, arch, options)
    model.after_step(_Timers(), output, 4)
    for _ in range(4):
        model.step(_Timers())
        model.after_step(_Timers(), output, 4)
    final_h = model.fields[0].gather()
    model.finish(output, {}, plot=True)
    if comm.rank != 0:
        return
    xarray = pytest.importorskip("xarray")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xarray.open_dataset(output / "latlon.nc", engine="netcdf4") as dataset:
            dataset.load()
    assert dataset.attrs["Conventions"] == "CF-1.8"
    assert dataset["h"].dims == ("time", "lat", "lon") and dataset["h"].shape == (3, 12, 24)
    for name, units, standard, axis in (("lat", "degrees_north", "latitude", "Y"), ("lon", "degrees_east", "longitude", "X")):
        coordinate = dataset[name]
        assert (coordinate.attrs["units"], coordinate.attrs["standard_name"], coordinate.attrs["axis"]) == (units, standard, axis)
        assert name + "_bnds" in dataset
    p = model.parameters
    np.testing.assert_allclose(dataset["lat"], np.degrees(p.center_latitudes(np.arange(12))), rtol=0, atol=1e-12)
    np.testing.assert_allclose(dataset["lon"], 7.5 + 15.0 * np.arange(24), rtol=0, atol=1e-12)
    assert np.issubdtype(dataset["time"].dtype, np.datetime64)
    seconds = (dataset["time"] - dataset["time"][0]).values / np.timedelta64(1, "s")
    np.testing.assert_allclose(seconds, [0, 1800, 3600])
    np.testing.assert_allclose(dataset["h"][-1], final_h, rtol=1e-6)
    # The mountain (2000 m at 270E, 30N) is in the static topography, where xarray says it is.
    assert float(dataset["h_s"].sel(lon=270, lat=30, method="nearest")) > 500  # nearest centre is 10.6 deg off
    assert float(dataset["h_s"].sel(lon=90, lat=-30, method="nearest")) == 0
    assert math.isfinite(float(dataset["zeta"].max()))
    png = output / "latlon_final.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (output / "latlon_history.json").exists()
