"""TimeAxis: what a model's time declaration becomes in the file, and the declarations that are refused."""

from __future__ import annotations

import pytest

from hpcgpu.errors import ConfigurationError
from hpcgpu.output.netcdf_classic import Schema
from hpcgpu.output.time_axis import DEFAULT_DATE_UNITS, ELAPSED_UNITS, TimeAxis, classify, time_axis_of


class Declared:
    """A model's declarations only (what time_axis_of reads)."""

    name = "declared"

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


@pytest.mark.parametrize("units, kind, dimension", [
    ("1", "dimensionless", "step"),
    ("s", "elapsed", "step"),
    ("seconds", "elapsed", "step"),
    ("hours", "elapsed", "step"),
    ("days", "elapsed", "step"),
    ("days since 1850-01-01", "date", "time"),
    ("seconds since 2000-01-01 00:00:00", "date", "time"),
    ("hours since 1979-1-1T06:00:00Z", "date", "time"),
])
def test_units_of_each_kind_give_their_axis(units, kind, dimension):
    axis = time_axis_of(Declared(time=0.0, time_units=units))
    assert (axis.kind, axis.units, axis.record_dimension) == (kind, units, dimension)
    assert axis.calendar == ("standard" if kind == "date" else None)


def test_a_numeric_time_without_units_keeps_seconds_since_2000_and_no_time_means_steps():
    assert time_axis_of(Declared(time=3)) == TimeAxis("date", DEFAULT_DATE_UNITS, "standard")
    for model in (Declared(), Declared(time=None), Declared(time="noon"), Declared(time=True)):
        assert time_axis_of(model) == TimeAxis("steps")
    numpy = pytest.importorskip("numpy")
    assert time_axis_of(Declared(time=numpy.float32(1), time_units="1")).kind == "dimensionless"


def test_a_calendar_goes_with_a_date():
    axis = time_axis_of(Declared(time=0.0, time_units="days since 0001-01-01", time_calendar="360_day"))
    assert (axis.kind, axis.calendar) == ("date", "360_day")


@pytest.mark.parametrize("attributes, words", [
    ({"time": 0.0, "time_units": "m"}, ["time_units = 'm'", "dimensionless", "days since 1850-01-01"]),
    ({"time": 0.0, "time_units": "months since 2000-01-01"}, ["months since"]),
    ({"time": 0.0, "time_units": "days since noon"}, ["days since noon"]),
    ({"time": 0.0, "time_units": 1}, ["expected a string"]),
    ({"time_units": "s"}, ["time_units = 's'", "its time is None", "property"]),
    ({"time": "t0", "time_units": "1"}, ["its time is 't0'"]),
    ({"time": 0.0, "time_units": "s", "time_calendar": "noleap"}, ["calendar applies to dates only"]),
    ({"time": 0.0, "time_calendar": "noleap"}, ["no time_units"]),
    ({"time": 0.0, "time_units": "days since 2000-01-01", "time_calendar": "none"}, ["'none'", "360_day"]),
])
def test_a_bad_declaration_is_refused_naming_the_model_and_the_accepted_forms(attributes, words):
    with pytest.raises(ConfigurationError) as error:
        time_axis_of(Declared(**attributes))
    assert "model 'declared'" in str(error.value)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("axis", [TimeAxis("steps"), classify("1", None, "test"), classify("days", None, "test"),
                                  classify("days since 1850-01-01", "noleap", "test")])
def test_the_axis_of_a_schema_is_the_axis_it_was_built_with(axis):
    schema = Schema()
    schema.dimensions = {axis.record_dimension: None, "x": 3}
    axis.add_to(schema)
    assert TimeAxis.of_schema(schema) == axis
    other = Schema()
    other.dimensions = {"record": None}
    other.create_variable("step", ("record",), "i4")
    assert TimeAxis.of_schema(other) is None


def test_every_accepted_unit_is_a_unit_of_time_for_udunits():
    """The CF checker reads units with UDUNITS-2 (cf_units): each accepted spelling must parse there."""
    import cf_units

    for units in ELAPSED_UNITS:
        assert cf_units.Unit(units).is_convertible("s"), units
        assert cf_units.Unit(f"{units} since 2000-01-01").is_time_reference(), units
