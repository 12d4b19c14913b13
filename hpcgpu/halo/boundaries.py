"""Physical boundary conditions: what the ghost cells beyond a non-periodic domain edge hold.

The halo exchange fills ghosts from neighbouring blocks (and across periodic edges); the ghosts of a
block that touches a non-periodic edge of the *domain* are filled here, right after the exchange,
from a declaration per field and per side::

    walls = BoundaryConditions.on_axis(0, Mirror(+1))            # h: even mirror at y = 0 and y = Ly
    hpcgpu.exchange_halos([h], boundary_conditions=[walls])        # neighbours, then the walls

A side is ``(axis, -1)`` (the lower edge, global index 0) or ``(axis, +1)`` (the upper edge), the
offsets of :meth:`hpcgpu.Decomposition.neighbor`; ``"lower"`` / ``"upper"`` are accepted too. Only
blocks whose Cartesian coordinates put them on that edge fill anything (rank numbers play no part).

Conditions (``w`` = ghost width, ``n`` = owned extent along the axis, padded indices; the lower side
is drawn, the upper side is its mirror image)::

    cell-centred field                          staggered field (point i on the lower face of cell i)

      row w+1   a1        owned                   row w+1   b2         owned
      row w     a0        owned                   row w     b1 -> f    owned, ON the boundary face
      ------------------- domain edge             ---------------------- domain edge (face of row w)
      row w-1   ghost                             row w-1   ghost
      row w-2   ghost                             row w-2   ghost

    Dirichlet(c):     ghosts = c                  Dirichlet(c, staggered=True): face and ghosts = c
    ZeroGradient():   ghosts = a0 (each layer)    Mirror(-1, staggered=True):   face = 0,
    Mirror(+1):       row w-k = +a_{k-1}                                       row w-k = -b_{k+1}
    Mirror(-1):       row w-k = -a_{k-1}          (odd about the face: zero normal flow, as the v
                                                   of a C grid at a wall)

On the upper side the face of a staggered field is the first ghost layer (padded index ``w + n``),
so there the face value and ``w - 1`` ghost layers are written; on the lower side the face is the
first *owned* layer, which ``Dirichlet(staggered=True)`` and ``Mirror(-1, staggered=True)`` overwrite.
An even mirror of a staggered field leaves the face value undetermined and is refused.

Order and corners: axes are filled in increasing order, the lower side before the upper one, each
over the whole padded extent of the other axes (their ghosts included). Ghosts along periodic or
inner axes come from the exchange before any of this, so an edge block's corner ghosts are mirrors
(or copies) of ghosts that are already right; where two physical axes meet, mirrors commute and a
``Dirichlet`` on the later axis wins the corner.

Every fill is a copy, a negated copy, or a constant. The fills of one plan are composed once into a
single gather (:mod:`hpcgpu.halo.ghost_map`): one kernel on the current stream on GPUs (no host
synchronisation, capturable in a CUDA graph), a few fancy-index assignments on the CPU; where they
do not compose (a fill reading a cell another one writes), each runs as its own slice assignment.
The copies move values without arithmetic (a negation flips the sign bit), so CPU and GPU results
are bitwise equal, and equal to the fills run one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from hpcgpu.arch import array_module
from hpcgpu.errors import ConfigurationError
from hpcgpu.halo.ghost_map import GhostMap, SymbolicBuffer, copy_indices, fill_indices

LOWER, UPPER = -1, +1
_SIDE_NAMES = {"lower": LOWER, "upper": UPPER, LOWER: LOWER, UPPER: UPPER}


# ---------------------------------------------------------------------- the conditions
@dataclass(frozen=True)
class Dirichlet:
    """Every ghost layer beyond the edge holds ``value`` (and, if ``staggered``, the boundary face too).

    Parameters
    ----------
    value : float
        In the field's units; cast to the field's dtype when written.
    staggered : bool
        The field's points lie on the lower faces of the cells along this axis (C-grid velocity
        normal to the edge): the point on the boundary face is set to ``value`` as well.
    """

    value: float = 0.0
    staggered: bool = False


@dataclass(frozen=True)
class ZeroGradient:
    """Every ghost layer repeats the outermost owned layer (zero normal derivative, cell-centred fields)."""


@dataclass(frozen=True)
class Mirror:
    """Ghosts mirror the owned layers about the boundary face, times ``parity``.

    Parameters
    ----------
    parity : +1 or -1
        +1: even (zero normal derivative on the face, e.g. tangential velocity at a free-slip wall or
        a tracer at an insulating wall); -1: odd (zero value on the face).
    staggered : bool
        The field's points lie on the lower faces of the cells along this axis, so one of them lies
        on the boundary face itself. Only ``parity=-1`` (the face value is then 0, a wall's normal
        velocity): an even mirror says nothing about the value on the mirror plane.
    """

    parity: int = +1
    staggered: bool = False

    def __post_init__(self):
        if self.parity not in (+1, -1):
            raise ConfigurationError(f"Mirror: expected parity +1 or -1, found {self.parity!r}")
        if self.staggered and self.parity == +1:
            raise ConfigurationError(
                "Mirror(+1, staggered=True): an even mirror leaves the value ON the boundary face "
                "undetermined; expected parity -1 (zero normal flow through a wall) or "
                "Dirichlet(value, staggered=True)."
            )


CONDITION_TYPES = (Dirichlet, ZeroGradient, Mirror)


# ---------------------------------------------------------------------- one field's declaration
@dataclass(frozen=True)
class BoundaryConditions:
    """The physical boundary conditions of one field: one condition per domain side.

    Parameters
    ----------
    conditions : mapping of (axis, side) to condition
        ``side`` is -1 / ``"lower"`` or +1 / ``"upper"``; the condition a :class:`Dirichlet`,
        :class:`ZeroGradient` or :class:`Mirror`. Sides not named keep whatever their ghosts hold.

    Examples
    --------
    >>> BoundaryConditions({(0, "lower"): Dirichlet(1.0), (0, "upper"): ZeroGradient()})  # doctest: +SKIP
    >>> BoundaryConditions.on_axis(0, Mirror(-1, staggered=True))                          # doctest: +SKIP
    """

    sides: tuple = ()   # ((axis, side), condition) pairs, sorted: hashable, for planning caches

    def __init__(self, conditions: Mapping | None = None):
        pairs = {}
        for key, condition in dict(conditions or {}).items():
            try:
                axis, side = key
                axis, side = int(axis), _SIDE_NAMES[side]
            except (TypeError, ValueError, KeyError):
                raise ConfigurationError(
                    f"boundary conditions: expected keys (axis, side) with side -1/'lower' or +1/'upper', "
                    f"found {key!r}"
                ) from None
            if axis < 0:
                raise ConfigurationError(f"boundary conditions: expected an axis >= 0, found {axis}")
            if not isinstance(condition, CONDITION_TYPES):
                raise ConfigurationError(
                    f"boundary conditions: expected a Dirichlet, ZeroGradient or Mirror for side {key!r}, "
                    f"found {condition!r}"
                )
            pairs[(axis, side)] = condition
        object.__setattr__(self, "sides", tuple(sorted(pairs.items(), key=lambda item: item[0])))

    @classmethod
    def on_axis(cls, axis: int, condition, upper=None) -> "BoundaryConditions":
        """``condition`` on both sides of ``axis`` (or on the lower side only, with ``upper`` on the other)."""
        return cls({(axis, LOWER): condition, (axis, UPPER): condition if upper is None else upper})

    def __or__(self, other: "BoundaryConditions") -> "BoundaryConditions":
        """Both declarations together (``other`` wins a side both name)."""
        return BoundaryConditions({**dict(self.sides), **dict(other.sides)})

    def __bool__(self) -> bool:
        return bool(self.sides)


def free_slip_channel_walls(axis: int = 0) -> tuple[BoundaryConditions, BoundaryConditions, BoundaryConditions]:
    """Free-slip walls across ``axis`` for the C-grid fields ``(h, u, v)`` of a channel.

    h and u (cell centres along ``axis``) are mirrored even, so du/dy = 0 on the wall (no stress);
    v (on the lower cell faces along ``axis``) is mirrored odd about the wall face and set to 0 on
    it (no flow through the wall). Bitwise the same as
    ``apps.stencil.channel.boundaries.fill_channel_boundaries``.

    Returns
    -------
    (h_conditions, u_conditions, v_conditions) : BoundaryConditions
        In the order of the fields, for ``exchange_halos([h, u, v], boundary_conditions=...)``.
    """
    centre = BoundaryConditions.on_axis(axis, Mirror(+1))
    return centre, centre, BoundaryConditions.on_axis(axis, Mirror(-1, staggered=True))


# ---------------------------------------------------------------------- planning and filling
def physical_sides(decomposition) -> frozenset:
    """The ``(axis, side)`` domain edges this rank's block touches (non-periodic axes only)."""
    sides = set()
    for axis, periodic in enumerate(decomposition.periodic):
        if periodic:
            continue
        if decomposition.at_lower_edge(axis):
            sides.add((axis, LOWER))
        if decomposition.at_upper_edge(axis):
            sides.add((axis, UPPER))
    return frozenset(sides)


def _side_operations(condition, side: int, n: int, w: int) -> list[tuple]:
    """The fills of one side along one axis: ``("copy" | "negate", dst, src)`` or ``("fill", dst, value)``.

    ``dst`` and ``src`` are slices along the axis (padded indices); ``src`` may run backwards.
    """
    top = w + n   # first upper ghost layer (the upper boundary face of a staggered field)
    staggered = getattr(condition, "staggered", False)
    if isinstance(condition, Dirichlet):
        if side == LOWER:
            return [("fill", slice(0, w + 1 if staggered else w), condition.value)]
        return [("fill", slice(top, top + w), condition.value)]
    if isinstance(condition, ZeroGradient):
        if side == LOWER:
            return [("copy", slice(0, w), slice(w, w + 1))]
        return [("copy", slice(top, top + w), slice(top - 1, top))]
    copy = "copy" if condition.parity == +1 else "negate"
    if not staggered:
        if side == LOWER:   # row w-k <- row w+k-1, k = 1..w
            return [(copy, slice(0, w), slice(2 * w - 1, w - 1, -1))]
        return [(copy, slice(top, top + w), slice(top - 1, top - w - 1, -1))]   # row top+k-1 <- top-k
    if side == LOWER:       # row w-k <- -row w+k, k = 1..w; then the face row w = 0
        return [("negate", slice(0, w), slice(2 * w, w, -1)), ("fill", slice(w, w + 1), 0)]
    operations = [("fill", slice(top, top + 1), 0)]   # the face, then row top+k <- -row top-k, k < w
    if w > 1:
        operations.append(("negate", slice(top + 1, top + w), slice(top - 1, top - w, -1)))
    return operations


class BoundaryFill:
    """The planned fills of the physical ghosts of some padded arrays; :meth:`apply` runs them.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray or cupy.ndarray
        Padded local arrays, shape ``owned_shape + 2 * halo_width`` (any number of axes).
    halo_widths : sequence of tuple of int
        Ghost width per axis of each array.
    conditions : sequence of BoundaryConditions or None
        One per array (None: nothing to fill for that array).
    sides : set of (axis, side)
        The domain edges this block touches (:func:`physical_sides`); conditions on other sides are
        planned for nothing.

    Notes
    -----
    Views into the arrays are taken once here: keep the arrays (swap objects, never rebind data).
    """

    def __init__(self, arrays: Sequence, halo_widths: Sequence, conditions: Sequence, sides):
        if not (len(arrays) == len(halo_widths) == len(conditions)):
            raise ConfigurationError(
                f"BoundaryFill: expected one halo width and one BoundaryConditions (or None) per array; found "
                f"{len(arrays)} arrays, {len(halo_widths)} widths, {len(conditions)} conditions"
            )
        sides = frozenset(sides)
        self.arrays = list(arrays)
        self.operations = []   # (kind, destination view, source view or value)
        self.steps = []        # (kind, array index, destination index, source index or value): the same, symbolic
        for array_index, (array, widths, declared) in enumerate(zip(arrays, halo_widths, conditions)):
            if declared is None:
                continue
            if not isinstance(declared, BoundaryConditions):
                raise ConfigurationError(
                    f"BoundaryFill: expected a BoundaryConditions or None per array, found {declared!r}"
                )
            for (axis, side), condition in declared.sides:
                if axis >= array.ndim:
                    raise ConfigurationError(
                        f"boundary condition on axis {axis}, but the array has {array.ndim} axes"
                    )
                if (axis, side) not in sides:
                    continue
                w = int(widths[axis])
                n = array.shape[axis] - 2 * w
                if w < 1 or n < w:
                    raise ConfigurationError(
                        f"boundary condition {condition!r} on axis {axis} needs a ghost width >= 1 and at least "
                        f"that many owned layers; found width {w} and {n} owned layers. Use a halo_width >= 1 "
                        "along that axis, or fewer ranks along it."
                    )
                for kind, destination, source in _side_operations(condition, side, n, w):
                    target = _along(axis, array.ndim, destination)
                    origin = source if kind == "fill" else _along(axis, array.ndim, source)
                    self.steps.append((kind, array_index, target, origin))
                    self.operations.append((kind, array[target], source if kind == "fill" else array[origin]))
        #: The fills composed into one gather (one kernel on the GPU), or None: run them one by one.
        self.ghost_map = self._compose() if self.operations else None

    def record(self, symbols: Sequence[SymbolicBuffer]) -> None:
        """Run the fills on ``symbols`` (one :class:`SymbolicBuffer` per array, flat); returns None."""
        for kind, index, destination, source in self.steps:
            shape = self.arrays[index].shape
            if kind == "fill":
                symbols[index].fill(fill_indices(shape, destination), source)
            else:
                cells, origins = copy_indices(shape, destination, source)
                symbols[index].assign(cells, symbols[index], origins, negate=kind == "negate")

    def _compose(self) -> GhostMap | None:
        if len({np.dtype(a.dtype) for a in self.arrays}) != 1:
            return None
        stride = max(a.size for a in self.arrays)
        symbols = [SymbolicBuffer(a.size, a.dtype, first_id=k * stride) for k, a in enumerate(self.arrays)]
        self.record(symbols)
        return GhostMap.compose(self.arrays, symbols, stride)

    @classmethod
    def for_fields(cls, fields: Sequence, conditions: Sequence) -> "BoundaryFill":
        """The fill of ``fields`` (hpcgpu.Field on one decomposition), ``conditions`` one per field."""
        fields = list(fields)
        conditions = normalise_conditions(conditions, len(fields))
        for field, declared in zip(fields, conditions):
            for (axis, _), condition in (declared.sides if declared is not None else ()):
                if axis < field.decomposition.ndim and field.decomposition.periodic[axis]:
                    raise ConfigurationError(
                        f"field {field.name!r}: boundary condition {condition!r} on axis {axis}, which is periodic "
                        "(its ghosts come from the halo exchange); drop the condition or make the axis "
                        "non-periodic in the Decomposition."
                    )
        return cls([f.data for f in fields], [f.halo_width for f in fields], conditions,
                   physical_sides(fields[0].decomposition))

    def __bool__(self) -> bool:
        return bool(self.operations)

    def apply(self) -> None:
        """Fill the physical ghosts, in place, on the current stream (GPU: no synchronisation). Returns None.

        One gather (:attr:`ghost_map`) where the fills compose into one, else one slice assignment each.
        """
        if self.ghost_map is not None:
            self.ghost_map.apply()
            return
        for kind, destination, source in self.operations:
            if kind == "negate":
                _negative(destination, source)
            else:   # "copy" (a view, broadcast for ZeroGradient) or "fill" (a constant)
                destination[...] = source


def normalise_conditions(conditions, n_fields: int) -> tuple:
    """``conditions`` as a tuple of one BoundaryConditions (or None) per field.

    Accepts None (no conditions), a single BoundaryConditions (only when there is one field), or a
    sequence with one entry per field.
    """
    if conditions is None:
        return (None,) * n_fields
    if isinstance(conditions, BoundaryConditions):
        conditions = [conditions]
    conditions = tuple(c if c else None for c in conditions)
    if len(conditions) != n_fields:
        raise ConfigurationError(
            f"boundary_conditions: expected one BoundaryConditions (or None) per field, {n_fields} in all; "
            f"found {len(conditions)}"
        )
    return conditions


def _along(axis: int, ndim: int, index: slice) -> tuple:
    return (slice(None),) * axis + (index,) + (slice(None),) * (ndim - axis - 1)


def _negative(destination, source) -> None:
    # A ufunc with out=: one kernel on the GPU and no temporary array (nothing to allocate in a capture).
    array_module(destination).negative(source, out=destination)
