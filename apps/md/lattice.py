"""Crystal lattices and thermal velocities in reduced LJ units.

A lattice of kind ``fcc``/``bcc``/``sc`` at reduced number density ``rho`` (atoms per sigma**3) has the
cubic lattice constant ``a = (n_basis / rho) ** (1/3)`` -- what LAMMPS ``lattice fcc 0.8442`` means in
``units lj``. ``repetitions = (nx, ny, nz)`` unit cells fill the box ``[0, nx a) x [0, ny a) x [0, nz a)``.

Atom ids are 1-based and enumerate unit cells in C order of (z, y, x), then basis atoms, so every rank
computes the same id for the same site. Velocities come from :mod:`apps.md.rng` keyed by atom id, hence
any decomposition creates the same velocities; the two global sums they need (momentum, kinetic energy)
go through ``allreduce_fn``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hpcgpu.errors import ConfigurationError

from .rng import VELOCITY_STREAM, gaussian_noise

#: Basis atoms of each cubic lattice in units of the lattice constant.
BASES = {
    "sc": np.array([[0.0, 0.0, 0.0]]),
    "bcc": np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]),
    "fcc": np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]),
}


def lattice_constant(kind: str, density: float) -> float:
    """Cubic lattice constant (sigma) of a ``kind`` lattice at reduced number density ``density``."""
    basis = _basis(kind)
    if not density > 0:
        raise ConfigurationError(f"lattice density: expected a positive reduced density, found {density}")
    return (basis.shape[0] / density) ** (1.0 / 3.0)


def make_lattice(kind: str, density: float, repetitions, lower=None, upper=None):
    """Sites of a cubic lattice, optionally only those inside a sub-box ``[lower, upper)``.

    Parameters
    ----------
    kind : {"fcc", "bcc", "sc"}
    density : float
        Reduced number density (atoms / sigma**3).
    repetitions : tuple of 3 int
        Unit cells along x, y, z.
    lower, upper : array_like of 3 float, optional
        Keep only sites with ``lower <= r < upper`` (a rank's sub-box); default the whole box.

    Returns
    -------
    positions : numpy.ndarray, shape (n_atoms, 3), float64, sigma
    atom_ids : numpy.ndarray, shape (n_atoms,), int64, 1-based global ids
    box : numpy.ndarray, shape (3,), float64, box lengths (sigma); the box starts at the origin.
    """
    basis = _basis(kind)
    repetitions = np.asarray(repetitions, dtype=np.int64)
    if repetitions.shape != (3,) or np.any(repetitions < 1):
        raise ConfigurationError(f"lattice repetitions: expected 3 positive ints (nx, ny, nz), found {repetitions}")
    a = lattice_constant(kind, density)
    nx, ny, nz = (int(r) for r in repetitions)
    kz, ky, kx = np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx), indexing="ij")
    cells = np.stack([kx.ravel(), ky.ravel(), kz.ravel()], axis=1).astype(np.float64)  # (n_cells, 3)
    positions = (cells[:, None, :] + basis[None, :, :]).reshape(-1, 3) * a
    atom_ids = np.arange(1, positions.shape[0] + 1, dtype=np.int64)
    box = repetitions.astype(np.float64) * a
    if lower is not None or upper is not None:
        lower = np.zeros(3) if lower is None else np.asarray(lower, dtype=np.float64)
        upper = box if upper is None else np.asarray(upper, dtype=np.float64)
        inside = np.all((positions >= lower) & (positions < upper), axis=1)
        positions, atom_ids = positions[inside], atom_ids[inside]
    return np.ascontiguousarray(positions), atom_ids, box


def thermal_velocities(atom_ids, masses, temperature: float, seed: int,
                       allreduce_fn: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Velocities at exactly ``temperature`` with zero total momentum, reproducible per atom id.

    Each atom draws a Maxwell-Boltzmann velocity ``N(0, 1) * sqrt(T / m)`` from ``(seed, atom id)``;
    the centre-of-mass velocity is removed and all velocities are rescaled so that
    ``2 KE / (3 N - 3) == temperature`` exactly (the LAMMPS convention with 3 momentum dof removed).

    Parameters
    ----------
    atom_ids : numpy.ndarray, shape (n_atoms,), int64
    masses : numpy.ndarray, shape (n_atoms,), float64, m
    temperature : float
        Target temperature (epsilon / k_B).
    seed : int
    allreduce_fn : callable, optional
        Sums a small NumPy array over ranks; default: identity (one rank).

    Returns
    -------
    numpy.ndarray, shape (n_atoms, 3), float64, sigma / tau
    """
    allreduce_fn = allreduce_fn or (lambda values: values)
    masses = np.asarray(masses, dtype=np.float64)
    velocities = gaussian_noise(seed, VELOCITY_STREAM, np.asarray(atom_ids, dtype=np.int64))
    velocities *= np.sqrt(temperature / masses)[:, None]
    sums = allreduce_fn(np.concatenate([(masses[:, None] * velocities).sum(axis=0), [masses.sum(), len(masses)]]))
    velocities -= sums[:3] / sums[3]
    n_atoms = int(round(sums[4]))
    if n_atoms < 2:
        raise ConfigurationError(f"thermal_velocities: expected at least 2 atoms in total, found {n_atoms}")
    twice_kinetic = allreduce_fn(np.array([(masses[:, None] * velocities**2).sum()]))[0]
    if temperature > 0:
        velocities *= np.sqrt(temperature * (3 * n_atoms - 3) / twice_kinetic)
    else:
        velocities[:] = 0.0
    return velocities


def _basis(kind: str) -> np.ndarray:
    if kind not in BASES:
        raise ConfigurationError(f"lattice kind: expected one of {sorted(BASES)}, found {kind!r}")
    return BASES[kind]
