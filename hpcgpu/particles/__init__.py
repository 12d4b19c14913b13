"""Particles on a Cartesian decomposition: sub-boxes, migration between ranks and ghost exchange.

A periodic orthogonal box ``[0, Lx) x [0, Ly) x [0, Lz)`` is cut into ``Px x Py x Pz`` equal sub-boxes,
one per rank (:class:`ParticleDomain`, built on :class:`hpcgpu.Decomposition`, whose grid here is only
the process grid). Particle arrays of one rank hold its *owned* particles, then *ghost* copies of
particles of neighbouring sub-boxes (or periodic images of its own) that lie within ``width`` of it::

    domain = ParticleDomain(comm, box, min_width=cutoff + skin)        # sub-boxes >= width wide
    positions, arrays = migrate(domain, positions, arrays)             # rebuild steps: new owners
    ghosts = GhostExchange(domain, positions, width, carried={"types": types})
    all_positions = concatenate([positions, ghosts.positions])
    ...
    ghosts.forward(all_positions)                                      # other steps: positions only

Messages go to the 26 face/edge/corner neighbours directly, counts first, through the job's transport
(:func:`hpcgpu.transport.collectives`: MPI for NumPy arrays; NCCL, CUDA-aware or host-staged MPI for
CuPy arrays, as the job chose). A rank that is its own neighbour (one block along a periodic axis)
copies locally; with two blocks along an axis the same rank is both the lower and the upper neighbour
and receives two messages, told apart by the order in which both sides list them. With CuPy arrays
ghost lists are built and refreshed on the device (:mod:`~hpcgpu.particles.device_ghosts`) and
migrating rows stay on the device; only the leaving positions visit the host, where their owners are
decided.

Modules: :mod:`~hpcgpu.particles.domain` (sub-boxes, owners, neighbours and their periodic shifts),
:mod:`~hpcgpu.particles.messages` (counts-first exchange of rows through the transport),
:mod:`~hpcgpu.particles.migration` (:func:`migrate`), :mod:`~hpcgpu.particles.ghosts`
(:class:`GhostExchange`).
"""

from hpcgpu.particles.domain import Neighbor, ParticleDomain, SubBox, choose_particle_dims
from hpcgpu.particles.ghosts import GhostExchange
from hpcgpu.particles.migration import migrate

__all__ = ["GhostExchange", "Neighbor", "ParticleDomain", "SubBox", "choose_particle_dims", "migrate"]
