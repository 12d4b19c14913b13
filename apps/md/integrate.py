"""Time integration: velocity Verlet (NVE), Langevin (NVT, stochastic) and Nose-Hoover (NVT).

One step of velocity Verlet with time step ``dt`` (tau)::

    v += dt/2 * f / m ;  x += dt * v          velocity_verlet_first_half
    (ghosts / neighbour list / forces)
    f += Langevin friction + noise            langevin_forces      (NVT Langevin only)
    v += dt/2 * f / m                         velocity_verlet_second_half

Langevin, as LAMMPS ``fix langevin`` (applied to the half-step velocities)::

    f_i += -m_i v_i / damping + sqrt(2 m_i k_B T / (damping dt)) * xi_i,    xi_i ~ N(0, 1)^3

``xi_i`` comes from :mod:`apps.md.rng` keyed by (seed, step, atom id): the same noise on any rank layout,
atom order or after a restart.

Nose-Hoover with one thermostat variable ``xi`` (friction, 1/tau) and its integral ``eta``, mass
``Q = n_dof T tau_T**2``, integrated with the Martyna-Tuckerman-Klein half steps around velocity Verlet::

    scale = nose_hoover_half_step(...) ; v *= scale ; velocity Verlet ; scale = nose_hoover_half_step(...) ; v *= scale

The conserved quantity is ``KE + E_pair + Q xi**2 / 2 + n_dof T eta`` (:func:`nose_hoover_energy`).
The thermostat state is the small :class:`NoseHooverState` record, stored in checkpoints as two floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from hpcgpu.errors import ConfigurationError

from ._arrays import THREADS_PER_BLOCK, _is_cupy, blocks_for, check_array, raw_kernel
from .rng import CUDA_SOURCE as _RNG_CUDA_SOURCE
from .rng import gaussian3


#: Atoms from which the CPU's O(n) update kernels (the two Verlet halves, the displacement check) run on
#: Numba's threads. Below it they run on one: at a few microseconds of work per ten thousand atoms, a
#: parallel region's start and barrier cost more than they save, and far more when the cores are shared.
#: Element by element, the results are the same bits either way.
PARALLEL_FROM = 1_000_000

def velocity_verlet_first_half(positions, velocities, forces, masses, dt: float) -> None:
    """Half kick and drift of the owned atoms, in place: ``v += dt/2 f/m; x += dt v``.

    Parameters
    ----------
    positions : array, shape (n_atoms, 3) with n_atoms >= n_local (ghost rows untouched), sigma
    velocities, forces : arrays, shape (n_local, 3), sigma/tau and epsilon/sigma
    masses : array, shape (n_local,), m
    dt : float, tau

    All arrays share one float dtype and backend. Returns None.
    """
    n_local = _check(positions, velocities, forces, masses)
    if _is_cupy(positions):
        _launch("md_first_half", positions.dtype, n_local,
                positions, velocities, forces, masses, np.int32(n_local), positions.dtype.type(dt))
    else:
        kernel = _first_half_cpu if n_local >= PARALLEL_FROM else _first_half_serial
        kernel(positions, velocities, forces, masses, positions.dtype.type(dt))


def velocity_verlet_second_half(velocities, forces, masses, dt: float) -> None:
    """Second half kick in place: ``v += dt/2 f/m`` (shapes as :func:`velocity_verlet_first_half`)."""
    n_local = _check(velocities, velocities, forces, masses)
    if _is_cupy(velocities):
        _launch("md_second_half", velocities.dtype, n_local,
                velocities, forces, masses, np.int32(n_local), velocities.dtype.type(dt), np.uint64(0))
    else:
        kernel = _second_half_cpu if n_local >= PARALLEL_FROM else _second_half_serial
        kernel(velocities, forces, masses, velocities.dtype.type(dt))


def langevin_forces(forces, velocities, masses, atom_ids, temperature: float, damping: float, dt: float,
                    seed: int, step: int, step_counter=None) -> None:
    """Add Langevin friction and noise to ``forces`` in place (see the module docstring).

    Parameters
    ----------
    forces, velocities : arrays, shape (n_local, 3)
    masses : array, shape (n_local,)
    atom_ids : array, shape (n_local,), int64, global ids (the noise key)
    temperature : float (epsilon / k_B); damping : float, relaxation time (tau); dt : float (tau)
    seed, step : int -- with the atom id, all the noise depends on
    step_counter : cupy int64 array, shape (1,), optional (GPU only) -- read the step from the device
        instead of ``step`` (CUDA graph replays, :mod:`apps.md.step_graph`)
    """
    n_local = _check(velocities, velocities, forces, masses)
    check_array("atom_ids", atom_ids, shape=(n_local,), dtypes=[np.int64], like=forces)
    if not (damping > 0 and dt > 0 and temperature >= 0):
        raise ConfigurationError(
            f"Langevin: expected damping > 0, dt > 0, temperature >= 0, found {damping}, {dt}, {temperature}")
    noise_scale = math.sqrt(2.0 * temperature / (damping * dt))  # times sqrt(m) per atom
    if _is_cupy(forces):
        _launch("md_langevin", forces.dtype, n_local, forces, velocities, masses, atom_ids, np.int32(n_local),
                np.float64(1.0 / damping), np.float64(noise_scale), np.int64(seed), np.int64(step),
                np.uint64(0) if step_counter is None else step_counter, np.uint64(0))
    else:
        _langevin_cpu(forces, velocities, masses, atom_ids, 1.0 / damping, noise_scale, np.int64(seed),
                      np.int64(step))


@dataclass(frozen=True)
class NoseHooverState:
    """Nose-Hoover thermostat state: friction ``xi`` (1/tau) and its time integral ``eta`` (1)."""

    xi: float = 0.0
    eta: float = 0.0


def nose_hoover_half_step(state: NoseHooverState, kinetic_energy: float, n_dof: int, temperature: float,
                          tau: float, dt: float):
    """Advance the thermostat by ``dt / 2`` and return ``(new_state, velocity_scale)``.

    Parameters
    ----------
    state : NoseHooverState
    kinetic_energy : float
        Global kinetic energy (epsilon) of the current velocities (allreduce it across ranks).
    n_dof : int -- 3 N - 3 ; temperature : float -- target ; tau : float -- thermostat period (tau)
    dt : float -- full time step (tau)

    Multiply the velocities by ``velocity_scale`` afterwards.
    """
    if not (tau > 0 and n_dof > 0 and temperature > 0):
        raise ConfigurationError(
            f"Nose-Hoover: expected tau > 0, n_dof > 0, temperature > 0, found {tau}, {n_dof}, {temperature}")
    q_mass = n_dof * temperature * tau * tau
    xi = state.xi + 0.25 * dt * (2.0 * kinetic_energy - n_dof * temperature) / q_mass
    scale = math.exp(-0.5 * dt * xi)
    kinetic_energy *= scale * scale
    eta = state.eta + 0.5 * dt * xi
    xi += 0.25 * dt * (2.0 * kinetic_energy - n_dof * temperature) / q_mass
    return NoseHooverState(xi=xi, eta=eta), scale


def nose_hoover_energy(state: NoseHooverState, n_dof: int, temperature: float, tau: float) -> float:
    """Thermostat energy ``Q xi**2 / 2 + n_dof T eta`` (epsilon) added to the conserved quantity."""
    q_mass = n_dof * temperature * tau * tau
    return 0.5 * q_mass * state.xi**2 + n_dof * temperature * state.eta


def _check(positions, velocities, forces, masses) -> int:
    n_local = velocities.shape[0]
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("velocities", velocities, shape=(n_local, 3), dtypes=[positions.dtype], like=positions)
    check_array("forces", forces, shape=(n_local, 3), dtypes=[positions.dtype], like=positions)
    check_array("masses", masses, shape=(n_local,), dtypes=[positions.dtype], like=positions)
    if positions.shape[0] < n_local:
        raise ConfigurationError(f"positions: expected at least {n_local} rows (owned atoms), found {positions.shape[0]}")
    return n_local


def _launch(name, dtype, n_items, *args):
    real_name = "float" if np.dtype(dtype) == np.float32 else "double"
    if n_items > 0:
        raw_kernel(_CUDA_SOURCE, _NAMES, f"{name}<{real_name}>")((blocks_for(n_items),), (THREADS_PER_BLOCK,), args)


@numba.njit(parallel=True, cache=True)
def _first_half_cpu(positions, velocities, forces, masses, dt):
    for i in numba.prange(velocities.shape[0]):
        half_dt_over_m = 0.5 * dt / masses[i]
        for axis in range(3):
            velocities[i, axis] += half_dt_over_m * forces[i, axis]
            positions[i, axis] += dt * velocities[i, axis]


@numba.njit(parallel=True, cache=True)
def _second_half_cpu(velocities, forces, masses, dt):
    for i in numba.prange(velocities.shape[0]):
        half_dt_over_m = 0.5 * dt / masses[i]
        for axis in range(3):
            velocities[i, axis] += half_dt_over_m * forces[i, axis]


@numba.njit(cache=True)
def _first_half_serial(positions, velocities, forces, masses, dt):
    for i in range(velocities.shape[0]):
        half_dt_over_m = 0.5 * dt / masses[i]
        for axis in range(3):
            velocities[i, axis] += half_dt_over_m * forces[i, axis]
            positions[i, axis] += dt * velocities[i, axis]


@numba.njit(cache=True)
def _second_half_serial(velocities, forces, masses, dt):
    for i in range(velocities.shape[0]):
        half_dt_over_m = 0.5 * dt / masses[i]
        for axis in range(3):
            velocities[i, axis] += half_dt_over_m * forces[i, axis]


@numba.njit(parallel=True, cache=True)
def _langevin_cpu(forces, velocities, masses, atom_ids, friction, noise_scale, seed, step):
    for i in numba.prange(forces.shape[0]):
        n0, n1, n2 = gaussian3(seed, step, atom_ids[i])
        mass = masses[i]
        amplitude = noise_scale * math.sqrt(mass)
        forces[i, 0] += -friction * mass * velocities[i, 0] + amplitude * n0
        forces[i, 1] += -friction * mass * velocities[i, 1] + amplitude * n1
        forces[i, 2] += -friction * mass * velocities[i, 2] + amplitude * n2


_CUDA_SOURCE = _RNG_CUDA_SOURCE + r"""
template <typename real>
__global__ void md_first_half(real* __restrict__ positions, real* __restrict__ velocities,
                              const real* __restrict__ forces, const real* __restrict__ masses,
                              int n_local, real dt) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_local) return;
    const real half_dt_over_m = real(0.5) * dt / masses[i];
    for (int axis = 0; axis < 3; ++axis) {
        real v = velocities[3 * i + axis] + half_dt_over_m * forces[3 * i + axis];
        velocities[3 * i + axis] = v;
        positions[3 * i + axis] += dt * v;
    }
}

template <typename real>
__global__ void md_second_half(real* __restrict__ velocities, const real* __restrict__ forces,
                               const real* __restrict__ masses, int n_local, real dt,
                               const int* __restrict__ active) {
    /* active: null, or the device word with the number of atoms now (apps.md.resident_slab). */
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= (active != nullptr ? active[0] : n_local)) return;
    const real half_dt_over_m = real(0.5) * dt / masses[i];
    for (int axis = 0; axis < 3; ++axis) velocities[3 * i + axis] += half_dt_over_m * forces[3 * i + axis];
}

template <typename real>
__global__ void md_langevin(real* __restrict__ forces, const real* __restrict__ velocities,
                            const real* __restrict__ masses, const long long* __restrict__ atom_ids,
                            int n_local, double friction, double noise_scale, long long seed, long long step,
                            const long long* __restrict__ step_counter, const int* __restrict__ active) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= (active != nullptr ? active[0] : n_local)) return;   /* active: as md_second_half */
    if (step_counter != nullptr) step = step_counter[0];   /* graph replays: the step lives on the device */
    double noise[3];
    md_gaussian3(seed, step, atom_ids[i], noise, noise + 1, noise + 2);
    const double mass = masses[i];
    const double amplitude = noise_scale * sqrt(mass);
    for (int axis = 0; axis < 3; ++axis)
        forces[3 * i + axis] += (real)(-friction * mass * velocities[3 * i + axis] + amplitude * noise[axis]);
}
"""

_NAMES = tuple(f"{kernel}<{real}>" for kernel in ("md_first_half", "md_second_half", "md_langevin")
               for real in ("float", "double"))
