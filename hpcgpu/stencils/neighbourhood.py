"""The neighbourhood of a stencil: which cells around the updated one it reads.

Inferred from the offsets of the field accesses (as Numba's ``@stencil`` does): per field and axis the
lowest and highest offset. From them follow

- the *halo width* each input field needs per axis: ``max(-lowest, highest)`` (a field with a smaller
  ``halo_width`` is refused);
- whether *corners* are read: an offset that moves along two or more axes at once (``u[1, 1]``), so
  that the halo exchange must fill edge and corner ghosts too (``corners=True``); a 5-point or 7-point
  stencil needs faces only;
- the *rim width* per axis: the owned cells within this distance of the block's edge read ghost cells
  and are updated after the exchange; the cells further in (the interior) are updated while the
  exchange is in flight.

For the 5-point Laplacian ``u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]``::

    offsets      (-1, 0) (1, 0) (0, -1) (0, 1) (0, 0)
    halo width   (1, 1)             corners  False
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Neighbourhood:
    """The cells a stencil reads, per input field.

    Attributes
    ----------
    ndim : int
    offsets : dict of str to tuple of tuple of int
        Every offset read from each input field.
    """

    ndim: int
    offsets: dict

    @classmethod
    def of(cls, definition) -> "Neighbourhood":
        """The neighbourhood of a :class:`~hpcgpu.stencils.definition.StencilDefinition`."""
        return cls(definition.ndim, dict(definition.accesses))

    def field_halo_width(self, field: str) -> tuple:
        """Ghost cells per axis that ``field`` must have: the largest offset in either direction."""
        widths = [0] * self.ndim
        for offset in self.offsets[field]:
            for axis, d in enumerate(offset):
                widths[axis] = max(widths[axis], abs(d))
        return tuple(widths)

    @property
    def halo_width(self) -> tuple:
        """The largest :meth:`field_halo_width` over the fields, per axis: the width of the rim."""
        widths = [0] * self.ndim
        for field in self.offsets:
            widths = [max(a, b) for a, b in zip(widths, self.field_halo_width(field))]
        return tuple(widths)

    def reads_neighbours(self, field: str) -> bool:
        """True if ``field`` is read anywhere but at the cell itself (its halos must be exchanged)."""
        return any(any(offset) for offset in self.offsets[field])

    @property
    def corners(self) -> bool:
        """True if an offset moves along two or more axes (edge and corner ghosts are read)."""
        return any(sum(1 for d in offset if d) >= 2 for offsets in self.offsets.values() for offset in offsets)

    @property
    def n_points(self) -> int:
        """Distinct cells read per field, summed over fields (5 for one 5-point field)."""
        return sum(len(offsets) for offsets in self.offsets.values())

    def describe(self) -> str:
        """One line: ``halo width (1, 1), faces only, 5 cells read``."""
        return (f"halo width {self.halo_width}, {'corners read' if self.corners else 'faces only'}, "
                f"{self.n_points} cell(s) read")
