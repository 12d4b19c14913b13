"""Fields: one array per rank holding the owned block plus ghost cells.

For a 2D block of owned shape ``(ny, nx)`` and ghost widths ``(wy, wx)``, ``field.data`` has shape
``(ny + 2*wy, nx + 2*wx)`` and ``field.interior`` is the view ``data[wy:wy+ny, wx:wx+nx]``. Ghost cells
are filled by :meth:`Field.exchange_halos` from neighbouring ranks (and, on a periodic axis with one
block, from the opposite side of the same block).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives


class Field:
    """A distributed array on a :class:`~hpcgpu.Decomposition` with ghost layers.

    Parameters
    ----------
    decomposition : hpcgpu.Decomposition
    arch : hpcgpu.arch.CPU or hpcgpu.arch.GPU
    halo_width : int or tuple of int
        Ghost cells on each side, per axis (an int applies to every axis; 0 is allowed on an axis
        that never needs neighbours' values).
    dtype : str or numpy.dtype
    name : str
    attributes : dict of str to str or number, optional
        What the values mean, for files that store the field (checkpoints): e.g. ``{"units": "m s-1",
        "grid_location": "x faces"}``. Stored as HDF5 attributes of the field's dataset.

    Attributes
    ----------
    data : numpy.ndarray or cupy.ndarray, shape ``local_shape + 2*halo_width``
        Owned and ghost cells; C-contiguous.
    interior : view of ``data``, shape ``local_shape``
    """

    def __init__(self, decomposition, arch, halo_width: int | Sequence[int] = 1, dtype="float64", name: str = "field",
                 attributes: dict | None = None):
        ndim = decomposition.ndim
        if isinstance(halo_width, (int, np.integer)):
            halo_width = (int(halo_width),) * ndim
        halo_width = tuple(int(w) for w in halo_width)
        if len(halo_width) != ndim or any(w < 0 for w in halo_width):
            raise ConfigurationError(
                f"halo_width must be a non-negative int or {ndim} of them, got {halo_width!r} for field {name!r}"
            )
        self.decomposition = decomposition
        self.arch = arch
        self.halo_width = halo_width
        self.name = name
        self.attributes = dict(attributes or {})
        padded = tuple(n + 2 * w for n, w in zip(decomposition.local_shape, halo_width))
        self.data = arch.zeros(padded, dtype=dtype)
        self.interior = self.data[self.interior_slices]
        self._halo_plans = {}

    @property
    def interior_slices(self) -> tuple[slice, ...]:
        """Slices of ``data`` selecting the owned cells."""
        return tuple(slice(w, w + n) for w, n in zip(self.halo_width, self.decomposition.local_shape))

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def xp(self):
        return self.arch.xp

    def __repr__(self) -> str:
        return f"Field({self.name!r}, local_shape={self.decomposition.local_shape}, halo_width={self.halo_width}, dtype={self.dtype})"

    # ------------------------------------------------------------------ halos
    def exchange_halos(self, wait: bool = True, corners: bool = True):
        """Fill ghost cells from neighbours. See :func:`hpcgpu.halo.exchange_halos`."""
        from hpcgpu.halo import exchange_halos

        return exchange_halos([self], wait=wait, corners=corners)

    # ------------------------------------------------------------------ global views
    def set_from_global(self, fn: Callable) -> None:
        """Fill owned cells with ``fn(*global_index_arrays)``; in place, returns None.

        ``fn`` receives one integer array per axis (broadcastable, NumPy) holding the *global* index
        of each owned cell, so every decomposition produces the same values.
        """
        grid = self.decomposition
        index_arrays = np.ix_(*[np.arange(s, e) for s, e in zip(grid.local_start, grid.local_stop)])
        values = np.broadcast_to(np.asarray(fn(*index_arrays), dtype=self.dtype), grid.local_shape)
        self.interior[...] = self.arch.from_host(np.ascontiguousarray(values))

    def gather(self, root: int = 0):
        """Collective: assemble the global array (owned cells only) on ``root``.

        Returns
        -------
        numpy.ndarray of shape ``global_shape`` on ``root``; None on other ranks.
        """
        grid = self.decomposition
        movers = collectives(grid.comm, on_device=False)
        block = np.ascontiguousarray(self.arch.to_host(self.interior))
        counts = [int(np.prod(grid.block_of(grid.rank_coords(rank))[1])) for rank in range(grid.n_ranks)]
        flat = np.empty(sum(counts) if grid.comm.rank == root else 0, dtype=block.dtype)
        if movers.gatherv(block, flat, counts, root=root) is None:
            return None
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        result = np.empty(grid.global_shape, dtype=block.dtype)
        for rank in range(grid.n_ranks):
            start, shape = grid.block_of(grid.rank_coords(rank))
            piece = flat[displacements[rank] : displacements[rank] + counts[rank]].reshape(shape)
            result[tuple(slice(s, s + n) for s, n in zip(start, shape))] = piece
        return result

    def scatter(self, global_array, root: int = 0) -> None:
        """Collective: fill owned cells from ``global_array`` held by ``root`` (ignored elsewhere)."""
        grid = self.decomposition
        block = np.empty(grid.local_shape, dtype=self.dtype)
        problem = None
        if grid.comm.rank == root:
            global_array = np.asarray(global_array, dtype=self.dtype)
            if global_array.shape != grid.global_shape:
                problem = f"scatter expected an array of shape {grid.global_shape} on rank {root}, got {global_array.shape}"
        # Only the root can see the problem: agree on it before anyone enters Scatterv.
        grid.comm.check(problem is None, problem or "")
        counts = [int(np.prod(grid.block_of(grid.rank_coords(rank))[1])) for rank in range(grid.n_ranks)]
        if grid.comm.rank == root:
            pieces = []
            for rank in range(grid.n_ranks):
                start, shape = grid.block_of(grid.rank_coords(rank))
                piece = np.ascontiguousarray(global_array[tuple(slice(s, s + n) for s, n in zip(start, shape))])
                pieces.append(piece.ravel())
            flat = np.concatenate(pieces)
        else:
            flat = np.empty(0, dtype=self.dtype)
        collectives(grid.comm, on_device=False).scatterv(flat, block, counts, root=root)
        self.interior[...] = self.arch.from_host(block)
