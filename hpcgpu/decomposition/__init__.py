"""The decomposition: which rank owns which block of a global array, and who its neighbours are.

==============  ===========================================================================================
``cartesian``   :class:`~hpcgpu.decomposition.cartesian.Decomposition`: blocks, extents, neighbours, the
                Cartesian communicator
``shape``       how many blocks per axis (:func:`~hpcgpu.decomposition.shape.choose_dims`) and their
                extents (:func:`~hpcgpu.decomposition.shape.split_extents`)
``nodes``       which node owns which box of blocks, so that most halo bytes stay inside nodes
``comm``        the MPI side: the Cartesian communicator, the node of every rank (real or simulated)
==============  ===========================================================================================

Imports nothing of hpcgpu but :mod:`hpcgpu.errors` (MPI reaches it as a communicator argument); the
halo exchange, fields, particles and everything above import from here. The names a user needs are here:
``from hpcgpu.decomposition import Decomposition, choose_dims``.
"""

from hpcgpu.decomposition.cartesian import Decomposition
from hpcgpu.decomposition.shape import WILDCARDS, choose_dims, factorizations, split_extents

__all__ = ["Decomposition", "WILDCARDS", "choose_dims", "factorizations", "split_extents"]
