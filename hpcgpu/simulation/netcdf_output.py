"""Write any model's fields as a CF netCDF file, one record per trigger firing: :class:`NetCDFOutput`.

An operation for :class:`hpcgpu.simulation.Simulation`. Each record gathers the named
:class:`~hpcgpu.Field` objects to rank 0 (owned cells, global index order) and appends them to
``OUTPUT/FILENAME`` through :class:`~hpcgpu.output.netcdf_classic.RecordFile`, so a hard kill at any
moment leaves every earlier record readable. The file holds::

    step(time)            int32   the model's step at the record
    time(time)            float64 model time, s since 2000-01-01 (only if the model has a ``time`` attribute)
    <coordinate>(<axis>)  float64 cell centres: (i + 1/2) * spacing, or the index i when no spacing is given
    <name>(time, ...)     float32 or float64, one variable per field (``long_name``, ``units`` as given)

A fresh run writes the initial state first and refuses an existing file; a restarted run
(``--restart``, also ``--restart latest`` that finds no checkpoint yet) appends to the file of the run
it continues, dropping the records after the step it restarts from (and a record at that very step that the trigger would not have written, such as the
final record of a job stopped by SIGTERM), so the file ends up equal to an uninterrupted run's.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np

import hpcgpu
from hpcgpu.errors import ConfigurationError
from hpcgpu.output.errors import output_error
from hpcgpu.output.netcdf_classic import RecordFile, Schema
from hpcgpu.simulation.operations import Operation
from hpcgpu.simulation.triggers import Trigger

#: Time axis of a model with a ``time`` attribute (CF-1.8): model seconds from a fixed, documented origin.
TIME_ATTRIBUTES = {"units": "seconds since 2000-01-01 00:00:00", "calendar": "standard",
                   "standard_name": "time", "long_name": "model time", "axis": "T"}

_AXIS_NAMES = {1: ("x",), 2: ("y", "x"), 3: ("z", "y", "x")}


class NetCDFOutput(Operation):
    """Append the named fields to a CF-1.8 netCDF file whenever ``trigger`` fires (rank 0 writes).

    Parameters
    ----------
    filename : str
        File name inside the run's output directory (``--output``), e.g. ``"fields.nc"``.
    fields : dict of str to hpcgpu.Field
        The fields to store, by variable name; all on one decomposition.
    trigger : Trigger
        When a record is written (e.g. ``Periodic(100)``); the initial state of a fresh run is always
        written first.
    units, long_names, standard_names : dict of str to str, optional
        CF attributes per field name (``units`` default ``"1"``, dimensionless).
    spacing : sequence of float, optional
        Grid spacing per axis in metres, in the fields' axis order: coordinates become cell centres in
        metres; without it they are cell indices (units ``"1"``).
    axis_names : sequence of str, optional
        Dimension names per axis (default ``("y", "x")`` in 2D, ``("z", "y", "x")`` in 3D).
    dtype : str
        ``"float32"`` (default, half the size) or ``"float64"`` (the bits of a float64 model).
    title : str, optional
        The file's ``title`` attribute.
    """

    def __init__(self, filename: str, fields: dict, trigger: Trigger, *, units: dict | None = None,
                 long_names: dict | None = None, standard_names: dict | None = None, spacing=None,
                 axis_names=None, dtype: str = "float32", title: str | None = None):
        super().__init__(trigger)
        if not fields:
            raise ConfigurationError("NetCDFOutput needs at least one field: fields={'name': field}")
        shapes = {tuple(field.decomposition.global_shape) for field in fields.values()}
        if len(shapes) != 1:
            raise ConfigurationError(f"NetCDFOutput stores fields of one global shape; found {sorted(shapes)}")
        self.global_shape = shapes.pop()
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ConfigurationError(f"NetCDFOutput dtype must be 'float32' or 'float64', not {dtype!r}")
        n_axes = len(self.global_shape)
        self.axis_names = tuple(axis_names) if axis_names is not None else _AXIS_NAMES.get(n_axes)
        if self.axis_names is None or len(self.axis_names) != n_axes:
            raise ConfigurationError(f"NetCDFOutput needs axis_names for {n_axes}-dimensional fields "
                                     f"(one name per axis); found {axis_names!r}")
        if spacing is not None and len(spacing) != n_axes:
            raise ConfigurationError(f"spacing gives {len(spacing)} values for {n_axes} axes")
        self.filename, self.fields, self.dtype = filename, dict(fields), np.dtype(dtype)
        self.units, self.long_names = dict(units or {}), dict(long_names or {})
        self.standard_names, self.spacing, self.title = dict(standard_names or {}), spacing, title
        self.file = None
        self.path = None

    # ------------------------------------------------------------------ operation hooks
    def begin(self, simulation) -> None:
        """Open or create the file (collective verdict), then write the initial state of a fresh run."""
        comm = simulation.comm
        self.path = Path(simulation.output) / self.filename
        problem = None
        if comm.rank == 0:
            try:
                problem = self._open(simulation)
            except OSError as exc:
                problem = f"{self.path} cannot be written: {exc.strerror or exc} (check --output)"
        problem = comm.broadcast(problem)
        if problem is not None:
            self.end(simulation)
            raise ConfigurationError(problem)
        if not simulation.restarted:
            self.act(simulation)

    def act(self, simulation) -> None:
        """Collective: gather the fields and append one record (rank 0)."""
        model = simulation.model
        gathered = {name: field.gather(root=0) for name, field in self.fields.items()}
        if self.file is None:
            return
        record = {"step": np.int32(model.step_index)}
        if "time" in self.file.schema.variables:
            record["time"] = np.float64(model.time)
        record.update({name: np.asarray(values).astype(self.dtype) for name, values in gathered.items()})
        try:
            self.file.append(record)
        except OSError as exc:
            raise output_error(self.path, exc, f"its {self.file.count} earlier records are intact") from None

    def end(self, simulation) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    # ------------------------------------------------------------------ the file (rank 0)
    def schema(self, simulation) -> Schema:
        """The file's dimensions, attributes and variables for this run."""
        model = simulation.model
        schema = Schema()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        schema.attrs.update({"Conventions": "CF-1.8",
                             "title": self.title or f"{simulation.app} {model.describe()}",
                             "source": f"{simulation.app} on hpcgpu {hpcgpu.__version__}",
                             "history": f"{stamp} created by {simulation.app}",
                             "configuration": json.dumps(self.configuration(), sort_keys=True)})
        schema.dimensions = {"time": None, **dict(zip(self.axis_names, self.global_shape))}
        step = schema.create_variable("step", ("time",), "i4")
        step.attrs["long_name"] = "model step"
        if isinstance(getattr(model, "time", None), (int, float)):
            schema.create_variable("time", ("time",), "f8").attrs.update(TIME_ATTRIBUTES)
        for axis, (name, size) in enumerate(zip(self.axis_names, self.global_shape)):
            coordinate = schema.create_variable(name, (name,), "f8")
            if self.spacing is not None:
                coordinate[:] = (np.arange(size) + 0.5) * float(self.spacing[axis])
                coordinate.attrs.update({"units": "m", "long_name": f"{name} coordinate of cell centres"})
            else:
                coordinate[:] = np.arange(size, dtype=np.float64)
                coordinate.attrs.update({"units": "1", "long_name": f"{name} cell index"})
            # No ``axis`` attribute: CF reads axis X/Y as longitude/latitude, which a model's own grid is not.
        for name in self.fields:
            variable = schema.create_variable(name, ("time", *self.axis_names), self.dtype)
            variable.attrs.update({"units": self.units.get(name, "1"),
                                   "long_name": self.long_names.get(name, name)})
            if name in self.standard_names:
                variable.attrs["standard_name"] = self.standard_names[name]
            variable.attrs["comment"] = f"stored as {self.dtype}; the field is {self.fields[name].dtype}"
        return schema

    def configuration(self) -> dict:
        """What a continuing run must share with the file (compared on restart)."""
        return {"fields": list(self.fields), "global_shape": list(self.global_shape),
                "axis_names": list(self.axis_names), "dtype": str(self.dtype),
                "spacing": None if self.spacing is None else [float(s) for s in self.spacing]}

    def _open(self, simulation):
        """Rank 0: create the file, or open it to continue; returns the reason to refuse, or None."""
        continuing = simulation.restarted or getattr(simulation.options, "restart", None) is not None
        if not continuing:
            if self.path.exists():
                return (f"{self.path} already exists and this run starts from step 0: it would be overwritten. "
                        f"Move or delete it, choose another --output, or continue the run that wrote it "
                        f"with --restart latest")
            try:
                self.file = RecordFile.create(self.path, self.schema(simulation))
            except FileExistsError:
                return f"{self.path} appeared while this run was starting: choose another --output"
            return None
        if not self.path.exists():
            self.file = RecordFile.create(self.path, self.schema(simulation))
            return None
        try:
            self.file = RecordFile.open(self.path)
            found = json.loads(self.file.schema.attrs.get("configuration", "{}"))
        except (ValueError, KeyError) as exc:
            return f"{self.path} cannot be continued: it is not a file this output writes ({exc})"
        if found != self.configuration():
            return (f"{self.path} was written with {found}, this run writes {self.configuration()}: move it "
                    f"away or choose another --output")
        self._drop_records_after(simulation)
        return None

    def _drop_records_after(self, simulation) -> None:
        """Rank 0: keep the records an uninterrupted run would hold up to the restart step."""
        first, final = simulation.first_step, simulation.final_step
        steps = [int(self.file.read("step", index)) for index in range(self.file.count)]
        keep = len(steps)
        for index, step in enumerate(steps):
            # The record of the restart step stays if the trigger wrote it there (not a stop's extra
            # record); from step 0 the initial record is written again by begin.
            if step > first or (step == first and (step == 0 or not self.trigger(step, final))):
                keep = index
                break
        if keep < len(steps):
            self.file.truncate(keep)
