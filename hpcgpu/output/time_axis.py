"""The time axis of a model's records in a CF-1.8 netCDF file: :class:`TimeAxis`, from what the model declares.

A model says what its time is with two attributes (read by :class:`hpcgpu.NetCDFOutput`):

- ``time`` -- a number: the model time after step ``step_index`` (an attribute or a property, such
  as ``self.step_index * self.dt``, which then holds after a restart with no further code);
- ``time_units`` -- what that number measures, a UDUNITS string of one of three kinds:

  ================================  ============================================================
  ``"1"``                           dimensionless time (a model in its own units of time)
  ``"s"``, ``"hours"``, ``"days"``  elapsed time in seconds, minutes, hours or days, no calendar
  ``"days since 1850-01-01"``       a date: time since a reference date-time, in calendar
                                    ``time_calendar`` (default ``"standard"``)
  ================================  ============================================================

Each kind gets the encoding that says what it is, so that the CF checker passes and readers do not
invent dates:

- a **date** is a CF time coordinate: the records run along the dimension ``time``, whose
  coordinate variable ``time`` carries ``standard_name = "time"``, ``axis = "T"``, the units and the
  calendar; xarray decodes it to dates. A model with a numeric ``time`` and no ``time_units`` gets
  this axis in ``"seconds since 2000-01-01 00:00:00"``: declare ``time_units`` to say what its time is.
- **elapsed or dimensionless time** has no reference date, and a CF time coordinate must have one
  (CF-1.8 section 4.4: ``UNIT since DATE``); the CF checker also requires a dimension called
  ``time`` to have such a coordinate. So the records run along the dimension ``step`` (coordinate:
  the model step) and ``time(step)`` is an auxiliary coordinate (every field names it in its
  ``coordinates``) with the declared units and no ``standard_name``: xarray shows plain numbers.
- **no time** (no numeric ``time`` attribute): the records run along ``step`` alone.

``time_units`` without a numeric ``time``, units of another kind (``"m"``, ``"months"``) and an
unknown calendar are refused with a :class:`~hpcgpu.errors.ConfigurationError` that says which forms
are accepted.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

from hpcgpu.errors import ConfigurationError

#: The time axis of a model with a numeric ``time`` and no ``time_units``.
DEFAULT_DATE_UNITS = "seconds since 2000-01-01 00:00:00"
DEFAULT_CALENDAR = "standard"

#: UDUNITS spellings of the units of elapsed time that CF time coordinates use (each parses with UDUNITS-2;
#: no months or years: their length varies, and CF-1.8 section 4.4 advises against them).
ELAPSED_UNITS = ("s", "sec", "secs", "second", "seconds", "min", "minute", "minutes",
                 "h", "hr", "hour", "hours", "d", "day", "days")
#: The CF-1.8 calendars xarray decodes (``"none"`` is CF too, but xarray and cftime cannot decode it).
CALENDARS = ("standard", "gregorian", "proleptic_gregorian", "noleap", "365_day", "all_leap", "366_day",
             "360_day", "julian")

_DATE = re.compile(r"\s*(?P<unit>\w+)\s+since\s+(?P<date>[+-]?\d{1,4}-\d{1,2}-\d{1,2}"
                   r"(?:[ T]\d{1,2}:\d{1,2}(?::\d{1,2}(?:\.\d+)?)?)?(?:\s*(?:Z|UTC|[+-]\d{1,2}(?::?\d{2})?))?)\s*")
_FORMS = ('"1" (dimensionless), a unit of elapsed time ("s", "minutes", "hours", "days") or a date '
          '("days since 1850-01-01", "seconds since 2000-01-01 00:00:00")')


@dataclass(frozen=True)
class TimeAxis:
    """How the records of a file are indexed in time.

    Attributes
    ----------
    kind : str
        ``"date"`` (a CF time coordinate), ``"elapsed"`` (time in s, h, days ... with no date),
        ``"dimensionless"`` (time in units ``"1"``) or ``"steps"`` (no time: the step only).
    units : str or None
        The ``units`` of the ``time`` variable (None for ``"steps"``).
    calendar : str or None
        The ``calendar`` of a date axis (None otherwise).
    """

    kind: str
    units: str | None = None
    calendar: str | None = None

    @property
    def record_dimension(self) -> str:
        """``"time"`` for a date axis, ``"step"`` otherwise."""
        return "time" if self.kind == "date" else "step"

    @property
    def has_time(self) -> bool:
        return self.kind != "steps"

    def describe(self) -> str:
        """A short phrase for messages: ``time in "days"`` ..."""
        if self.kind == "steps":
            return f"records along {self.record_dimension!r} with no time"
        calendar = f", calendar {self.calendar!r}" if self.calendar else ""
        return f"records along {self.record_dimension!r}, time in {self.units!r}{calendar}"

    # ------------------------------------------------------------------ the schema
    def add_to(self, schema) -> None:
        """Add the record dimension's variables (``step``, ``time``) to a :class:`~hpcgpu.output.netcdf_classic.Schema`
        whose record dimension is :attr:`record_dimension`; returns None."""
        dimension = (self.record_dimension,)
        step = schema.create_variable("step", dimension, "i4")
        step.attrs["long_name"] = "model step"
        if self.kind != "date":
            step.attrs["units"] = "1"   # the coordinate variable of the records
        if not self.has_time:
            return
        time = schema.create_variable("time", dimension, "f8")
        if self.kind == "date":
            time.attrs.update({"units": self.units, "calendar": self.calendar, "standard_name": "time",
                               "long_name": "model time", "axis": "T"})
        elif self.kind == "elapsed":
            time.attrs.update({"units": self.units, "long_name": "model time",
                               "comment": "elapsed model time, not a date (no reference date-time)"})
        else:
            time.attrs.update({"units": "1", "long_name": "model time",
                               "comment": "dimensionless: in the model's own unit of time, not a date"})

    def field_attributes(self) -> dict:
        """Attributes every record field gets: ``coordinates`` names the auxiliary ``time`` (if any)."""
        return {"coordinates": "time"} if self.has_time and self.kind != "date" else {}

    @classmethod
    def of_schema(cls, schema) -> "TimeAxis | None":
        """The axis a file was written with (None if its record variables are not those of a TimeAxis)."""
        record = schema.record_dimension
        time = schema.variables.get("time")
        if record is None or "step" not in schema.variables:
            return None
        if time is None:
            axis = cls("steps")
        else:
            calendar = time.attrs.get("calendar")
            try:
                axis = classify(str(time.attrs.get("units", "")), None if calendar is None else str(calendar),
                                "the file")
            except ConfigurationError:
                return None
        return axis if axis.record_dimension == record else None


def classify(units: str, calendar: str | None, owner: str) -> TimeAxis:
    """The :class:`TimeAxis` of time in ``units`` (and ``calendar``); ``owner`` names who declared them.

    Raises ConfigurationError for units of none of the three kinds, or a calendar that is not CF's.
    """
    if not isinstance(units, str):
        raise ConfigurationError(f"{owner} declares time_units = {units!r}; expected a string: {_FORMS}")
    text = units.strip()
    date = _DATE.fullmatch(text)
    if date is None and calendar is not None:
        raise ConfigurationError(f"{owner} declares time_calendar = {calendar!r} with time_units = {units!r}; a "
                                 f"calendar applies to dates only: give time_units as 'UNIT since DATE' "
                                 f"(e.g. 'days since 1850-01-01') or drop time_calendar")
    if text == "1":
        return TimeAxis("dimensionless", "1")
    if text in ELAPSED_UNITS:
        return TimeAxis("elapsed", text)
    if date is not None and date["unit"] in ELAPSED_UNITS:
        calendar = DEFAULT_CALENDAR if calendar is None else calendar
        if calendar not in CALENDARS:
            raise ConfigurationError(f"{owner} declares time_calendar = {calendar!r}; expected one of the CF "
                                     f"calendars {', '.join(CALENDARS)}")
        return TimeAxis("date", text, calendar)
    raise ConfigurationError(f"{owner} declares time_units = {units!r}; expected {_FORMS}")


def is_number(value) -> bool:
    """True for an int or float (Python or NumPy), False for bool and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def time_axis_of(model) -> TimeAxis:
    """The :class:`TimeAxis` a model declares with ``time``, ``time_units`` and ``time_calendar`` (see the module
    docstring). The same on every rank for a model built from the same options.

    Raises ConfigurationError when ``time_units`` is declared without a numeric ``time``, or is not valid.
    """
    owner = f"model {getattr(model, 'name', type(model).__name__)!r}"
    units = getattr(model, "time_units", None)
    calendar = getattr(model, "time_calendar", None)
    time = getattr(model, "time", None)
    if units is None:
        if calendar is not None:
            raise ConfigurationError(f"{owner} declares time_calendar = {calendar!r} but no time_units: declare "
                                     f"time_units = 'UNIT since DATE' (e.g. 'days since 1850-01-01') as well")
        return classify(DEFAULT_DATE_UNITS, DEFAULT_CALENDAR, owner) if is_number(time) else TimeAxis("steps")
    axis = classify(units, calendar, owner)
    if not is_number(time):
        raise ConfigurationError(f"{owner} declares time_units = {units!r} but its time is {time!r}; expected a "
                                 f"number, the model time after step step_index: set self.time in step() and "
                                 f"load_checkpoint(), or define a property (return self.step_index * self.dt)")
    return axis
