"""What the two shallow-water grids share in their output: the appendable netCDF file and the PNG.

:mod:`apps.stencil.swe.output` (beta-plane channel, x/y in metres) and
:mod:`apps.stencil.sphere.output` (latitude-longitude) differ in their coordinates, their
variables' metadata and how a map is drawn; opening the file on rank 0, appending a time record of
the gathered cell-centre fields, closing it, and the two-panel figure (depth, relative vorticity)
live here once.
"""

from __future__ import annotations

import numpy as np

#: Time axis of every snapshot file (CF-1.8): model seconds from a fixed, documented origin.
TIME_ATTRIBUTES = {"units": "seconds since 2000-01-01 00:00:00", "calendar": "standard",
                   "standard_name": "time", "long_name": "model time", "axis": "T"}


class SnapshotFile:
    """An appendable CF-1.8 netCDF file: rank 0 writes, every rank takes part in the gathers.

    Subclasses define :meth:`centred_fields` (collective: ``{name: (ny, nx) array}`` on rank 0,
    None elsewhere) and :meth:`define` (global attributes, dimensions, coordinates and one
    ``(time, y, x)`` float32 variable per field, on the open ``h5netcdf.File``).
    """

    def __init__(self, model, path):
        self.comm = model.comm
        self.file = None
        self.count = 0
        if self.comm.rank != 0:
            return
        try:
            import h5netcdf
        except ImportError:
            print("note: h5netcdf is not installed; no netCDF snapshots written (pip install 'hpcgpu[apps]')")
            return
        self.file = h5netcdf.File(path, "w")
        self.define(model)

    def define(self, model) -> None:
        raise NotImplementedError

    @staticmethod
    def centred_fields(model):
        raise NotImplementedError

    def write(self, model) -> None:
        """Collective: append the current state as one time record."""
        fields = self.centred_fields(model)
        if self.file is None:
            return
        index = self.count
        self.file.resize_dimension("time", index + 1)
        self.file.variables["time"][index] = model.time
        for name, values in fields.items():
            self.file.variables[name][index, :, :] = values.astype(np.float32)
        self.file.flush()
        self.count += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def plot_depth_and_vorticity(fields, path, draw) -> None:
    """Rank 0: two panels, depth h and relative vorticity zeta (symmetric colour scale), saved to ``path``.

    Parameters
    ----------
    fields : dict or None
        ``centred_fields`` of the model (None on ranks other than 0: nothing is drawn).
    path : str or Path
    draw : callable ``draw(axis, values, cmap, title, colour_limits) -> mappable``
        Draws one (ny, nx) field on a matplotlib axis in the grid's coordinates; ``colour_limits`` is
        ``{}`` or ``{"vmin": ..., "vmax": ...}``.
    """
    if fields is None:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG written (pip install 'hpcgpu[apps]')")
        return
    figure, axes = plt.subplots(2, 1, figsize=(9, 9), constrained_layout=True)
    for axis, name, cmap, title in ((axes[0], "h", "viridis", "depth h (m)"),
                                    (axes[1], "zeta", "RdBu_r", "relative vorticity (1/s)")):
        values = fields[name]
        limits = {}
        if name == "zeta":
            limit = float(np.max(np.abs(values))) or 1.0
            limits = {"vmin": -limit, "vmax": limit}
        mappable = draw(axis, values, cmap, title, limits)
        figure.colorbar(mappable, ax=axis, shrink=0.8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
