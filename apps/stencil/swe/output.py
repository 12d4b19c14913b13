"""Output of the shallow-water model: CF-1.8 netCDF snapshots and a PNG of the final state.

Snapshots go to ``OUTPUT/swe.nc`` (netCDF-4 through h5netcdf, i.e. HDF5 via h5py), written by rank 0
from the gathered global fields. Variables on cell centres (u and v are averaged from their faces,
the relative vorticity from the four surrounding corners)::

    time(time)  seconds since the start      h(time, y, x)  m       fluid depth
    y(y), x(x)  m, cell centres               u, v          m s-1   velocity
                                              zeta          s-1     relative vorticity
"""

from __future__ import annotations

import json

import numpy as np

import hpcgpu
from apps.stencil.snapshots import TIME_ATTRIBUTES, SnapshotFile, plot_depth_and_vorticity


def centred_fields(model):
    """Collective: global h, u, v and vorticity at cell centres on rank 0 (None elsewhere)."""
    h, u, v = (f.gather(root=0) for f in model.state)
    if model.comm.rank != 0:
        return None
    dx, dy = model.parameters.dx, model.parameters.dy
    u_c = 0.5 * (u + np.roll(u, -1, axis=1))                       # periodic in x
    v_north = np.concatenate([v[1:], np.zeros_like(v[:1])], axis=0)  # v = 0 on the north wall
    v_c = 0.5 * (v + v_north)
    # Vorticity at south-west corners: dv/dx - du/dy, with u mirrored (free slip) at the south wall.
    u_south = np.concatenate([u[:1], u[:-1]], axis=0)
    zeta_corner = (v - np.roll(v, 1, axis=1)) / dx - (u - u_south) / dy
    zeta_corner_north = np.concatenate([zeta_corner[1:], zeta_corner[-1:]], axis=0)
    zeta = 0.25 * (zeta_corner + np.roll(zeta_corner, -1, axis=1) + zeta_corner_north + np.roll(zeta_corner_north, -1, axis=1))
    return {"h": h, "u": u_c, "v": v_c, "zeta": zeta}


class Snapshots(SnapshotFile):
    """An appendable CF-1.8 netCDF file of the model state (rank 0 writes, every rank gathers)."""

    UNITS = {"h": ("m", "sea_surface_height_above_sea_floor", "fluid depth"),
             "u": ("m s-1", "eastward_sea_water_velocity", "velocity in x"),
             "v": ("m s-1", "northward_sea_water_velocity", "velocity in y"),
             "zeta": ("s-1", "ocean_relative_vorticity", "relative vorticity")}

    centred_fields = staticmethod(centred_fields)

    def define(self, model) -> None:
        p = model.parameters
        self.file.attrs.update({
            "Conventions": "CF-1.8",
            "title": f"hpcgpu apps.stencil shallow water, init {model.init_name}",
            "source": f"hpcgpu {hpcgpu.__version__} apps.stencil --model swe",
            "institution": "hpcgpu",
            "history": "created by apps.stencil",
            "configuration": json.dumps({"nx": p.nx, "ny": p.ny, "dx": p.dx, "dy": p.dy, "gravity": p.gravity,
                                         "mean_depth": p.mean_depth, "f0": p.coriolis_f0, "beta": p.beta,
                                         "viscosity": p.viscosity, "hyperviscosity": p.hyperviscosity,
                                         "dt": model.dt, "init": model.init_name, "n_ranks": self.comm.size}),
        })
        self.file.dimensions = {"time": None, "y": p.ny, "x": p.nx}
        for name, n, step, long_name in (("x", p.nx, p.dx, "x coordinate of cell centres"),
                                         ("y", p.ny, p.dy, "y coordinate of cell centres")):
            var = self.file.create_variable(name, (name,), "f8")
            var[:] = (np.arange(n) + 0.5) * step
            var.attrs.update({"units": "m", "long_name": long_name, "axis": name.upper()})
        time = self.file.create_variable("time", ("time",), "f8")
        time.attrs.update(TIME_ATTRIBUTES)
        for name, (units, standard, long_name) in self.UNITS.items():
            var = self.file.create_variable(name, ("time", "y", "x"), "f4", chunks=(1, p.ny, p.nx))
            var.attrs.update({"units": units, "standard_name": standard, "long_name": long_name})


def plot_state(model, path) -> None:
    """Collective: rank 0 draws depth and relative vorticity of the current state to ``path``."""
    p = model.parameters
    extent = (0, p.length_x / 1e3, 0, p.length_y / 1e3)

    def draw(axis, values, cmap, title, limits):
        image = axis.imshow(values, origin="lower", extent=extent, cmap=cmap, aspect="equal", **limits)
        axis.set_title(f"{title}, day {model.time / 86400:.2f}")
        axis.set_xlabel("x (km)")
        axis.set_ylabel("y (km)")
        return image

    plot_depth_and_vorticity(centred_fields(model), path, draw)
