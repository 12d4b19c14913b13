"""A periodic box cut into equal sub-boxes, one per rank.

Positions are ``(x, y, z)`` columns; :class:`hpcgpu.Decomposition` orders axes slowest first
``(z, y, x)``. :class:`ParticleDomain` hides that: everything it exposes is in ``(x, y, z)`` order. The
decomposition's ``global_shape`` equals its ``dims``: it supplies only the Cartesian topology (ranks,
coordinates, periodic neighbours). Along axis ``a`` with ``P`` blocks, block ``c`` owns
``[L c / P, L (c + 1) / P)``; the last edge is ``L`` exactly, so owners are unambiguous::

    x:  0          L/3         2L/3          L
        | block 0   | block 1   | block 2   |        an atom at x = L/3 belongs to block 1

Every sub-box must be at least ``min_width`` (the ghost width, cutoff + skin) wide, so that ghosts come
from the 26 adjacent sub-boxes only; :func:`choose_particle_dims` picks the process grid under that
constraint (fewest cut faces) or explains how many ranks would fit.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hpcgpu.decomposition import Decomposition, choose_dims
from hpcgpu.errors import DecompositionError

AXES = "xyz"


@dataclass(frozen=True)
class SubBox:
    """The region owned by one rank: ``lower <= r < upper`` per axis (sigma or any length unit).

    Attributes
    ----------
    lower, upper : numpy.ndarray, shape (3,), float64, (x, y, z)
    """

    lower: np.ndarray
    upper: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.upper - self.lower

    def contains(self, positions) -> np.ndarray:
        """Boolean mask, shape (n,), of ``positions`` (n, 3) inside ``[lower, upper)``.

        The bounds are rounded to the positions' float dtype first (see :func:`bounds_in`), so float32
        positions are owned exactly as :func:`~hpcgpu.particles.migrate` decides.
        """
        positions = np.asarray(positions)
        lower, upper = bounds_in(positions.dtype, self.lower, self.upper)
        return np.all((positions >= lower) & (positions < upper), axis=1)


def bounds_in(dtype, *bounds):
    """``bounds`` (float64 arrays) rounded to the float ``dtype`` of the positions they are compared with.

    Ownership must be decided in ONE precision. A float32 position can round onto a float64 sub-box edge
    (``x = float32(edge) >= edge`` in float32 but ``< edge`` in float64): comparing float32 positions
    with float64 edges in one place and float32 edges in another made two ranks disagree on the owner
    (an atom "outside" its sub-box but "owned" by the same rank). Every test of a position against a
    sub-box or an edge uses the bounds rounded like this. Non-float dtypes compare in float64.
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    return tuple(np.asarray(b, dtype=np.float64).astype(dtype) for b in bounds)


@dataclass(frozen=True)
class Neighbor:
    """One of the 26 neighbour directions of a rank.

    Attributes
    ----------
    offset : tuple of 3 int in {-1, 0, 1}, (dx, dy, dz), not all zero
    rank : int -- the rank in that direction (possibly this rank itself, periodic)
    shift : numpy.ndarray, shape (3,), float64 -- added to a particle sent in that direction so it lands
        in the receiver's frame (``+L`` across the lower periodic boundary, ``-L`` across the upper one)
    """

    offset: tuple
    rank: int
    shift: np.ndarray


def choose_particle_dims(n_ranks: int, box, min_width: float, dims=None) -> tuple[int, int, int]:
    """Ranks per axis ``(Px, Py, Pz)`` for a periodic ``box`` with sub-boxes at least ``min_width`` wide.

    Parameters
    ----------
    n_ranks : int
    box : array_like, shape (3,) -- box lengths (x, y, z)
    min_width : float -- smallest allowed sub-box length (the ghost width)
    dims : sequence of 3, optional -- fixed ranks per axis (x, y, z); 0 / None / "*" = choose

    Raises
    ------
    DecompositionError
        If the box is thinner than ``min_width`` or no grid of ``n_ranks`` fits; the message says how
        many ranks per axis fit and suggests fewer ranks or a larger system.
    """
    box = np.asarray(box, dtype=np.float64)
    if box.shape != (3,) or np.any(box <= 0):
        raise DecompositionError(f"box: expected 3 positive lengths (x, y, z), found {box}")
    if not min_width > 0:
        raise DecompositionError(f"sub-box width: expected a positive ghost width, found {min_width}")
    fits = [int(math.floor(length / min_width)) for length in box]
    if min(fits) < 1:
        raise DecompositionError(
            f"box lengths {box.tolist()} (x, y, z): expected every length >= the ghost width {min_width:g} "
            "(cutoff + skin), found a thinner box; the distributed code keeps one periodic image per axis. "
            "Use a larger system (more lattice cells) or a smaller cutoff/skin.")
    requested = None if dims is None else tuple(dims)[::-1]
    if requested is not None and len(requested) != 3:
        raise DecompositionError(f"dims: expected 3 entries (x, y, z), found {tuple(dims)}")
    try:
        chosen_zyx = choose_dims(n_ranks, fits[::-1], requested)
    except DecompositionError:
        most = math.prod(fits)
        raise DecompositionError(
            f"cannot cut the box {[round(v, 6) for v in box.tolist()]} (x, y, z) into {n_ranks} sub-boxes"
            f"{'' if dims is None else f' with dims (x, y, z) = {tuple(dims)}'}: every sub-box must be at least "
            f"the ghost width {min_width:g} (cutoff + skin) wide, so at most {fits[0]} x {fits[1]} x {fits[2]} "
            f"ranks (x, y, z) fit, {most} in total. Use fewer ranks (a count that factors into that grid), "
            "a larger system, or a smaller cutoff/skin.") from None
    return tuple(chosen_zyx[::-1])


class ParticleDomain:
    """A periodic box cut into ``Px x Py x Pz`` equal sub-boxes, one per rank of ``comm``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    box : array_like, shape (3,) -- box lengths (x, y, z); the box starts at the origin
    min_width : float -- smallest sub-box length (normally cutoff + skin)
    dims : sequence of 3, optional -- ranks per axis (x, y, z), 0 = choose

    Attributes
    ----------
    comm, box (3,), dims (Px, Py, Pz), coords (cx, cy, cz), decomposition (hpcgpu.Decomposition, zyx)
    subbox : SubBox -- this rank's region
    edges : list of 3 numpy arrays -- block boundaries per axis, ``edges[a][0] = 0``, ``edges[a][-1] = L``
    neighbors : list of 26 :class:`Neighbor`, in a fixed order (the same on every rank)
    mpi : the decomposition's Cartesian mpi4py communicator -- its process grid (coordinates to ranks);
        its ranks are those of ``comm``, through whose transport particle messages travel
    """

    def __init__(self, comm, box, min_width: float, dims=None):
        self.comm = comm
        self.box = np.asarray(box, dtype=np.float64).copy()
        self.min_width = float(min_width)
        self.dims = choose_particle_dims(comm.size, self.box, self.min_width, dims)
        self.decomposition = Decomposition(comm, global_shape=self.dims[::-1], dims=self.dims[::-1], periodic=True)
        self.mpi = self.decomposition.cart
        self.coords = tuple(self.decomposition.coords[::-1])
        self.edges = [self._edges(length, n_blocks) for length, n_blocks in zip(self.box, self.dims)]
        lower = np.array([self.edges[a][c] for a, c in enumerate(self.coords)])
        upper = np.array([self.edges[a][c + 1] for a, c in enumerate(self.coords)])
        self.subbox = SubBox(lower=lower, upper=upper)
        self.rank_table = np.empty(self.dims, dtype=np.int64)
        for cx, cy, cz in itertools.product(*(range(d) for d in self.dims)):
            self.rank_table[cx, cy, cz] = self.mpi.Get_cart_rank([cz, cy, cx])
        self.neighbors = [self._neighbor(offset) for offset in itertools.product((-1, 0, 1), repeat=3) if any(offset)]
        self.neighbor_ranks = sorted({n.rank for n in self.neighbors} - {comm.rank})

    @staticmethod
    def _edges(length: float, n_blocks: int) -> np.ndarray:
        inner = [length * c / n_blocks for c in range(1, n_blocks)]
        return np.array([0.0] + inner + [length])  # last edge exactly L: wrapped atoms always have an owner

    def _neighbor(self, offset) -> Neighbor:
        coords, shift = [], np.zeros(3)
        for axis, (c, d) in enumerate(zip(self.coords, offset)):
            c += d
            if c < 0:
                shift[axis] = self.box[axis]
            elif c >= self.dims[axis]:
                shift[axis] = -self.box[axis]
            coords.append(c % self.dims[axis])
        return Neighbor(offset=tuple(offset), rank=int(self.rank_table[tuple(coords)]), shift=shift)

    @property
    def rank(self) -> int:
        return self.comm.rank

    def owner_ranks(self, positions) -> np.ndarray:
        """Owning rank of each of ``positions`` (NumPy, shape (n, 3), wrapped into the box), int64.

        Edges are compared in the positions' dtype (:func:`bounds_in`): the same decision as
        :meth:`SubBox.contains` and :func:`~hpcgpu.particles.migrate` for float32 positions.
        """
        positions = np.asarray(positions)
        edges = [bounds_in(positions.dtype, self.edges[a][1:-1])[0] for a in range(3)]
        coords = [np.clip(np.searchsorted(edges[a], positions[:, a], side="right"), 0, self.dims[a] - 1)
                  for a in range(3)]
        return self.rank_table[coords[0], coords[1], coords[2]]

    def describe(self) -> str:
        lengths = self.box / np.array(self.dims)
        return (f"{self.dims[0]} x {self.dims[1]} x {self.dims[2]} sub-boxes (x, y, z) over {self.comm.size} "
                f"rank(s), each {lengths[0]:.4g} x {lengths[1]:.4g} x {lengths[2]:.4g}, periodic")

    def __repr__(self) -> str:
        return (f"ParticleDomain(box={self.box.tolist()}, dims={self.dims}, coords={self.coords}, "
                f"lower={self.subbox.lower.tolist()}, upper={self.subbox.upper.tolist()})")
