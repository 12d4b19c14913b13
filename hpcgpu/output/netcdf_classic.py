"""Append-only netCDF files that a hard kill cannot corrupt (netCDF classic, 64-bit offset format).

Every netCDF reader reads the classic formats (netCDF-C, and so netCDF4-python and the tools built on
it; the tests open our files with netCDF4, xarray and the CF checker). Their layout makes appending
crash-safe without a journal: a header, the fixed-size variables, then one *record* after another,
each record holding one time slice of every record variable; the header's record count ``numrecs``
(4 bytes at offset 4) says how many records a reader sees. A record is appended in this order::

    1. write the record's bytes after the last counted record       (the count still excludes it)
    2. fdatasync                                                    (the bytes are on the disk)
    3. write the new count: one aligned 4-byte write at offset 4    (now readers see the record)

A kill (``kill -9``, a node failure, the OOM killer) before step 3 leaves the count at the previous
record: readers see every earlier record, and the partial bytes past them are ignored (readers
compute the layout from the header; the writer truncates them when it next opens the file). Step 3
is a single write of 4 bytes inside one page, which the kernel applies whole. The header and the
fixed variables are written once, into a temporary file that is linked to its name only when
complete (an existing file is never replaced), so a file either does not exist or is valid.

Cost per record: one ``pwrite`` of the record, one ``fdatasync`` and one 4-byte ``pwrite``
(``benchmarks/output_append.py`` measures it).

Limits of the format (CDF-2): dimension lengths below 2**31, at most 4 GiB per variable and record,
types int8/char/int16/int32/float32/float64 (no compression, no groups, no 64-bit integers).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.output.atomic import fsync_path
from hpcgpu.runtime.fault_injection import maybe_fail

MAGIC = b"CDF\x02"           # classic format, 64-bit offsets
NUMRECS_OFFSET = 4
_NC_DIMENSION, _NC_VARIABLE, _NC_ATTRIBUTE = 0x0A, 0x0B, 0x0C
#: nc_type codes and their big-endian NumPy dtypes.
_TYPES = {1: ">i1", 2: "S1", 3: ">i2", 4: ">i4", 5: ">f4", 6: ">f8"}
_CODES = {np.dtype(np.int8): 1, np.dtype(np.int16): 3, np.dtype(np.int32): 4, np.dtype(np.float32): 5,
          np.dtype(np.float64): 6}
#: The netCDF default fill values, written into variables that get no data (a grid-mapping variable).
_FILL = {1: -127, 3: -32767, 4: -2147483647, 5: 9.9692099683868690e36, 6: 9.9692099683868690e36}
_LIMIT = 2**32 - 4


def _pad4(n: int) -> int:
    return (n + 3) & ~3


def _nc_code(dtype) -> int:
    try:
        return _CODES[np.dtype(dtype)]
    except KeyError:
        raise ConfigurationError(f"netCDF classic stores int8, int16, int32, float32 and float64 variables; "
                                 f"found dtype {np.dtype(dtype)}: convert the data first") from None


# ---------------------------------------------------------------------------------- the schema
class Variable:
    """One variable of a :class:`Schema`: name, dimension names, dtype, attributes, optional data."""

    def __init__(self, name: str, dimensions: tuple, dtype):
        self.name, self.dimensions = name, tuple(dimensions)
        self.code = _nc_code(dtype)
        self.dtype = np.dtype(_TYPES[self.code]).newbyteorder("=")
        self.attrs: dict = {}
        self.data = None

    def __setitem__(self, key, values) -> None:
        if key != slice(None):
            raise ValueError("a schema variable takes its whole data at once: var[:] = values")
        self.data = np.asarray(values, dtype=self.dtype)


class Schema:
    """What a new file holds before its first record: dimensions, global attributes, variables.

    It reads like h5netcdf's ``File`` so that a writer defines a file in familiar terms::

        schema = Schema()
        schema.attrs["Conventions"] = "CF-1.8"
        schema.dimensions = {"time": None, "y": 180, "x": 360}   # None: the record (unlimited) dimension
        x = schema.create_variable("x", ("x",), "f8"); x[:] = centres; x.attrs["units"] = "m"
        schema.create_variable("h", ("time", "y", "x"), "f4")   # a record variable: one slice per record

    Only the first dimension of a variable may be the record dimension (the classic model).
    """

    def __init__(self):
        self.attrs: dict = {}
        self.dimensions: dict = {}
        self.variables: dict[str, Variable] = {}

    def create_variable(self, name: str, dimensions=(), dtype="f8", chunks=None) -> Variable:
        """Add a variable (``chunks`` is accepted and ignored: the classic format stores it contiguously)."""
        del chunks
        for dim in dimensions:
            if dim not in self.dimensions:
                raise ConfigurationError(f"variable {name!r} uses dimension {dim!r}, which the schema lacks "
                                         f"(it has {', '.join(self.dimensions) or 'none'})")
        record = self.record_dimension
        if any(dim == record for dim in dimensions[1:]):
            raise ConfigurationError(f"variable {name!r}: the record dimension {record!r} must come first")
        variable = Variable(name, dimensions, dtype)
        self.variables[name] = variable
        return variable

    @property
    def record_dimension(self):
        unlimited = [name for name, size in self.dimensions.items() if size is None]
        if len(unlimited) > 1:
            raise ConfigurationError(f"a classic netCDF file has one record dimension; found {unlimited}")
        return unlimited[0] if unlimited else None


# ---------------------------------------------------------------------------------- header coding
def _encode_name(name: str) -> bytes:
    raw = name.encode("utf-8")
    return struct.pack(">i", len(raw)) + raw.ljust(_pad4(len(raw)), b"\0")


def _encode_attribute(name: str, value) -> bytes:
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _encode_name(name) + struct.pack(">ii", 2, len(raw)) + raw.ljust(_pad4(len(raw)), b"\0")
    array = np.atleast_1d(np.asarray(value))
    if array.dtype == bool:
        array = array.astype(np.int32)
    elif array.dtype.kind in "iu":
        array = array.astype(np.int32) if np.all(np.abs(array) < 2**31) else array.astype(np.float64)
    elif array.dtype.kind == "f" and array.dtype != np.float32:
        array = array.astype(np.float64)
    code = _nc_code(array.dtype)
    raw = array.astype(_TYPES[code]).tobytes()
    return _encode_name(name) + struct.pack(">ii", code, array.size) + raw.ljust(_pad4(len(raw)), b"\0")


def _encode_attributes(attributes: dict) -> bytes:
    if not attributes:
        return struct.pack(">ii", 0, 0)
    return struct.pack(">ii", _NC_ATTRIBUTE, len(attributes)) + b"".join(
        _encode_attribute(name, value) for name, value in attributes.items())


class Layout:
    """Where everything lies in a file: header size, each variable's offset and size, the record size."""

    def __init__(self, schema: Schema, header_size: int):
        dims = schema.dimensions
        record = schema.record_dimension
        self.record_variables = [v for v in schema.variables.values() if v.dimensions[:1] == (record,) and record]
        self.fixed_variables = [v for v in schema.variables.values() if v not in self.record_variables]
        self.shapes = {v.name: tuple(dims[d] for d in v.dimensions if d != record) for v in schema.variables.values()}
        self.vsize, self.begin = {}, {}
        offset = header_size
        for v in self.fixed_variables:
            self.vsize[v.name] = _pad4(int(np.prod(self.shapes[v.name], dtype=np.int64)) * v.dtype.itemsize)
            self.begin[v.name] = offset
            offset += self.vsize[v.name]
        self.records_begin = offset
        for v in self.record_variables:
            size = int(np.prod(self.shapes[v.name], dtype=np.int64)) * v.dtype.itemsize
            # The classic format's one exception: a lone record variable is not padded.
            self.vsize[v.name] = size if len(self.record_variables) == 1 else _pad4(size)
            self.begin[v.name] = offset
            offset += self.vsize[v.name]
        self.record_size = sum(self.vsize[v.name] for v in self.record_variables)
        for name, size in self.vsize.items():
            if size > _LIMIT:
                raise ConfigurationError(f"variable {name!r} needs {size} bytes per record or in all; the "
                                         f"netCDF classic (64-bit offset) format stores at most {_LIMIT}")


def encode_header(schema: Schema, numrecs: int = 0) -> tuple[bytes, Layout]:
    """The header bytes of ``schema`` and the file layout that follows them."""
    dim_ids = {name: i for i, name in enumerate(schema.dimensions)}

    def body(layout: Layout | None) -> bytes:
        parts = [MAGIC, struct.pack(">i", numrecs)]
        if schema.dimensions:
            parts.append(struct.pack(">ii", _NC_DIMENSION, len(schema.dimensions)))
            for name, size in schema.dimensions.items():
                parts.append(_encode_name(name) + struct.pack(">i", 0 if size is None else int(size)))
        else:
            parts.append(struct.pack(">ii", 0, 0))
        parts.append(_encode_attributes(schema.attrs))
        if schema.variables:
            parts.append(struct.pack(">ii", _NC_VARIABLE, len(schema.variables)))
            for v in schema.variables.values():
                parts.append(_encode_name(v.name) + struct.pack(">i", len(v.dimensions))
                             + b"".join(struct.pack(">i", dim_ids[d]) for d in v.dimensions)
                             + _encode_attributes(v.attrs) + struct.pack(">i", v.code)
                             + struct.pack(">iq", layout.vsize[v.name] if layout else 0,
                                           layout.begin[v.name] if layout else 0))
        else:
            parts.append(struct.pack(">ii", 0, 0))
        return b"".join(parts)

    size = len(body(None))   # offsets are fixed-width: the size does not depend on their values
    layout = Layout(schema, size)
    header = body(layout)
    assert len(header) == size
    return header, layout


# ---------------------------------------------------------------------------------- header decoding
class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.at)
        self.at += 4
        return value

    def offset(self) -> int:
        (value,) = struct.unpack_from(">q", self.data, self.at)
        self.at += 8
        return value

    def raw(self, n: int) -> bytes:
        value = self.data[self.at:self.at + n]
        if len(value) < n:
            raise ValueError("the header ends early")
        self.at += _pad4(n)
        return value

    def name(self) -> str:
        return self.raw(self.int()).decode("utf-8")

    def attributes(self) -> dict:
        tag, count = self.int(), self.int()
        attributes = {}
        if tag == 0:
            return attributes
        if tag != _NC_ATTRIBUTE:
            raise ValueError(f"attribute list tag {tag}")
        for _ in range(count):
            name, code, n = self.name(), self.int(), self.int()
            if code not in _TYPES:
                raise ValueError(f"attribute {name!r} has type code {code}")
            raw = self.raw(n * np.dtype(_TYPES[code]).itemsize)
            attributes[name] = (raw.decode("utf-8") if code == 2
                                else np.frombuffer(raw, dtype=_TYPES[code]).astype(np.dtype(_TYPES[code]).newbyteorder("=")))
        return attributes


def decode_header(data: bytes) -> tuple[Schema, Layout, int]:
    """The schema, layout and record count of a 64-bit-offset file whose first bytes are ``data``.

    Raises ValueError when ``data`` is not such a header (or is cut short).
    """
    if data[:4] != MAGIC:
        raise ValueError(f"not a netCDF 64-bit offset file (starts with {data[:4]!r})")
    reader = _Reader(data)
    reader.at = 4
    numrecs = reader.int()
    schema = Schema()
    tag, count = reader.int(), reader.int()
    names = []
    if tag == _NC_DIMENSION:
        for _ in range(count):
            name, size = reader.name(), reader.int()
            schema.dimensions[name] = None if size == 0 else size
            names.append(name)
    schema.attrs = reader.attributes()
    tag, count = reader.int(), reader.int()
    offsets = {}
    if tag == _NC_VARIABLE:
        for _ in range(count):
            name = reader.name()
            dims = tuple(names[reader.int()] for _ in range(reader.int()))
            attributes = reader.attributes()
            code, vsize, begin = reader.int(), reader.int(), reader.offset()
            variable = Variable(name, dims, np.dtype(_TYPES[code]).newbyteorder("="))
            variable.attrs = attributes
            schema.variables[name] = variable
            offsets[name] = (vsize, begin)
    layout = Layout(schema, reader.at)
    if any(offsets[name] != (layout.vsize[name], layout.begin[name]) for name in offsets):
        raise ValueError("variable offsets differ from the packed layout this writer uses")
    return schema, layout, numrecs


# ---------------------------------------------------------------------------------- the file
class RecordFile:
    """A netCDF classic file open for appending records, crash-safe at every instant.

    Use :meth:`create` for a new file and :meth:`open` to continue one; :meth:`append` adds a
    record, :meth:`truncate` drops records from the end. Single writer: one process (rank 0).

    Parameters
    ----------
    path : Path
    schema : Schema
    layout : Layout
    count : int
        The records in the file.
    durable : bool
        ``fdatasync`` each record before counting it (default True): the file then also survives a
        power loss or a node crash, not only a killed process. False skips it (faster on slow disks).
    """

    def __init__(self, path, schema: Schema, layout: Layout, count: int, durable: bool = True):
        self.path, self.schema, self.layout, self.count, self.durable = Path(path), schema, layout, count, durable
        self._fd = os.open(self.path, os.O_RDWR)

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path, schema: Schema, durable: bool = True) -> "RecordFile":
        """Write the header and fixed variables of ``schema`` to a new file ``path``; never replaces one.

        The file appears complete or not at all: it is written under a temporary name and linked to
        ``path`` (which fails if ``path`` exists: ``FileExistsError``).
        """
        path = Path(path)
        header, layout = encode_header(schema)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as handle:
                handle.write(header)
                for v in layout.fixed_variables:
                    data = v.data if v.data is not None else np.full(layout.shapes[v.name], _FILL[v.code], v.dtype)
                    data = np.asarray(data, dtype=v.dtype)
                    if data.shape != layout.shapes[v.name]:
                        raise ConfigurationError(f"variable {v.name!r} has shape {data.shape}; its dimensions "
                                                 f"{v.dimensions} give {layout.shapes[v.name]}")
                    raw = data.astype(v.dtype.newbyteorder(">")).tobytes()
                    handle.write(raw.ljust(layout.vsize[v.name], b"\0"))
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        if durable:
            fsync_path(path.parent)
        return cls(path, schema, layout, 0, durable)

    @classmethod
    def open(cls, path, durable: bool = True) -> "RecordFile":
        """Open an existing file to append; bytes past its last counted record (a kill mid-append) are dropped.

        Raises ValueError when ``path`` is not a netCDF 64-bit offset file this module can append to.
        """
        path = Path(path)
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
            schema = layout = None
            while True:
                try:
                    schema, layout, numrecs = decode_header(head)
                    break
                except (ValueError, struct.error, IndexError) as exc:
                    more = handle.read(len(head))   # a header larger than what was read: read more
                    if not more:
                        raise ValueError(f"{path} has no complete netCDF 64-bit offset header ({exc})") from None
                    head += more
            size = os.fstat(handle.fileno()).st_size
        end = layout.records_begin + numrecs * layout.record_size
        if size < end:
            raise ValueError(f"{path} holds {size} bytes; its header counts {numrecs} records, which need {end}")
        opened = cls(path, schema, layout, numrecs, durable)
        if size > end:
            os.ftruncate(opened._fd, end)   # an append that a kill interrupted
        return opened

    # ------------------------------------------------------------------ records
    def append(self, values: dict) -> None:
        """Append one record: ``values`` maps every record variable to its slice (shape without the record axis).

        The record is written, synced (``durable``), then counted (see the module docstring).
        """
        maybe_fail("write", 0)   # the writer is rank 0
        layout = self.layout
        missing = [v.name for v in layout.record_variables if v.name not in values]
        if missing:
            raise ConfigurationError(f"a record of {self.path.name} needs {', '.join(missing)}")
        parts = []
        for v in layout.record_variables:
            data = np.asarray(values[v.name])
            if data.shape != layout.shapes[v.name]:
                raise ConfigurationError(f"record value of {v.name!r} has shape {data.shape}, expected "
                                         f"{layout.shapes[v.name]}")
            parts.append(data.astype(v.dtype.newbyteorder(">")).tobytes().ljust(layout.vsize[v.name], b"\0"))
        record = b"".join(parts)
        _write_all(self._fd, record, layout.records_begin + self.count * layout.record_size)
        if self.durable:
            os.fdatasync(self._fd)
        self._set_count(self.count + 1)

    def truncate(self, count: int) -> None:
        """Keep the first ``count`` records: the count is lowered first, then the file is cut."""
        if not 0 <= count <= self.count:
            raise ValueError(f"cannot keep {count} of {self.count} records")
        self._set_count(count)
        if self.durable:
            os.fdatasync(self._fd)
        os.ftruncate(self._fd, self.layout.records_begin + count * self.layout.record_size)

    def read(self, name: str, index: int):
        """Record ``index`` of record variable ``name`` (or the whole fixed variable ``name``: index ignored)."""
        layout = self.layout
        variable = self.schema.variables[name]
        shape = layout.shapes[name]
        n_bytes = int(np.prod(shape, dtype=np.int64)) * variable.dtype.itemsize
        offset = layout.begin[name]
        if variable in layout.record_variables:
            if not 0 <= index < self.count:
                raise IndexError(f"record {index} of {self.count}")
            offset += index * layout.record_size
        raw = os.pread(self._fd, n_bytes, offset)
        return np.frombuffer(raw, dtype=variable.dtype.newbyteorder(">")).reshape(shape).astype(variable.dtype)

    def _set_count(self, count: int) -> None:
        # One aligned 4-byte write inside the first page: a reader sees the old count or the new one.
        _write_all(self._fd, struct.pack(">i", count), NUMRECS_OFFSET)
        self.count = count

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
