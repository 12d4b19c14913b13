"""Output of the model on the sphere: CF-1.8 netCDF snapshots and PNG maps of height and vorticity.

Snapshots go to ``OUTPUT/latlon.nc`` (netCDF classic, 64-bit offset format: crash-safe appends, :mod:`hpcgpu.output.netcdf_classic`), written by rank
0 from the gathered global fields, like the channel's :mod:`apps.stencil.channel.output`; a restarted run
appends to the file of the run it continues and a fresh run never overwrites one
(:mod:`apps.stencil.snapshots`). Everything is
on the cell centres of the C-grid (:mod:`apps.stencil.sphere.parameters`), so xarray, ncview,
Panoply and CDO see one regular latitude-longitude grid::

    lat(lat)          degrees_north  cell-centre latitudes, -90 + (j + 1/2) 180/ny  (bounds lat_bnds)
    lon(lon)          degrees_east   cell-centre longitudes, (i + 1/2) 360/nx       (bounds lon_bnds)
    time(time)        seconds since 2000-01-01 (model time)
    h(time, lat, lon)     m        fluid depth (h + h_s is the free surface)
    u, v(time, lat, lon)  m s-1    eastward / northward velocity, averaged from the two faces of the cell
    zeta(time, lat, lon)  s-1      relative vorticity: the scheme's corner circulation / area, averaged
                                   over the cell's corners (the pole corners, where it is undefined,
                                   are left out: the polar rows average their two equatorward corners)
    h_s(lat, lon)         m        bottom topography (static)

Coordinates carry ``standard_name``, ``units``, ``axis`` and ``bounds`` (CF-1.8 section 4 and 7.1).
The file passes the CF-1.8 checks of the IOOS compliance checker (``cchecker.py --test cf:1.8``).
"""

from __future__ import annotations

import math

import numpy as np

import hpcgpu
from apps.stencil.snapshots import TIME_ATTRIBUTES, SnapshotFile, plot_depth_and_vorticity

SNAPSHOT_NAME = "latlon.nc"
PLOT_NAME = "latlon_final.png"


def grid_coordinates(parameters) -> dict:
    """Cell-centre ``lat``/``lon`` (degrees) and their bounds, shapes (ny,), (nx,), (ny, 2), (nx, 2)."""
    p = parameters
    lat_edges = np.degrees(p.face_latitudes(np.arange(p.ny + 1)))
    lat_edges[0], lat_edges[-1] = -90.0, 90.0  # exact poles (no rounding in the bounds)
    lon_edges = np.degrees(np.arange(p.nx + 1) * p.dlon)
    return {"lat": np.degrees(p.center_latitudes(np.arange(p.ny))), "lon": 0.5 * (lon_edges[:-1] + lon_edges[1:]),
            "lat_bnds": np.stack([lat_edges[:-1], lat_edges[1:]], axis=1),
            "lon_bnds": np.stack([lon_edges[:-1], lon_edges[1:]], axis=1),
            "lat_edges": lat_edges, "lon_edges": lon_edges}  # fmt: skip


def relative_vorticity(u, v, parameters) -> np.ndarray:
    """Relative vorticity at cell centres, shape (ny, nx), 1/s, from global C-grid u, v (float64).

    At the corners it is the scheme's discrete curl (circulation / corner area, the ``zeta`` of
    :mod:`apps.stencil.sphere.stage`); each centre averages its non-polar corners.
    """
    p = parameters
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    rows = np.arange(1, p.ny)  # interior corner rows (the pole rows 0 and ny have no circulation)
    cos_face = np.cos(p.face_latitudes(rows))[:, None]
    cos_center = np.cos(p.center_latitudes(np.arange(p.ny)))[:, None]
    corner = np.zeros((p.ny + 1, p.nx))
    corner[1:-1] = ((v[1:] - np.roll(v[1:], 1, axis=1)) / (p.radius * cos_face * p.dlon)
                    - (u[1:] * cos_center[1:] - u[:-1] * cos_center[:-1]) / (p.radius * cos_face * p.dlat))  # fmt: skip
    valid = np.ones(p.ny + 1)
    valid[0] = valid[-1] = 0.0
    pair = 0.5 * (corner + np.roll(corner, -1, axis=1))  # mean of the corners west and east of a centre column
    return (pair[:-1] * valid[:-1, None] + pair[1:] * valid[1:, None]) / (valid[:-1] + valid[1:])[:, None]


def centred_fields(model):
    """Collective: global h, u, v and vorticity at cell centres on rank 0 (None elsewhere)."""
    h, u, v = (f.gather(root=0) for f in model.state)
    if model.comm.rank != 0:
        return None
    h, u, v = (np.asarray(a, dtype=np.float64) for a in (h, u, v))
    u_centre = 0.5 * (u + np.roll(u, -1, axis=1))  # periodic in longitude
    v_north = np.concatenate([v[1:], np.zeros_like(v[:1])], axis=0)  # v = 0 on the north pole face
    v_centre = 0.5 * (v + v_north)
    return {"h": h, "u": u_centre, "v": v_centre, "zeta": relative_vorticity(u, v, model.parameters)}


class Snapshots(SnapshotFile):
    """An appendable CF-1.8 netCDF file of the model state (rank 0 writes, every rank gathers)."""

    VARIABLES = {"h": ("m", None, "fluid depth"),
                 "u": ("m s-1", "eastward_wind", "eastward velocity (cell-centre average of the west and east faces)"),
                 "v": ("m s-1", "northward_wind", "northward velocity (cell-centre average of the south and north faces)"),
                 "zeta": ("s-1", "atmosphere_relative_vorticity", "relative vorticity (mean of the cell's corners)")}  # fmt: skip

    centred_fields = staticmethod(centred_fields)

    def configuration(self, model) -> dict:
        p = model.parameters
        return {"nx": p.nx, "ny": p.ny, "radius": p.radius, "omega": p.omega, "gravity": p.gravity, "alpha": p.alpha,
                "filter_latitude_deg": math.degrees(p.filter_latitude), "dt": model.dt, "init": model.init_name,
                "n_ranks": self.comm.size}

    def define(self, model) -> None:
        p = model.parameters
        coordinates = grid_coordinates(p)
        self.file.attrs.update({
            "Conventions": "CF-1.8",
            "title": f"hpcgpu apps.stencil shallow water on the sphere, {model.init_name}",
            "source": f"hpcgpu {hpcgpu.__version__} apps.stencil --grid latlon (lat-lon C-grid, SSP-RK3)",
            "institution": "hpcgpu",
            "history": "created by apps.stencil",
            "references": "Williamson et al. (1992), J. Comput. Phys. 102, 211-224",
        })  # fmt: skip
        self.file.dimensions = {"time": None, "lat": p.ny, "lon": p.nx, "bnds": 2}
        for name, axis, units, standard in (("lat", "Y", "degrees_north", "latitude"),
                                            ("lon", "X", "degrees_east", "longitude")):
            var = self.file.create_variable(name, (name,), "f8")
            var[:] = coordinates[name]
            var.attrs.update({"units": units, "standard_name": standard, "long_name": standard, "axis": axis,
                              "bounds": f"{name}_bnds"})
            bounds = self.file.create_variable(f"{name}_bnds", (name, "bnds"), "f8")
            bounds[:] = coordinates[f"{name}_bnds"]
        time = self.file.create_variable("time", ("time",), "f8")
        time.attrs.update(TIME_ATTRIBUTES)
        topography = self.file.create_variable("h_s", ("lat", "lon"), "f4")
        topography[:] = self._topography(model, p, coordinates)
        topography.attrs.update({"units": "m", "long_name": "bottom topography"})
        for name, (units, standard, long_name) in self.VARIABLES.items():
            var = self.file.create_variable(name, ("time", "lat", "lon"), self.dtype)
            var.attrs.update({"units": units, "long_name": long_name})
            if standard is not None:
                var.attrs["standard_name"] = standard

    @staticmethod
    def _topography(model, p, coordinates):
        function = model.initial.topography
        if function is None:
            return np.zeros((p.ny, p.nx), dtype=np.float32)
        lon, lat = np.radians(coordinates["lon"])[None, :], np.radians(coordinates["lat"])[:, None]
        return np.broadcast_to(function(lon, lat), (p.ny, p.nx)).astype(np.float32)


def plot_state(model, path) -> None:
    """Collective: rank 0 draws maps of depth and relative vorticity (lon/lat axes) to ``path``."""
    coordinates = grid_coordinates(model.parameters)
    lon_edges, lat_edges = coordinates["lon_edges"], coordinates["lat_edges"]

    def draw(axis, values, cmap, title, limits):
        mesh = axis.pcolormesh(lon_edges, lat_edges, values, cmap=cmap, shading="flat", **limits)
        axis.set_title(f"{title}, {model.init_name}, day {model.time / 86400:.2f}")
        axis.set_xlabel("longitude (degrees east)")
        axis.set_ylabel("latitude (degrees north)")
        axis.set_xlim(0, 360)
        axis.set_ylim(-90, 90)
        axis.set_xticks(np.arange(0, 361, 60))
        axis.set_yticks(np.arange(-90, 91, 30))
        axis.set_aspect("equal")
        return mesh

    plot_depth_and_vorticity(centred_fields(model), path, draw)


__all__ = ["PLOT_NAME", "SNAPSHOT_NAME", "Snapshots", "centred_fields", "grid_coordinates", "plot_state",
           "relative_vorticity"]
