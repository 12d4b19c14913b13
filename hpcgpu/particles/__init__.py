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

Messages go to the 26 face/edge/corner neighbours directly, with counts first (Isend/Irecv over MPI).
A rank that is its own neighbour (one block along a periodic axis) copies locally; with two blocks along
an axis the same rank is both the lower and the upper neighbour and receives two messages, told apart
by their tags. With CuPy arrays ghost lists are built and refreshed on the device, between ranks with
NCCL (:mod:`~hpcgpu.particles.device_ghosts`); migration stages the leaving rows through the host.

Modules: :mod:`~hpcgpu.particles.domain` (sub-boxes, owners, neighbours and their periodic shifts),
:mod:`~hpcgpu.particles.messages` (counts-first point-to-point exchange),
:mod:`~hpcgpu.particles.migration` (:func:`migrate`), :mod:`~hpcgpu.particles.ghosts`
(:class:`GhostExchange`).
"""

from hpcgpu.particles.domain import Neighbor, ParticleDomain, SubBox, choose_particle_dims
from hpcgpu.particles.ghosts import GhostExchange
from hpcgpu.particles.migration import migrate

__all__ = ["GhostExchange", "Neighbor", "ParticleDomain", "SubBox", "choose_particle_dims", "migrate"]
