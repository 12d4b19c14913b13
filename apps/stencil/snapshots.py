"""What the two shallow-water grids share in their output: the appendable netCDF file and the PNG.

The file is netCDF classic in its 64-bit offset form (:mod:`hpcgpu.output.netcdf_classic`), which
every netCDF reader opens: a record is written, synced and only then counted, so a hard kill at any
moment leaves every earlier record readable.

:mod:`apps.stencil.channel.output` (beta-plane channel, x/y in metres) and
:mod:`apps.stencil.sphere.output` (latitude-longitude) differ in their coordinates, their
variables' metadata and how a map is drawn; opening the file on rank 0, appending a time record of
the gathered cell-centre fields, closing it, and the two-panel figure (depth, relative vorticity)
live here once.

A snapshot file is never overwritten. A fresh run (the model at step 0) refuses a file that already
exists; a restarted run appends to the file of the run it continues::

    records at t <  restart step    kept (written by the earlier job, equal to what this run would write)
    record at the restart step      kept if it is a snapshot step of this run (``snapshot_every``, or its
                                    final step); dropped if the earlier job wrote it only because it
                                    ended there (``--steps``), as an uninterrupted run does not have it
    records at t >  restart step    dropped: a later part of the earlier job (after the checkpoint it
                                    restarts from) that this run computes again and replaces
    no file yet                     created, holding the records from the restart on

(the rule of every appendable output: :mod:`hpcgpu.simulation.continuation`), so that a chain of jobs
ends with the file of the uninterrupted run.

A file whose grid or configuration (``configuration`` attribute, the rank count aside) differs from
this run's is refused as well. Each refusal is one ConfigurationError, raised on every rank before
any gather.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.output.atomic import save_figure
from hpcgpu.output.errors import output_error
from hpcgpu.output.netcdf_classic import RecordFile, Schema
from hpcgpu.simulation.continuation import records_kept

#: Time axis of every snapshot file (CF-1.8): model seconds from a fixed, documented origin.
TIME_ATTRIBUTES = {"units": "seconds since 2000-01-01 00:00:00", "calendar": "standard",
                   "standard_name": "time", "long_name": "model time", "axis": "T"}

#: Configuration keys that may differ between the jobs of one run (a restart works on any rank count).
_MAY_CHANGE_ON_RESTART = ("n_ranks",)


class SnapshotFile:
    """An appendable CF-1.8 netCDF file: rank 0 writes, every rank takes part in the gathers.

    Subclasses define :meth:`configuration` (a JSON-able dict of the grid and physics, stored in the
    global attribute ``configuration`` and compared on restart), :meth:`centred_fields` (collective:
    ``{name: (ny, nx) array}`` on rank 0, None elsewhere) and :meth:`define` (global attributes,
    dimensions, coordinates and one ``(time, y, x)`` variable of :attr:`dtype` per field, on a
    :class:`hpcgpu.output.netcdf_classic.Schema`, which reads like an ``h5netcdf.File``);
    :attr:`VARIABLES` names the time-dependent fields.

    Parameters
    ----------
    model
        The model (``comm``, ``time`` and ``dt`` in seconds are read; on a restart also ``first_step``,
        the checkpoint's step, ``steps``, the final step, and ``snapshot_trigger()``, when it writes).
    path : str or Path
    restarted : bool
        False for a fresh run (the model at step 0): an existing ``path`` is refused. True when the
        model continues (from a checkpoint, or ``--restart`` before any): the records an uninterrupted
        run holds up to ``model.first_step`` are kept, the others dropped (see the module docstring).

    Raises
    ------
    ConfigurationError
        On every rank, when ``path`` exists on a fresh run, or belongs to another run (other grid,
        other configuration, not a readable snapshot file) on a restart.
    """

    #: ``{name: (units, standard_name or None, long_name)}`` of the ``(time, y, x)`` fields.
    VARIABLES: dict = {}

    def __init__(self, model, path, restarted: bool = False):
        self.comm = model.comm
        self.path = Path(path)
        self.file = None
        #: NumPy dtype of the stored fields (``--snapshot-precision``; float32 unless the model asks otherwise).
        self.dtype = np.dtype(getattr(model, "snapshot_dtype", "float32"))
        problem = None
        if self.comm.rank == 0:
            try:
                problem = self._open(model, restarted)
            except OSError as exc:
                problem = f"{self.path} cannot be written: {exc.strerror or exc} (check the --output directory)"
        # Rank 0 alone sees the file: every rank raises its verdict together, before any gather.
        problem = self.comm.broadcast(problem)
        if problem is not None:
            self.close()
            raise ConfigurationError(problem)

    @property
    def count(self) -> int:
        """Records in the file (rank 0; 0 elsewhere)."""
        return self.file.count if self.file is not None else 0

    # ------------------------------------------------------------------ what a subclass defines
    def configuration(self, model) -> dict:
        raise NotImplementedError

    def define(self, model) -> None:
        raise NotImplementedError

    @staticmethod
    def centred_fields(model):
        raise NotImplementedError

    # ------------------------------------------------------------------ opening (rank 0)
    def _open(self, model, restarted: bool):
        """Rank 0: open or create the file; returns the reason to refuse it, or None."""
        if not self.path.exists():
            schema = self.file = Schema()
            schema.attrs["configuration"] = json.dumps(self.configuration(model))
            self.define(model)
            computed = getattr(model, "dtype", None)
            for name in self.VARIABLES:
                schema.variables[name].attrs.setdefault(
                    "comment", f"stored as {self.dtype}" + (f"; the model computes in {computed}" if computed else ""))
            stamp = _utc_stamp()
            schema.attrs["history"] = (f"{stamp} created by a restarted run at model time {model.time:g} s; the "
                                       "records before it are in the output of the earlier job"
                                       if restarted else f"{stamp} {schema.attrs.get('history', 'created')}")
            self.file = None
            try:
                self.file = RecordFile.create(self.path, schema)
            except FileExistsError:
                return f"{self.path} appeared while this run was starting (another run writes there): choose another --output"
            return None
        if not restarted:
            return (f"{self.path} already exists and this run starts from step 0: it would be overwritten. "
                    f"Move or delete it, choose another --output, or continue the run that wrote it with "
                    f"--restart latest (or --restart PATH)")
        try:
            self.file = RecordFile.open(self.path)
            problem = self._incompatibility(model)
        except (OSError, ValueError, KeyError) as exc:
            problem = f"{self.path} cannot be read as a snapshot file ({exc})"
        if problem is not None:
            return (f"{problem}; this restarted run would append to it. Move it away or choose another "
                    f"--output (or restart with the options of the run that wrote it)")
        self._drop_records_after(model)
        return None

    def _incompatibility(self, model):
        """Rank 0: why the open file does not belong to this run, or None."""
        mine = self.configuration(model)
        found = json.loads(self.file.schema.attrs.get("configuration", "{}"))
        differ = sorted(key for key in set(mine) | set(found)
                        if key not in _MAY_CHANGE_ON_RESTART and mine.get(key) != found.get(key))
        if differ:
            return (f"{self.path} was written by another run: its configuration has "
                    + ", ".join(f"{key}={found.get(key)!r}" for key in differ) + ", this run "
                    + ", ".join(f"{key}={mine.get(key)!r}" for key in differ))
        variables = self.file.schema.variables
        if "time" not in variables or any(name not in variables for name in self.VARIABLES):
            return f"{self.path} lacks the variables time, {', '.join(self.VARIABLES)}"
        stored = {variables[name].dtype for name in self.VARIABLES}
        if stored != {self.dtype}:
            return (f"{self.path} stores its fields as {', '.join(sorted(map(str, stored)))}, this run "
                    f"as {self.dtype} (--snapshot-precision)")
        return None

    def _drop_records_after(self, model) -> None:
        """Rank 0: keep the records an uninterrupted run would hold up to the restart step, drop the rest
        (:func:`hpcgpu.simulation.continuation.records_kept`, the rule of every appendable output)."""
        times = np.array([self.file.read("time", index) for index in range(self.file.count)], dtype=np.float64)
        steps = np.rint(times / model.dt).astype(np.int64)   # record times are step * dt
        keep = records_kept(steps, model.first_step, model.steps, model.snapshot_trigger())
        if keep < times.size:
            self.file.truncate(keep)

    # ------------------------------------------------------------------ writing
    def write(self, model) -> None:
        """Collective: append the current state as one time record (crash-safe: see :mod:`hpcgpu.output.netcdf_classic`).

        An I/O error (a full disk) on rank 0 raises :class:`hpcgpu.errors.OutputError` naming the file;
        the records written before stay readable.
        """
        fields = self.centred_fields(model)
        if self.file is None:
            return
        record = {"time": np.float64(model.time)}
        record.update({name: values.astype(self.dtype) for name, values in fields.items()})
        try:
            self.file.append(record)
        except OSError as exc:
            raise output_error(self.path, exc, f"{self.count} earlier records are intact") from None

    def close(self) -> None:
        if isinstance(self.file, RecordFile):
            self.file.close()
        self.file = None


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    save_figure(figure, path, dpi=110)
    plt.close(figure)
