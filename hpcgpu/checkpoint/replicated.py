"""Replicated state (the same on every rank) as plain HDF5 datasets, never pickle.

Step, model time, configuration, RNG states, thermostat and optimizer state, loss scaler, data-loader
position: a nested ``dict`` whose leaves are

=====================================  ==========================================  ===================
value                                  stored as                                   read back as
=====================================  ==========================================  ===================
``numpy.ndarray`` (numeric, bool)      dataset of the same dtype and shape         ``numpy.ndarray``
NumPy scalar (``np.float32(1.5)``)     0-d dataset                                 NumPy scalar
``bytes``                              uint8 dataset                               ``bytes``
int, float, bool, str, None,           UTF-8 JSON text in a string dataset         the JSON value
lists/tuples of these                                                              (tuples -> lists)
``dict`` with ``str`` keys             a group (recursively)                       ``dict``
=====================================  ==========================================  ===================

Every dataset carries ``kind`` and ``crc32`` attributes; the CRC is checked on load. A top-level value
saved with a unit (``units`` of :meth:`~hpcgpu.checkpoint.CheckpointManager.save`) carries it as a
``units`` attribute, for people and tools reading the file. Reading uses
only h5py datasets and ``json.loads``, so a hostile file cannot run code. Key names may hold any
character: ``%`` and ``/`` are escaped as ``%25`` and ``%2F`` in HDF5 names.
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np

from hpcgpu.checkpoint.integrity import crc32


class ReplicatedValueError(ValueError):
    """A value cannot be stored, or a stored value cannot be read back (message says which)."""


def _escape(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ReplicatedValueError(f"replicated keys must be non-empty strings, got {key!r}")
    escaped = key.replace("%", "%25").replace("/", "%2F")
    return "%2E" if escaped == "." else escaped


def _unescape(name: str) -> str:
    return name.replace("%2E", ".").replace("%2F", "/").replace("%25", "%")


def _json_text(value, path: str) -> str:
    def check(item):
        if isinstance(item, float) and not math.isfinite(item):
            return
        if item is None or isinstance(item, (bool, int, float, str)):
            return
        if isinstance(item, (list, tuple)):
            for element in item:
                check(element)
            return
        raise ReplicatedValueError(
            f"replicated[{path!r}] holds a {type(item).__name__}; expected numbers, strings, lists, dicts or "
            "NumPy arrays. Convert it (for example np.asarray(...) or .tolist()) before saving."
        )

    check(value)
    return json.dumps(value)


def _encode(value, path: str):
    """(kind, numpy array or str) for one leaf."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.kind in "OV":
            raise ReplicatedValueError(f"replicated[{path!r}] has dtype {value.dtype}; expected a numeric or bool array")
        return "array", np.ascontiguousarray(value)
    if isinstance(value, np.generic):
        return "numpy-scalar", np.asarray(value)
    if isinstance(value, (bytes, bytearray)):
        return "bytes", np.frombuffer(bytes(value), dtype=np.uint8)
    return "json", _json_text(value, path)


def write_replicated(group, values: dict, path: str = "", units: dict | None = None) -> None:
    """Write ``values`` into the h5py ``group`` (see the module docstring for the encoding).

    ``units`` maps top-level keys to a unit string, stored as the dataset's ``units`` attribute
    (for readers of the file; :func:`read_replicated` does not return it).
    """
    units = units or {}
    for key, value in values.items():
        name, where = _escape(key), f"{path}/{key}" if path else key
        if isinstance(value, dict):
            write_replicated(group.create_group(name), value, where)
            continue
        kind, payload = _encode(value, where)
        if kind == "json":
            dataset = group.create_dataset(name, data=payload)
            dataset.attrs["crc32"] = np.uint32(zlib.crc32(payload.encode()) & 0xFFFFFFFF)
        else:
            dataset = group.create_dataset(name, data=payload)
            dataset.attrs["crc32"] = np.uint32(crc32(payload))
        dataset.attrs["kind"] = kind
        if key in units and not path:
            dataset.attrs["units"] = units[key]


def read_replicated(group, where: str) -> dict:
    """Read a group written by :func:`write_replicated`; ``where`` names it in error messages.

    Raises
    ------
    ReplicatedValueError
        For an unknown kind, a forbidden dtype, a CRC mismatch or malformed JSON.
    """
    import h5py

    values = {}
    for name, item in group.items():
        key, location = _unescape(name), f"{where}/{name}"
        if isinstance(item, h5py.Group):
            values[key] = read_replicated(item, location)
            continue
        kind = item.attrs.get("kind")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        stored_crc = item.attrs.get("crc32")
        if kind not in ("json", "array", "numpy-scalar", "bytes") or stored_crc is None:
            raise ReplicatedValueError(f"{location}: expected a dataset with 'kind' and 'crc32' attributes, found kind={kind!r}")
        if kind == "json":
            if item.dtype.kind not in "OS" or item.shape != ():
                raise ReplicatedValueError(f"{location}: expected a scalar string dataset, found {item.dtype} {item.shape}")
            text = item.asstr()[()]
            found_crc = zlib.crc32(text.encode()) & 0xFFFFFFFF
        else:
            if item.dtype.hasobject or item.dtype.kind in "OV":
                raise ReplicatedValueError(f"{location}: dtype {item.dtype} is not allowed (expected a numeric array)")
            data = item[()]
            found_crc = crc32(np.asarray(data))
        if found_crc != int(stored_crc):
            raise ReplicatedValueError(f"{location}: checksum mismatch (stored CRC32 {int(stored_crc):#010x}, "
                                       f"data has {found_crc:#010x}); the file is corrupt")
        if kind == "json":
            try:
                values[key] = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ReplicatedValueError(f"{location}: malformed JSON ({exc})") from None
        elif kind == "array":
            values[key] = np.asarray(data)
        elif kind == "numpy-scalar":
            values[key] = np.asarray(data)[()]
        else:
            values[key] = np.asarray(data, dtype=np.uint8).tobytes()
    return values


def replicated_digests(values: dict, path: str = "") -> dict[str, int]:
    """CRC32 of every leaf's encoding, keyed by its path: compared across ranks before a save."""
    digests = {}
    for key, value in values.items():
        where = f"{path}/{key}" if path else str(key)
        if isinstance(value, dict):
            digests.update(replicated_digests(value, where))
            continue
        kind, payload = _encode(value, where)
        if kind == "json":
            digests[where] = zlib.crc32(payload.encode()) & 0xFFFFFFFF
        else:
            header = f"{payload.dtype.str}{payload.shape}".encode()
            digests[where] = zlib.crc32(header, crc32(payload)) & 0xFFFFFFFF
    return digests
