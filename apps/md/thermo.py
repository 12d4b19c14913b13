"""Thermodynamic output in LAMMPS conventions (reduced LJ units, energies per atom).

- kinetic energy ``KE = sum_i m_i v_i**2 / 2`` (epsilon), summed in float64;
- temperature ``T = 2 KE / N_dof`` with ``N_dof = 3 N - 3`` (total momentum removed, as LAMMPS);
- pressure from the virial with the LAMMPS kinetic convention::

      P = (N_dof T / 3 + W / 3) / V = (2 KE + W) / (3 V)   [ = (N - 1) T / V + W / (3 V) ]

  where ``W = sum_pairs r_ij . f_ij`` (:func:`apps.md.forces.compute_forces`), plus the tail correction
  for a plain cut when enabled;
- ``E_pair`` and ``TotEng = E_pair + KE / N`` are printed per atom (LAMMPS ``thermo_modify norm yes``,
  the default for ``units lj``).

:func:`format_thermo` writes one line in the column order of LAMMPS ``thermo_style custom step temp
epair etotal press`` (header from :func:`thermo_header`).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from ._arrays import THREADS_PER_BLOCK, _is_cupy, blocks_for, check_array, raw_kernel

THERMO_COLUMNS = ("Step", "Temp", "E_pair", "TotEng", "Press")


class Thermo(NamedTuple):
    """One thermo sample: step, temperature, E_pair and TotEng per atom (epsilon), pressure."""

    step: int
    temperature: float
    pair_energy: float
    total_energy: float
    pressure: float


def kinetic_energy(velocities, masses) -> float:
    """``sum_i m_i |v_i|**2 / 2`` (epsilon) of the given atoms, accumulated in float64.

    Parameters
    ----------
    velocities : array, shape (n_local, 3), float32/float64, sigma/tau
    masses : array, shape (n_local,), same dtype, m

    On the GPU the per-atom terms are summed by a fixed-order reduction (no atomics): the same bits on
    every run. Reading the result synchronises.
    """
    n_local = velocities.shape[0]
    check_array("velocities", velocities, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("masses", masses, shape=(n_local,), dtypes=[velocities.dtype], like=velocities)
    if _is_cupy(velocities):
        return float(kinetic_energy_per_atom(velocities, masses).sum()) if n_local else 0.0
    return float(_kinetic_energy_cpu(velocities, masses))


def kinetic_energy_per_atom(velocities, masses):
    """Per-atom kinetic energies ``m_i |v_i|**2 / 2`` (epsilon), float64, on the backend of the inputs.

    Parameters
    ----------
    velocities : array, shape (n_local, 3), float32/float64, sigma/tau
    masses : array, shape (n_local,), same dtype, m

    Returns
    -------
    array, shape (n_local,), float64 -- the thermo sums add these (exactly on the CPU, by a fixed-order
    device reduction on the GPU; :func:`apps.md.distributed.thermo`).
    """
    n_local = velocities.shape[0]
    check_array("velocities", velocities, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("masses", masses, shape=(n_local,), dtypes=[velocities.dtype], like=velocities)
    if _is_cupy(velocities):
        import cupy

        terms = cupy.empty(n_local, dtype=cupy.float64)
        if n_local > 0:
            real_name = "float" if velocities.dtype == np.float32 else "double"
            kernel = raw_kernel(_CUDA_SOURCE, _NAMES, f"md_kinetic_terms<{real_name}>")
            kernel((blocks_for(n_local),), (THREADS_PER_BLOCK,), (velocities, masses, np.int32(n_local), terms))
        return terms
    terms = np.empty(n_local, dtype=np.float64)
    _kinetic_terms_cpu(velocities, masses, terms)
    return terms


def degrees_of_freedom(n_atoms: int) -> int:
    """``3 N - 3``: translational dof minus the conserved total momentum (LAMMPS default)."""
    return 3 * int(n_atoms) - 3


def temperature(kinetic: float, n_atoms: int) -> float:
    """Temperature (epsilon / k_B) of ``n_atoms`` atoms with total kinetic energy ``kinetic``."""
    return 2.0 * kinetic / degrees_of_freedom(n_atoms)


def pressure(kinetic: float, virial: float, volume: float, pressure_tail: float = 0.0) -> float:
    """``(2 KE + W) / (3 V) + P_tail`` (epsilon / sigma**3); all inputs are global sums."""
    return (2.0 * kinetic + virial) / (3.0 * volume) + pressure_tail


def thermo_sample(step: int, kinetic: float, pair_energy: float, virial: float, n_atoms: int, volume: float,
                  energy_tail: float = 0.0, pressure_tail: float = 0.0) -> Thermo:
    """Assemble a :class:`Thermo` from global sums (energies total, in epsilon; tails from
    :func:`apps.md.potential.tail_corrections`)."""
    pair_per_atom = (pair_energy + energy_tail) / n_atoms
    return Thermo(step=int(step), temperature=temperature(kinetic, n_atoms), pair_energy=pair_per_atom,
                  total_energy=pair_per_atom + kinetic / n_atoms,
                  pressure=pressure(kinetic, virial, volume, pressure_tail))


def thermo_header() -> str:
    """Column header matching :func:`format_thermo`."""
    return f"{THERMO_COLUMNS[0]:>10}" + "".join(f" {name:>15}" for name in THERMO_COLUMNS[1:])


def format_thermo(sample: Thermo) -> str:
    """One thermo line, 8 significant digits like LAMMPS: ``Step Temp E_pair TotEng Press``."""
    values = (sample.temperature, sample.pair_energy, sample.total_energy, sample.pressure)
    return f"{sample.step:>10d}" + "".join(f" {value:>15.8g}" for value in values)


@numba.njit(parallel=True, cache=True)
def _kinetic_energy_cpu(velocities, masses):
    total = 0.0
    for i in numba.prange(velocities.shape[0]):
        total += 0.5 * masses[i] * (velocities[i, 0] ** 2 + velocities[i, 1] ** 2 + velocities[i, 2] ** 2)
    return total


@numba.njit(parallel=True, cache=True)
def _kinetic_terms_cpu(velocities, masses, terms):
    # Same float64 arithmetic as md_kinetic_terms (the GPU kernel).
    for i in numba.prange(velocities.shape[0]):
        vx = np.float64(velocities[i, 0])
        vy = np.float64(velocities[i, 1])
        vz = np.float64(velocities[i, 2])
        terms[i] = 0.5 * np.float64(masses[i]) * (vx * vx + vy * vy + vz * vz)


_CUDA_SOURCE = r"""
template <typename real>
__global__ void md_kinetic_terms(const real* __restrict__ velocities, const real* __restrict__ masses,
                                 int n_local, double* __restrict__ terms) {
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_local) return;
    const double vx = velocities[3 * i], vy = velocities[3 * i + 1], vz = velocities[3 * i + 2];
    terms[i] = 0.5 * (double)masses[i] * (vx * vx + vy * vy + vz * vz);
}
"""

_NAMES = ("md_kinetic_terms<float>", "md_kinetic_terms<double>")
