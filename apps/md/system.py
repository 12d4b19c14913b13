"""Initial atoms of each rank: an fcc/bcc/sc lattice or a LAMMPS data file, cut to the rank's sub-box.

Every rank builds (lattice) or reads (data file) the same global description and keeps the atoms of
its own sub-box, so no rank ever holds more than the global input and no scatter is needed. Velocities
come from the data file when it has a Velocities section; otherwise they are drawn per atom id at the
requested temperature (LAMMPS ``velocity all create T seed``), so they do not depend on the
decomposition either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

from . import lattice
from .lammps_data import LammpsData, read_data, write_data


@dataclass
class InitialAtoms:
    """This rank's atoms: positions (n, 3) wrapped into the box, velocities (n, 3), 0-based types (n,),
    atom_ids (n,), images (n, 3), per-type ``masses`` (n_types,), and a one-line ``description``."""

    positions: np.ndarray
    velocities: np.ndarray
    types: np.ndarray
    atom_ids: np.ndarray
    images: np.ndarray
    masses: np.ndarray
    description: str


def lattice_box(kind: str, density: float, cells) -> np.ndarray:
    """Box lengths (x, y, z) of ``cells`` unit cells of a ``kind`` lattice at ``density`` (sigma)."""
    return np.asarray(cells, dtype=np.float64) * lattice.lattice_constant(kind, density)


def lattice_atoms(domain, kind: str, density: float, cells, temperature: float, seed: int) -> InitialAtoms:
    """Collective: the lattice sites of this rank's sub-box with id-keyed thermal velocities."""
    positions, atom_ids, box = lattice.make_lattice(kind, density, cells, lower=domain.subbox.lower,
                                                    upper=domain.subbox.upper)
    masses = np.ones(atom_ids.size)
    velocities = lattice.thermal_velocities(atom_ids, masses, temperature, seed,
                                            allreduce_fn=lambda values: domain.comm.allreduce(values))
    n_atoms = int(np.prod(cells)) * lattice.BASES[kind].shape[0]
    return InitialAtoms(positions=positions, velocities=velocities, types=np.zeros(atom_ids.size, np.int32),
                        atom_ids=atom_ids, images=np.zeros((atom_ids.size, 3), np.int32), masses=np.ones(1),
                        description=(f"{kind} lattice, density {density:g}, {' x '.join(map(str, cells))} cells, "
                                     f"{n_atoms} atoms, T {temperature:g}"))


def read_data_everywhere(comm, path) -> LammpsData:
    """Collective: every rank reads ``path``; a file missing on any rank is an error on every rank."""
    comm.check(os.path.isfile(path), f"--data {path}: expected an existing LAMMPS data file, found no file "
                                     "(check the path; every rank must see it)")
    return read_data(path)


def data_atoms(domain, data: LammpsData, temperature: float, seed: int) -> InitialAtoms:
    """Collective: the atoms of ``data`` inside this rank's sub-box (box moved to the origin, wrapped)."""
    if data.atom_ids.size < 2:
        raise ConfigurationError(f"LAMMPS data file: expected at least 2 atoms, found {data.atom_ids.size}")
    positions = data.positions - data.box_lower
    crossings = np.floor(positions / data.box)
    positions = positions - crossings * data.box
    positions = np.where(positions >= data.box, positions - data.box, positions)  # rounding at x == L
    images = data.images + crossings.astype(np.int32)
    mine = domain.subbox.contains(positions)
    atom_ids = data.atom_ids[mine]
    types = data.types[mine]
    per_atom_mass = data.masses[types]
    if data.velocities is not None:
        velocities = data.velocities[mine]
        origin = "velocities from the file"
    else:
        velocities = lattice.thermal_velocities(atom_ids, per_atom_mass, temperature, seed,
                                                allreduce_fn=lambda values: domain.comm.allreduce(values))
        origin = f"velocities drawn at T {temperature:g}"
    return InitialAtoms(positions=np.ascontiguousarray(positions[mine]), velocities=np.ascontiguousarray(velocities),
                        types=types, atom_ids=atom_ids, images=np.ascontiguousarray(images[mine]),
                        masses=data.masses.copy(),
                        description=f"LAMMPS data file ({data.atom_ids.size} atoms, {data.masses.size} type(s), "
                                    f"{origin})")


def write_gathered(path, gathered: dict, box, masses, title: str) -> None:
    """Rank 0: write atoms gathered by :func:`apps.md.distributed.gather_by_id` as a LAMMPS data file."""
    data = LammpsData(box_lower=np.zeros(3), box_upper=np.asarray(box, np.float64).copy(),
                      masses=np.asarray(masses, np.float64), atom_ids=gathered["atom_ids"],
                      types=gathered["types"].astype(np.int32), positions=gathered["positions"].astype(np.float64),
                      images=gathered["images"].astype(np.int32),
                      velocities=gathered["velocities"].astype(np.float64), title=title)
    write_data(path, data)
