"""Write any model's fields as a CF netCDF file, one record per trigger firing: :class:`NetCDFOutput`.

An operation for :class:`hpcgpu.simulation.Simulation`. Each record gathers the named
:class:`~hpcgpu.Field` objects to rank 0 (owned cells, global index order) and appends them to
``OUTPUT/FILENAME`` through :class:`~hpcgpu.output.netcdf_classic.RecordFile`, so a hard kill at any
moment leaves every earlier record readable. The file follows CF-1.8 and passes the CF checker
(``compliance-checker --test cf:1.8``) for any model. Its records run along a time axis that depends on
what the model declares (``time``, ``time_units``, ``time_calendar``: :mod:`hpcgpu.output.time_axis`)::

    the model declares                    records along   the time variable
    time_units = "days since 1850-01-01"  time            time(time), a CF time coordinate: dates
    a numeric time, no time_units         time            time(time) in "seconds since 2000-01-01 00:00:00"
    time_units = "s", "hours", "days" ... step            time(step) in those units: elapsed, not dates
    time_units = "1"                      step            time(step), dimensionless
    no numeric time                       step            (none: the step is the coordinate)

and holds::

    step(R)               int32   the model's step at the record (the coordinate of the ``step`` axis)
    time(R)               float64 the model's ``time`` at the record, in its ``time_units`` (see above)
    <coordinate>(<axis>)  float64 cell centres: (i + 1/2) * spacing, or the index i when no spacing is given
    <name>(R, ...)        float32 or float64, one variable per field (``long_name``, ``units`` as given)

A fresh run writes the initial state first and refuses an existing file; a restarted run
(``--restart``, also ``--restart latest`` that finds no checkpoint yet) appends to the file of the run
it continues, dropping the records after the step it restarts from (and a record at that very step that
the trigger would not have written, such as the final record of a job stopped by SIGTERM), so the file
ends up equal to an uninterrupted run's. A file written with another time axis or other fields is not
continued (the message says what differs).
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
from hpcgpu.output.time_axis import TimeAxis, time_axis_of
from hpcgpu.simulation.continuation import records_kept
from hpcgpu.simulation.operations import Operation
from hpcgpu.simulation.triggers import Trigger

_AXIS_NAMES = {1: ("x",), 2: ("y", "x"), 3: ("z", "y", "x")}


class NetCDFOutput(Operation):
    """Append the named fields to a CF-1.8 netCDF file whenever ``trigger`` fires (rank 0 writes).

    The time of each record is the model's: declare it on the model with ``time`` (a number, or a
    property such as ``self.step_index * self.dt``) and ``time_units`` (``"1"``, ``"s"``, ``"days"``,
    ``"days since 1850-01-01"`` ...; see :mod:`hpcgpu.output.time_axis`). A model without a time is
    recorded by step.

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
        reserved = sorted({"step", "time"} & set(self.axis_names))
        if reserved:
            raise ConfigurationError(f"NetCDFOutput axis_names={self.axis_names!r} uses {', '.join(reserved)}, the "
                                     f"names of the record axis and its variables: name the grid axes otherwise")
        if spacing is not None and len(spacing) != n_axes:
            raise ConfigurationError(f"spacing gives {len(spacing)} values for {n_axes} axes")
        self.filename, self.fields, self.dtype = filename, dict(fields), np.dtype(dtype)
        self.units, self.long_names = dict(units or {}), dict(long_names or {})
        self.standard_names, self.spacing, self.title = dict(standard_names or {}), spacing, title
        self.file = None
        self.path = None
        self.time_axis: TimeAxis | None = None

    # ------------------------------------------------------------------ operation hooks
    def begin(self, simulation) -> None:
        """Open or create the file (collective verdict), then write the initial state of a fresh run."""
        comm = simulation.comm
        self.path = Path(simulation.output) / self.filename
        self.time_axis = time_axis_of(simulation.model)   # raises the same error on every rank
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
        if self.time_axis.has_time:
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
        time_axis = self.time_axis if self.time_axis is not None else time_axis_of(model)
        records = time_axis.record_dimension
        schema.dimensions = {records: None, **dict(zip(self.axis_names, self.global_shape))}
        time_axis.add_to(schema)
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
            variable = schema.create_variable(name, (records, *self.axis_names), self.dtype)
            variable.attrs.update({"units": self.units.get(name, "1"),
                                   "long_name": self.long_names.get(name, name), **time_axis.field_attributes()})
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
        written = TimeAxis.of_schema(self.file.schema)
        if written != self.time_axis:
            found_axis = (written.describe() if written is not None else
                          f"records along {self.file.schema.record_dimension!r} without the time variables "
                          f"this output writes")
            return (f"{self.path} holds {found_axis}; this run writes {self.time_axis.describe()} (from its "
                    f"model's time and time_units): move the file away or choose another --output, or declare "
                    f"the time the file was written with")
        self._drop_records_after(simulation)
        return None

    def _drop_records_after(self, simulation) -> None:
        """Rank 0: keep the records an uninterrupted run would hold up to the restart step
        (:func:`hpcgpu.simulation.continuation.records_kept`; from step 0 begin writes the initial record again)."""
        steps = [int(self.file.read("step", index)) for index in range(self.file.count)]
        keep = records_kept(steps, simulation.first_step, simulation.final_step, self.trigger)
        if keep < len(steps):
            self.file.truncate(keep)
