"""A ghost fill composed into one pass: every written cell is a copy, a negated copy or a constant.

A halo exchange on one rank (periodic axes with one block) and the physical boundary conditions
after it are a sequence of data movements: pack owned cells into a buffer, copy the buffer to the
receive buffer, unpack it into ghosts, then mirror, negate or set ghost layers, each step reading
what the previous ones wrote. :class:`GhostMap` runs that sequence *symbolically* once, at planning
time, and keeps only its net effect: for every cell whose value changes, where the final value comes
from (a cell of one of the arrays, as it was *before* the fill, possibly negated) or which constant it
is. Applying the map is then one gather over those cells: one kernel on the GPU instead of one per
pack, copy, unpack and boundary layer (about 20 per stage of the shallow-water step on one rank,
each a few microseconds at small grids), a few NumPy fancy-index assignments on the CPU.

The composition moves values without arithmetic (a negation flips the sign bit, twice gives the
original bits), so the result is bitwise the result of the sequence. It is only valid when no cell
read by the map is also written by it (then the order of the gather does not matter); when that is
not so, :meth:`GhostMap.compose` returns None and the caller runs the sequence as before.

Symbols: a value is ``(source, kind, constant)`` with ``source`` the global id
``array_index * stride + flat_index`` of the cell it was copied from, ``kind`` :data:`COPY`,
:data:`NEGATE` or :data:`CONSTANT` (then ``constant`` holds it, in the arrays' dtype).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from hpcgpu.arch import is_device_array

COPY, NEGATE, CONSTANT = 0, 1, 2
_UNSIGNED = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_THREADS = 256


def _members(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``values`` occur in ``sorted_set`` (sorted int64)."""
    if not sorted_set.size:
        return np.zeros(values.shape, dtype=bool)
    position = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[position] == values


class SymbolicBuffer:
    """The symbolic contents of one flat buffer (a field's padded array or a message buffer).

    A field's buffer (``first_id`` given) stores only its written cells, sorted by index, so a fill
    of a large array costs memory and time in proportion to its ghost cells, not to the array; a
    message buffer (``first_id`` None, as small as the ghosts) is stored whole.

    Parameters
    ----------
    size : int
        Number of elements.
    dtype : numpy.dtype
        The dtype constants are stored in.
    first_id : int or None
        Global id of element 0 (an unwritten element k holds the value of cell ``first_id + k``,
        i.e. itself); None for a buffer whose contents are undefined until written (id -1).
    """

    def __init__(self, size: int, dtype, first_id: int | None = None):
        self.size, self.dtype, self.first_id = int(size), np.dtype(dtype), first_id
        self.dense = first_id is None
        n = self.size if self.dense else 0
        self.index = np.arange(n, dtype=np.int64)          # the stored cells (sorted)
        self.source = np.full(n, -1, dtype=np.int64)
        self.kind = np.zeros(n, dtype=np.int8)
        self.constant = np.zeros(n, dtype=self.dtype)

    def read(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, kind, constant) of ``cells`` (an index array)."""
        cells = np.asarray(cells, dtype=np.int64)
        if self.dense:
            return self.source[cells], self.kind[cells], self.constant[cells]
        if not self.index.size:
            return cells + self.first_id, np.zeros(cells.shape, np.int8), np.zeros(cells.shape, self.dtype)
        position = np.minimum(np.searchsorted(self.index, cells), self.index.size - 1)
        written = self.index[position] == cells
        return (np.where(written, self.source[position], cells + self.first_id),
                np.where(written, self.kind[position], np.int8(COPY)),
                np.where(written, self.constant[position], self.dtype.type(0)))

    def write(self, cells: np.ndarray, source: np.ndarray, kind: np.ndarray, constant: np.ndarray) -> None:
        """Store symbols at ``cells`` (unique indices), replacing what was there; returns None."""
        cells = np.asarray(cells, dtype=np.int64)
        if self.dense:
            self.source[cells], self.kind[cells], self.constant[cells] = source, kind, constant
            return
        order = np.argsort(cells, kind="stable")
        cells, source, kind, constant = cells[order], source[order], kind[order], constant[order]
        keep = ~_members(self.index, cells)
        index = np.concatenate([self.index[keep], cells])
        merged = np.argsort(index, kind="stable")
        self.index = index[merged]
        self.source = np.concatenate([self.source[keep], source])[merged]
        self.kind = np.concatenate([self.kind[keep], kind.astype(np.int8)])[merged]
        self.constant = np.concatenate([self.constant[keep], constant.astype(self.dtype)])[merged]

    def assign(self, destination: np.ndarray, other: "SymbolicBuffer", source: np.ndarray, negate: bool) -> None:
        """``self[destination] = (-)other[source]`` on symbols (index arrays of equal size); returns None."""
        source_ids, kinds, constants = other.read(source)
        if negate:
            kinds = np.where(kinds == CONSTANT, CONSTANT, kinds ^ 1).astype(np.int8)
            constants = np.negative(constants)
        self.write(destination, source_ids, kinds, constants)

    def fill(self, destination: np.ndarray, value) -> None:
        """``self[destination] = value`` (a constant, cast to the dtype); returns None."""
        destination = np.asarray(destination, dtype=np.int64)
        self.write(destination, np.full(destination.shape, -1, np.int64), np.full(destination.shape, CONSTANT, np.int8),
                   np.full(destination.shape, value, dtype=self.dtype))

    def changes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cells, source, kind, constant) of the stored cells whose value is not their own (a field's)."""
        own = self.index + (0 if self.first_id is None else self.first_id)
        changed = (self.source != own) | (self.kind != COPY)
        return self.index[changed], self.source[changed], self.kind[changed], self.constant[changed]


def _cells(shape: Sequence[int], index: tuple) -> np.ndarray:
    """Flat C-order indices of ``array[index]`` (a tuple of one slice per axis), in that selection's shape."""
    ranges = [np.arange(*part.indices(int(n)), dtype=np.int64) for part, n in zip(index, shape)]
    return np.ravel_multi_index(np.ix_(*ranges), tuple(int(n) for n in shape))


def copy_indices(shape: Sequence[int], destination: tuple, source: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Flat C-order indices of ``array[destination] = array[source]`` (source broadcast) in an array of ``shape``."""
    target = _cells(shape, destination)
    return target.reshape(-1), np.broadcast_to(_cells(shape, source), target.shape).reshape(-1)


def fill_indices(shape: Sequence[int], destination: tuple) -> np.ndarray:
    """Flat C-order indices of ``array[destination]`` in an array of ``shape``."""
    return _cells(shape, destination).reshape(-1)


class GhostMap:
    """The net effect of a ghost fill on some arrays, applied in one pass (see the module docstring).

    Build it with :meth:`compose`; :meth:`apply` fills the arrays in place.

    Attributes
    ----------
    n_cells : int
        Number of cells written per application.
    """

    def __init__(self, arrays: Sequence[Any], entries: dict, stride: int):
        self.arrays = list(arrays)
        self.dtype = np.dtype(self.arrays[0].dtype)
        self.on_gpu = is_device_array(self.arrays[0])
        destination = entries["destination"]
        self.n_cells = int(destination.size)
        source, kind, constant = entries["source"], entries["kind"], entries["constant"]
        self._groups = []   # CPU: (target flat, destination idx, source flat or None, source idx or constants, negate)
        if self.n_cells == 0:
            return
        if self.on_gpu:
            self._device_tables(destination, source, kind, constant, stride)
            return
        flats = [a.reshape(-1) for a in self.arrays]
        target_array, target_cell = np.divmod(destination, stride)
        source_array, source_cell = np.divmod(np.where(kind == CONSTANT, 0, source), stride)
        for t in np.unique(target_array):
            mine = target_array == t
            for k in (COPY, NEGATE):
                for s in np.unique(source_array[mine & (kind == k)]):
                    chosen = mine & (kind == k) & (source_array == s)
                    self._groups.append((flats[t], target_cell[chosen], flats[s], source_cell[chosen], k == NEGATE))
            chosen = mine & (kind == CONSTANT)
            if chosen.any():
                self._groups.append((flats[t], target_cell[chosen], None, constant[chosen], False))

    # ------------------------------------------------------------------ building
    @classmethod
    def compose(cls, arrays: Sequence[Any], symbols: Sequence[SymbolicBuffer], stride: int) -> "GhostMap | None":
        """The map of the fill whose symbolic result is ``symbols`` (one per array, in order), or None.

        None when the map would read a cell it writes, read an undefined value, negate values of a
        dtype that is not floating point, or address an array that is not C-contiguous (flat indices
        and pointers assume it): the caller then runs its sequence of copies instead.
        """
        if not all(a.flags.c_contiguous for a in arrays):
            return None
        dtype = np.dtype(arrays[0].dtype)
        parts = {"destination": [], "source": [], "kind": [], "constant": []}
        for index, symbol in enumerate(symbols):
            cells, source, kind, constant = symbol.changes()
            parts["destination"].append(cells + index * stride)
            parts["source"].append(source)
            parts["kind"].append(kind)
            parts["constant"].append(constant)
        entries = {name: np.concatenate(values) for name, values in parts.items()}
        read = entries["kind"] != CONSTANT
        if np.any(entries["source"][read] < 0):
            return None   # a value nobody wrote (cannot happen for a consistent plan): keep the sequence
        if np.any(entries["kind"] == NEGATE) and dtype.kind != "f":
            return None   # a negation is a sign-bit flip only for IEEE floats
        if dtype.itemsize not in _UNSIGNED:
            return None
        if _members(entries["source"][read], np.sort(entries["destination"])).any():
            return None   # a gather would race with (or depend on the order of) its own writes
        return cls(arrays, entries, stride)

    def _device_tables(self, destination, source, kind, constant, stride) -> None:
        import cupy

        target_array, target_cell = np.divmod(destination, stride)
        source_array, source_cell = np.divmod(np.where(kind == CONSTANT, 0, source), stride)
        constant_slot = np.cumsum(kind == CONSTANT) - 1
        self._pointers = cupy.asarray(np.array([a.data.ptr for a in self.arrays], dtype=np.uint64))
        self._destination = cupy.asarray(target_cell.astype(np.int64))
        self._source = cupy.asarray(np.where(kind == CONSTANT, constant_slot, source_cell).astype(np.int64))
        self._meta = cupy.asarray((kind.astype(np.int32) | (target_array.astype(np.int32) << 2)
                                   | (source_array.astype(np.int32) << 16)))
        bits = np.dtype(f"u{self.dtype.itemsize}")
        self._constants = cupy.asarray(np.ascontiguousarray(constant[kind == CONSTANT]).view(bits))
        if self._constants.size == 0:
            self._constants = cupy.zeros(1, dtype=bits)
        self._sign = np.dtype(bits).type(1 << (8 * self.dtype.itemsize - 1))
        self._blocks = min(-(-self.n_cells // _THREADS), 4096)

    # ------------------------------------------------------------------ applying
    def apply(self) -> None:
        """Write every mapped cell, in place (GPU: one kernel on the current stream, no sync). Returns None."""
        if self.n_cells == 0:
            return
        if self.on_gpu:
            kernel = _module().get_function(f"ghost_gather<{_UNSIGNED[self.dtype.itemsize]}>")
            kernel((self._blocks,), (_THREADS,), (self._pointers, self._destination, self._source, self._meta,
                                                  self._constants, self._sign, np.int64(self.n_cells)))
            return
        for target, cells, source, values, negate in self._groups:
            if source is None:
                target[cells] = values
            elif negate:
                target[cells] = np.negative(source[values])
            else:
                target[cells] = source[values]


_SOURCE = r"""
// cell k: arrays[a][destination[k]] = arrays[b][source[k]] (kind 0), its sign bit flipped (kind 1), or
// constants[source[k]] (kind 2); meta[k] = kind | a << 2 | b << 16. Values move as bit patterns.
template <typename bits>
__global__ void ghost_gather(const unsigned long long* arrays, const long long* destination,
                             const long long* source, const int* meta, const bits* constants,
                             const bits sign, const long long n)
{
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const int m = meta[k];
        const int kind = m & 3;
        bits value;
        if (kind == 2) {
            value = constants[source[k]];
        } else {
            value = ((const bits*)arrays[(m >> 16) & 0x3fff])[source[k]];
            if (kind == 1) {
                value ^= sign;
            }
        }
        ((bits*)arrays[(m >> 2) & 0x3fff])[destination[k]] = value;
    }
}
"""


@functools.cache
def _module():
    import cupy

    names = tuple(f"ghost_gather<{name}>" for name in _UNSIGNED.values())
    return cupy.RawModule(code=_SOURCE, name_expressions=names)


__all__ = ["CONSTANT", "COPY", "NEGATE", "GhostMap", "SymbolicBuffer", "copy_indices", "fill_indices"]
