"""Array-library dispatch shared by the shallow-water modules (no CuPy import on CPU)."""

from __future__ import annotations

import collections

from hpcgpu.arch import array_module  # noqa: F401 - re-exported for the shallow-water modules
from hpcgpu.arch import is_device_array as is_cupy  # the one "is this a CuPy array?" test (re-exported)


class IdentityCache:
    """Remembers which tuples of objects passed a check, by identity; used to skip re-validation.

    A kernel wrapper validates its arrays (shapes, dtypes, contiguity, aliasing) on the first call
    with a given set of array objects and skips that on later calls with the very same objects:
    the properties checked cannot change while the object lives, and the cache holds references to
    the objects it remembers, so an ``id`` cannot be reused by another object while cached. At most
    ``size`` tuples are kept (least recently used dropped first). The time stepping of the models
    calls the same few tuples every stage, where the checks cost tens of microseconds per call.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._entries: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()

    def __contains__(self, objects: tuple) -> bool:
        key = tuple(map(id, objects))
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def add(self, objects: tuple) -> None:
        """Remember ``objects`` (call after they passed the check); returns None."""
        self._entries[tuple(map(id, objects))] = tuple(objects)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
