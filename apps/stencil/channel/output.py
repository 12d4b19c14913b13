"""Output of the shallow-water model: CF-1.8 netCDF snapshots and a PNG of the final state.

Snapshots go to ``OUTPUT/swe.nc`` (netCDF classic, 64-bit offset format: crash-safe appends, :mod:`hpcgpu.output.netcdf_classic`), written by rank 0
from the gathered global fields; a restarted run appends to the file of the run it continues and a
fresh run never overwrites one (:mod:`apps.stencil.snapshots`). Variables on cell centres (u and v
are averaged from their faces, the relative vorticity from the four surrounding corners)::

    time(time)  s since 2000-01-01 (model time)     h(time, y, x)  m       fluid depth
    y(y), x(x)  m, cell centres (projection_y/x_     u, v          m s-1   velocity
                coordinate of the grid mapping)      zeta          s-1     relative vorticity
    beta_plane  grid mapping (no data)

The channel is an idealised beta plane, not a region of the Earth. So that CF readers still get the
relation between x/y and latitude/longitude that the CF standard names ask for, ``beta_plane``
describes it as the plane tangent (orthographic projection) at the reference latitude of the
idealised planet of :mod:`apps.stencil.channel.parameters` (radius 10 000 km; the latitude follows from
``f0 = 2 Omega sin(lat0)`` and ``beta = 2 Omega cos(lat0) / a``), its centre at the middle of the
channel. Far from the centre, and across the periodic x boundary, those latitudes and longitudes
are nominal.

The file passes the CF-1.8 checks of the IOOS compliance checker (``cchecker.py --test cf:1.8``).
"""

from __future__ import annotations

import math

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

    VARIABLES = {"h": ("m", "sea_floor_depth_below_sea_surface", "fluid depth"),
                 "u": ("m s-1", "eastward_sea_water_velocity", "velocity in x"),
                 "v": ("m s-1", "northward_sea_water_velocity", "velocity in y"),
                 "zeta": ("s-1", "ocean_relative_vorticity", "relative vorticity")}

    centred_fields = staticmethod(centred_fields)

    def configuration(self, model) -> dict:
        p = model.parameters
        return {"nx": p.nx, "ny": p.ny, "dx": p.dx, "dy": p.dy, "gravity": p.gravity, "mean_depth": p.mean_depth,
                "f0": p.coriolis_f0, "beta": p.beta, "viscosity": p.viscosity, "hyperviscosity": p.hyperviscosity,
                "dt": model.dt, "init": model.init_name, "n_ranks": self.comm.size}

    def define(self, model) -> None:
        p = model.parameters
        self.file.attrs.update({
            "Conventions": "CF-1.8",
            "title": f"hpcgpu apps.stencil shallow water, init {model.init_name}",
            "source": f"hpcgpu {hpcgpu.__version__} apps.stencil --model swe",
            "institution": "hpcgpu",
            "history": "created by apps.stencil",
        })
        self.file.dimensions = {"time": None, "y": p.ny, "x": p.nx}
        for name, n, step, long_name in (("x", p.nx, p.dx, "x coordinate of cell centres (eastward)"),
                                         ("y", p.ny, p.dy, "y coordinate of cell centres (northward)")):
            var = self.file.create_variable(name, (name,), "f8")
            var[:] = (np.arange(n) + 0.5) * step
            var.attrs.update({"units": "m", "standard_name": f"projection_{name}_coordinate",
                              "long_name": long_name, "axis": name.upper()})
        mapping = self.file.create_variable("beta_plane", (), "i4")
        mapping.attrs.update(beta_plane_mapping(p))
        time = self.file.create_variable("time", ("time",), "f8")
        time.attrs.update(TIME_ATTRIBUTES)
        for name, (units, standard, long_name) in self.VARIABLES.items():
            var = self.file.create_variable(name, ("time", "y", "x"), self.dtype)
            var.attrs.update({"units": units, "standard_name": standard, "long_name": long_name,
                              "grid_mapping": "beta_plane"})


#: Radius of the idealised planet of the default beta plane (:mod:`apps.stencil.channel.parameters`), m.
PLANET_RADIUS = 1.0e7


def beta_plane_mapping(parameters) -> dict:
    """CF grid-mapping attributes of the channel: the tangent plane at the beta plane's reference latitude.

    ``tan(lat0) = f0 / (beta a)`` on a planet of radius ``a`` = :data:`PLANET_RADIUS` (45 degrees for
    the defaults); the projection's origin is the channel centre ``(Lx/2, Ly/2)``.
    """
    p = parameters
    latitude = math.degrees(math.atan2(p.coriolis_f0, p.beta * PLANET_RADIUS))
    return {"grid_mapping_name": "orthographic", "latitude_of_projection_origin": latitude,
            "longitude_of_projection_origin": 0.0, "false_easting": 0.5 * p.length_x,
            "false_northing": 0.5 * p.length_y, "earth_radius": PLANET_RADIUS,
            "comment": "idealised beta plane f = f0 + beta (y - Ly/2), periodic in x: the plane tangent at "
                       "the reference latitude of a planet of this radius; latitudes and longitudes far "
                       "from the channel centre are nominal"}


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
