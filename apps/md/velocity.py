"""Initial velocities as LAMMPS creates them: ``velocity all create T SEED loop geom``.

LAMMPS' ``loop geom`` seeds a Park-Miller generator (``RanPark``, ``src/random_park.cpp``) per atom from
the atom's coordinates, so an atom gets the same random numbers whatever rank owns it and in whatever
order the atoms are stored -- like the (seed, atom id) velocities of
:func:`apps.md.lattice.thermal_velocities`, but keyed by position instead of id. This module reproduces
it bit for bit (checked against LAMMPS 22 Jul 2025 in ``tests/apps/md/test_md_lammps_log.py``):

1. ``RanPark::reset(seed, x)``: Jenkins' one-at-a-time hash over the bytes of the int ``seed`` and of the
   three doubles ``x, y, z`` (little-endian, each byte as a *signed* ``char``, as g++ on x86 reads it),
   keep ``hash & 0x7ffffff`` (27 bits; 0 becomes 1), then draw and discard 5 uniforms;
2. ``vx, vy, vz = uniform() - 0.5`` each (``dist uniform``, the default) or three ``gaussian()``
   (``dist gaussian``: Marsaglia's polar method, the second number of a pair kept for the next call);
   ``uniform() = (1.0 / 2147483647) * seed`` after Schrage's step ``seed = 16807 seed mod (2^31 - 1)``;
3. ``v = (vx, vy, vz) * (1 / sqrt(m))``;
4. ``mom yes``: ``v -= (sum_i m_i v_i) / (sum_i m_i)``;
5. scale: ``T_now = (sum_i (vx^2 + vy^2 + vz^2) m_i) * (1 / dof)`` with ``dof = 3 N - 3`` (``compute temp``,
   extra dof 3), then ``v *= sqrt(T / T_now)``.

Every per-atom operation is written in LAMMPS' order, and so are the three global sums of steps 4
and 5: LAMMPS adds the terms one after the other in its atom order (one rank: creation order for
``create_atoms``, file order for ``read_data``), here on rank 0 over the terms of every rank sorted by
that order. The velocities are therefore those of a one-rank LAMMPS run bit for bit, on any number of
ranks (a LAMMPS run on several ranks differs from its one-rank run in the last bits of these sums).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hpcgpu.errors import ConfigurationError

#: ``velocity ... dist`` choices.
DISTRIBUTIONS = ("uniform", "gaussian")

_IA = 16807
_IM = 2147483647
_AM = 1.0 / _IM
_IQ = 127773
_IR = 2836
_MASK32 = 0xFFFFFFFF


@numba.njit(inline="always")
def _park_uniform(seed):
    """One ``RanPark::uniform()`` step: returns (new seed, uniform in (0, 1))."""
    k = seed // _IQ
    seed = _IA * (seed - k * _IQ) - _IR * k
    if seed < 0:
        seed += _IM
    return seed, _AM * seed


@numba.njit(inline="always")
def _hash_byte(hash_value, byte):
    # ``hash += str[i]`` with ``char`` signed: bytes >= 128 are added as negative numbers.
    if byte >= 128:
        byte -= 256
    hash_value = (hash_value + byte) & _MASK32
    hash_value = (hash_value + (hash_value << 10)) & _MASK32
    return hash_value ^ (hash_value >> 6)


@numba.njit(inline="always")
def _park_seed(seed, bits_x, bits_y, bits_z):
    """``RanPark::reset(seed, coord)`` before the warm-up: the 27-bit seed of an atom (int64)."""
    hash_value = np.int64(0)
    for k in range(4):
        hash_value = _hash_byte(hash_value, (seed >> (8 * k)) & 0xFF)
    for bits in (bits_x, bits_y, bits_z):
        for k in range(8):
            hash_value = _hash_byte(hash_value, np.int64((bits >> np.uint64(8 * k)) & np.uint64(0xFF)))
    hash_value = (hash_value + (hash_value << 3)) & _MASK32
    hash_value ^= hash_value >> 11
    hash_value = (hash_value + (hash_value << 15)) & _MASK32
    park = hash_value & 0x7FFFFFF
    return park if park != 0 else 1


@numba.njit(cache=True)
def _raw_velocities_cpu(seed, coordinate_bits, factors, gaussian, out):
    for i in range(coordinate_bits.shape[0]):
        park = _park_seed(seed, coordinate_bits[i, 0], coordinate_bits[i, 1], coordinate_bits[i, 2])
        for _ in range(5):   # warm-up of RanPark::reset
            park, _unused = _park_uniform(park)
        if not gaussian:
            park, u = _park_uniform(park)
            vx = u - 0.5
            park, u = _park_uniform(park)
            vy = u - 0.5
            park, u = _park_uniform(park)
            vz = u - 0.5
        else:
            values = np.empty(4)
            for pair in range(2):
                while True:
                    park, u = _park_uniform(park)
                    v1 = 2.0 * u - 1.0
                    park, u = _park_uniform(park)
                    v2 = 2.0 * u - 1.0
                    rsq = v1 * v1 + v2 * v2
                    if rsq < 1.0 and rsq != 0.0:
                        break
                fac = math.sqrt(-2.0 * math.log(rsq) / rsq)
                values[2 * pair] = v2 * fac       # "first", returned now
                values[2 * pair + 1] = v1 * fac   # "second", returned by the next call
            vx, vy, vz = values[0], values[1], values[2]
        out[i, 0] = vx * factors[i]
        out[i, 1] = vy * factors[i]
        out[i, 2] = vz * factors[i]


def raw_geom_velocities(positions, masses, seed: int, distribution: str = "uniform") -> np.ndarray:
    """Steps 1-3 of the module docstring: per-atom velocities before momentum removal and scaling.

    Parameters
    ----------
    positions : numpy.ndarray, shape (n_atoms, 3), float64, sigma
        The coordinates LAMMPS hashes: as created (lattice) or as read and wrapped (data file).
    masses : numpy.ndarray, shape (n_atoms,), float64, m
    seed : int
        ``velocity ... create T SEED``: 1 .. 2**31 - 1.
    distribution : {"uniform", "gaussian"}

    Returns
    -------
    numpy.ndarray, shape (n_atoms, 3), float64, sigma / tau
    """
    if not 0 < int(seed) < 2**31:
        raise ConfigurationError(f"LAMMPS geom velocities: expected a seed in 1..2147483647 (a positive C int), "
                                 f"found {seed}")
    if distribution not in DISTRIBUTIONS:
        raise ConfigurationError(f"LAMMPS geom velocities: expected dist in {DISTRIBUTIONS}, found {distribution!r}")
    positions = np.ascontiguousarray(positions, dtype=np.float64).reshape(-1, 3)
    masses = np.asarray(masses, dtype=np.float64).reshape(-1)
    if masses.shape[0] != positions.shape[0]:
        raise ConfigurationError(f"LAMMPS geom velocities: expected one mass per atom ({positions.shape[0]}), "
                                 f"found {masses.shape[0]}")
    factors = 1.0 / np.sqrt(masses)
    out = np.empty_like(positions)
    _raw_velocities_cpu(np.int64(seed), positions.view(np.uint64), factors, distribution == "gaussian", out)
    return out


def lammps_geom_velocities(positions, masses, temperature: float, seed: int, distribution: str = "uniform",
                           order_keys=None, comm=None) -> np.ndarray:
    """``velocity all create T SEED loop geom [dist uniform|gaussian] mom yes rot no`` (LAMMPS).

    Collective when ``comm`` is given. The global sums (total mass, momentum, ``sum m v^2``) are taken
    in the order of ``order_keys`` over all ranks, one term after the other, as a one-rank LAMMPS run
    adds its atoms: ``order_keys`` is the atom id for a lattice (``create_atoms`` order) and the line
    in the file for a data file (``read_data`` order). The terms go to rank 0 for that (5 doubles and a
    key per atom, once at set-up, like the final gather of the checksum), which returns 4 numbers.

    Parameters
    ----------
    positions : numpy.ndarray, shape (n_atoms, 3), float64, sigma -- this rank's atoms
    masses : numpy.ndarray, shape (n_atoms,), float64, m
    temperature : float
        Target temperature (epsilon / k_B), reached up to rounding with ``dof = 3 N - 3``.
    seed : int
    distribution : {"uniform", "gaussian"}
    order_keys : numpy.ndarray, shape (n_atoms,), int64, optional
        Global position of each atom in LAMMPS' one-rank atom order; default: the local order (one rank).
    comm : hpcgpu.Communicator, optional
        Default: one rank.

    Returns
    -------
    numpy.ndarray, shape (n_atoms, 3), float64, sigma / tau -- the same bits on any number of ranks
    """
    if not temperature >= 0:
        raise ConfigurationError(f"LAMMPS geom velocities: expected a temperature >= 0, found {temperature}")
    masses = np.ascontiguousarray(masses, dtype=np.float64).reshape(-1)
    velocities = raw_geom_velocities(positions, masses, seed, distribution)
    if order_keys is None:
        order_keys = np.arange(masses.size, dtype=np.int64)
    local = (np.asarray(order_keys, dtype=np.int64).reshape(-1), masses, velocities)
    if comm is None:
        shift_and_factor = _momentum_and_scale([local], temperature)
    else:
        parts = comm.mpi.gather(local, root=0)
        result = _momentum_and_scale(parts, temperature) if comm.rank == 0 else None
        shift_and_factor = comm.mpi.bcast(result, root=0)
    if isinstance(shift_and_factor, str):   # the same error on every rank, raised after the collective
        raise ConfigurationError(shift_and_factor)
    vcm, factor = shift_and_factor
    velocities -= vcm                        # zero_momentum(): v[i][k] -= vcm[k]
    velocities *= factor                     # rescale(): v[i][k] *= sqrt(t_new / t_old)
    return velocities


def _momentum_and_scale(parts, temperature):
    """Rank 0: LAMMPS' vcm (3,) and rescale factor from every rank's (keys, masses, raw velocities)."""
    keys = np.concatenate([p[0] for p in parts])
    masses = np.concatenate([p[1] for p in parts])
    velocities = np.concatenate([p[2] for p in parts])
    if np.unique(keys).size != keys.size:
        return "LAMMPS geom velocities: expected a distinct order key per atom, found duplicates"
    if keys.size < 2:
        return f"LAMMPS geom velocities: expected at least 2 atoms in total, found {keys.size}"
    order = np.argsort(keys, kind="stable")
    masses, velocities = masses[order], np.ascontiguousarray(velocities[order])
    # group->mass, then group->vcm: p[k] += v[i][k] * m_i; vcm = p / masstotal.
    total_mass = _sequential_sum(masses)
    vcm = np.array([_sequential_sum(velocities[:, k] * masses) for k in range(3)]) / total_mass
    velocities -= vcm
    # compute temp: t += (vx*vx + vy*vy + vz*vz) * m_i; t *= tfactor, tfactor = 1 / (dof * k_B), k_B = 1.
    twice_kinetic = _sequential_sum((velocities[:, 0] * velocities[:, 0] + velocities[:, 1] * velocities[:, 1]
                                     + velocities[:, 2] * velocities[:, 2]) * masses)
    dof = 3.0 * keys.size - 3.0
    current = twice_kinetic * (1.0 / dof)
    if current == 0.0:
        return ("LAMMPS geom velocities: the drawn velocities have zero temperature, nothing to rescale "
                "(LAMMPS: 'Attempting to rescale a 0.0 temperature')")
    return vcm, math.sqrt(temperature / current)


@numba.njit(cache=True)
def _sequential_sum(values):
    """``sum += values[i]`` for i = 0, 1, ... (a C loop's rounding, unlike NumPy's pairwise sum)."""
    total = 0.0
    for i in range(values.shape[0]):
        total += values[i]
    return total
