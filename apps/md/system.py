"""Initial atoms of each rank: an fcc/bcc/sc lattice or a LAMMPS data file, cut to the rank's sub-box.

Every rank builds (lattice) or reads (data file) the same global description and keeps the atoms of
its own sub-box, so no rank ever holds more than the global input and no scatter is needed. Velocities
come from the data file when it has a Velocities section; otherwise they are created at the requested
temperature in one of two ways, neither of which depends on the decomposition:

- ``"lammps-geom"``: LAMMPS' ``velocity all create T SEED loop geom`` (:mod:`apps.md.velocity`), the
  generator of each atom seeded from its coordinates -- bench/in.lj's velocities, bit for bit;
- ``"counter"``: Maxwell-Boltzmann velocities keyed by (seed, atom id) (:func:`apps.md.lattice.thermal_velocities`).

Box origin. The simulation runs in the periodic box ``[0, L)`` (``L = hi - lo``), but a data file's
box may start anywhere (``-5.3 28.3 xlo xhi``). Atoms are not translated by ``-lo``: each keeps its
coordinate modulo ``L`` (``x - n L`` with the image flag raised by ``n``), so an atom inside both
``[lo, hi)`` and ``[0, L)`` keeps its bits. :func:`write_gathered` maps the atoms back into ``[lo, hi)``
and writes the bounds exactly as read. An atom moved by ``n L`` comes back as ``fl(x + n L) - n L``,
which may differ from ``x`` in the last bit (by at most half an ulp of ``L``); writing that file
again changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

from . import lattice, velocity
from .lammps_data import LammpsData, read_data, write_data


@dataclass
class InitialAtoms:
    """This rank's atoms: positions (n, 3) wrapped into the box, velocities (n, 3), 0-based types (n,),
    atom_ids (n,), images (n, 3), per-type ``masses`` (n_types,), and a one-line ``description``;
    ``box_lower`` / ``box_upper`` (3,) are the box bounds as created or read (what
    :func:`write_gathered` writes back); the simulation box is ``[0, box_upper - box_lower)``."""

    positions: np.ndarray
    velocities: np.ndarray
    types: np.ndarray
    atom_ids: np.ndarray
    images: np.ndarray
    masses: np.ndarray
    description: str
    box_lower: np.ndarray | None = None
    box_upper: np.ndarray | None = None


def lattice_box(kind: str, density: float, cells) -> np.ndarray:
    """Box lengths (x, y, z) of ``cells`` unit cells of a ``kind`` lattice at ``density`` (sigma)."""
    return np.asarray(cells, dtype=np.float64) * lattice.lattice_constant(kind, density)


#: ``velocity`` choices of :func:`lattice_atoms` and :func:`data_atoms`.
VELOCITY_STYLES = ("lammps-geom", "counter")

#: bench/in.lj: ``velocity all create 1.44 87287 loop geom``.
IN_LJ_VELOCITY_SEED = 87287


def lattice_atoms(domain, kind: str, density: float, cells, temperature: float, seed: int,
                  velocity: str = "lammps-geom", velocity_seed: int = IN_LJ_VELOCITY_SEED) -> InitialAtoms:
    """Collective: the lattice sites of this rank's sub-box with thermal velocities.

    The sites are LAMMPS' ``lattice KIND DENSITY`` + ``create_atoms 1 box`` bit for bit (ids in its
    one-rank creation order). ``velocity="lammps-geom"`` (default): ``velocity all create TEMPERATURE
    VELOCITY_SEED loop geom`` -- with the defaults, bench/in.lj's velocities; ``"counter"``: velocities
    keyed by (``seed``, atom id).
    """
    positions, atom_ids, box = lattice.make_lattice(kind, density, cells, lower=domain.subbox.lower,
                                                    upper=domain.subbox.upper)
    masses = np.ones(atom_ids.size)
    velocities, how = _created_velocities(domain, velocity, positions, masses, atom_ids, temperature, seed,
                                          velocity_seed)
    n_atoms = int(np.prod(cells)) * lattice.BASES[kind].shape[0]
    return InitialAtoms(positions=positions, velocities=velocities, types=np.zeros(atom_ids.size, np.int32),
                        atom_ids=atom_ids, images=np.zeros((atom_ids.size, 3), np.int32), masses=np.ones(1),
                        description=(f"{kind} lattice, density {density:g}, {' x '.join(map(str, cells))} cells, "
                                     f"{n_atoms} atoms, {how}"),
                        box_lower=np.zeros(3), box_upper=np.asarray(box, dtype=np.float64).copy())


def _created_velocities(domain, style, positions, masses, atom_ids, temperature, seed, velocity_seed,
                        order_keys=None):
    """Collective: (velocities, description) of this rank's atoms in ``style``."""
    if style == "counter":
        velocities = lattice.thermal_velocities(atom_ids, masses, temperature, seed,
                                                allreduce_fn=lambda values: domain.comm.allreduce(values))
        return velocities, f"T {temperature:g} (velocities keyed by seed {seed} and atom id)"
    if style == "lammps-geom":
        velocities = velocity.lammps_geom_velocities(
            positions, masses, temperature, velocity_seed,
            order_keys=atom_ids if order_keys is None else order_keys, comm=domain.comm)
        return velocities, f"T {temperature:g} (LAMMPS velocity create {temperature:g} {velocity_seed} loop geom)"
    raise ConfigurationError(f"initial velocities: expected one of {VELOCITY_STYLES}, found {style!r}")


def read_data_everywhere(comm, path) -> LammpsData:
    """Collective: every rank reads ``path``; a file missing on any rank is an error on every rank."""
    comm.check(os.path.isfile(path), f"--data {path}: expected an existing LAMMPS data file, found no file "
                                     "(check the path; every rank must see it)")
    return read_data(path)


def data_atoms(domain, data: LammpsData, temperature: float, seed: int, velocity: str = "lammps-geom",
               velocity_seed: int = IN_LJ_VELOCITY_SEED) -> InitialAtoms:
    """Collective: the atoms of ``data`` inside this rank's sub-box.

    Positions are first put into ``[lo, hi)`` as LAMMPS' ``read_data`` does (``Domain::remap``), then
    each is taken modulo ``L`` into ``[0, L)`` (not translated; see the module docstring), image flags
    following. Without a Velocities section, velocities are created at ``temperature`` in the style
    ``velocity`` (``"lammps-geom"`` hashes the coordinates in ``[lo, hi)``, as LAMMPS would after
    ``read_data``, and sums in the file's atom order).
    """
    if data.atom_ids.size < 2:
        raise ConfigurationError(f"LAMMPS data file: expected at least 2 atoms, found {data.atom_ids.size}")
    box = data.box
    remapped, images = remap_into_box(data.positions, data.images, data.box_lower, data.box_upper)
    crossings = np.floor(remapped / box)
    positions = remapped - crossings * box
    at_edge = positions >= box                       # rounding at x == L
    positions = np.where(at_edge, positions - box, positions)
    images = images + crossings.astype(np.int32) + at_edge.astype(np.int32)
    mine = domain.subbox.contains(positions)
    atom_ids = data.atom_ids[mine]
    types = data.types[mine]
    per_atom_mass = data.masses[types]
    if data.velocities is not None:
        velocities = data.velocities[mine]
        origin = "velocities from the file"
    else:
        velocities, how = _created_velocities(domain, velocity, remapped[mine], per_atom_mass, atom_ids,
                                              temperature, seed, velocity_seed,
                                              order_keys=np.nonzero(mine)[0].astype(np.int64))
        origin = f"velocities created at {how}"
    return InitialAtoms(positions=np.ascontiguousarray(positions[mine]), velocities=np.ascontiguousarray(velocities),
                        types=types, atom_ids=atom_ids, images=np.ascontiguousarray(images[mine]),
                        masses=data.masses.copy(),
                        description=f"LAMMPS data file ({data.atom_ids.size} atoms, {data.masses.size} type(s), "
                                    f"{origin})",
                        box_lower=data.box_lower.copy(), box_upper=data.box_upper.copy())


def remap_into_box(positions, images, box_lower, box_upper):
    """Positions moved into ``[lo, hi)`` by whole box lengths, as LAMMPS' ``Domain::remap`` does.

    ``while x < lo: x += prd``; ``while x >= hi: x -= prd``; ``x = max(x, lo)``, with ``prd = hi - lo``
    and the image flag counting the moves. Atoms already inside are untouched (bitwise).

    Returns
    -------
    positions : numpy.ndarray, shape (n, 3), float64; images : numpy.ndarray, shape (n, 3), int32
    """
    positions = np.array(positions, dtype=np.float64, copy=True)
    images = np.array(images, dtype=np.int32, copy=True)
    lower = np.asarray(box_lower, dtype=np.float64)
    upper = np.asarray(box_upper, dtype=np.float64)
    period = upper - lower
    for axis in range(3):
        column, image = positions[:, axis], images[:, axis]
        # Atoms more than a period away jump by whole periods at once (LAMMPS moves them one period at a
        # time, which can round differently); then LAMMPS' loops, normally 0 or 1 move.
        jumps = np.floor((column - lower[axis]) / period[axis])
        far = np.abs(jumps) > 1
        column[far] -= jumps[far] * period[axis]
        image[far] += jumps[far].astype(np.int32)
        while np.any(low := column < lower[axis]):
            column[low] += period[axis]
            image[low] -= 1
        while np.any(high := column >= upper[axis]):
            column[high] -= period[axis]
            image[high] += 1
        np.maximum(column, lower[axis], out=column)
    return positions, images


def write_gathered(path, gathered: dict, box, masses, title: str, box_lower=None, box_upper=None) -> None:
    """Rank 0: write atoms gathered by :func:`apps.md.distributed.gather_by_id` as a LAMMPS data file.

    ``box_lower`` / ``box_upper`` (``InitialAtoms.box_lower`` / ``box_upper``): the bounds to write, as
    read or created; the atoms (in ``[0, L)``) are moved by whole box lengths into ``[lo, hi)`` and their
    image flags follow. Default: the box ``[0, box)``.
    """
    box = np.asarray(box, np.float64)
    lower = np.zeros(3) if box_lower is None else np.asarray(box_lower, np.float64)
    upper = box.copy() if box_upper is None else np.asarray(box_upper, np.float64)
    positions = gathered["positions"].astype(np.float64)
    images = gathered["images"].astype(np.int32)
    if box_lower is not None:
        positions, images = remap_into_box(positions, images, lower, upper)
    data = LammpsData(box_lower=lower.copy(), box_upper=upper.copy(),
                      masses=np.asarray(masses, np.float64), atom_ids=gathered["atom_ids"],
                      types=gathered["types"].astype(np.int32), positions=positions, images=images,
                      velocities=gathered["velocities"].astype(np.float64), title=title)
    write_data(path, data)
