"""Lennard-Jones forces on owned atoms from a full neighbour list, with pair energy and virial.

For owned atom i, ``f_i = sum_j F(r_ij) / r_ij * (r_i - r_j)`` over its full list (owned and ghost j).
Energy and virial are sums over *pairs*; with a full list each pair is seen twice, so each side adds half::

    E_pair = 1/2 sum_i sum_j E(r_ij)              (epsilon)
    W      = 1/2 sum_i sum_j r_ij . f_ij          (epsilon), pressure uses W / (3 V)

Across ranks, a pair split between two ranks contributes half on each: the global sums are simply the sum
of the per-rank values, with no force communication back to the owners of ghosts.

Precision: the pair math runs in the dtype of ``positions`` (float64 by default; float32 is the GPU fast
path). Per-atom force sums and the energy/virial sums are always accumulated in float64, then forces are
stored in the positions' dtype. The pair table is converted to that dtype by :func:`device_pair_table`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hpcgpu.errors import ConfigurationError

from ._arrays import THREADS_PER_BLOCK, _is_cupy, array_module, blocks_for, check_array, raw_kernel
from .half_list import HalfNeighborList, half_forces
from .neighbors import NeighborList
from .potential import LennardJones


def device_pair_table(potential: LennardJones, like):
    """The potential's pair table (n_types, n_types, 5) in the dtype and on the backend of array ``like``."""
    xp = array_module(like)
    return xp.asarray(potential.pair_table(dtype=like.dtype))


def compute_forces(positions, types, neighbor_list: NeighborList, pair_table, forces,
                   compute_energy: bool = True):
    """Forces on the owned atoms; optionally the pair energy and virial of this rank.

    Parameters
    ----------
    positions : array, shape (n_local + n_ghost, 3), float32/float64, sigma
    types : array, shape (n_local + n_ghost,), int32, 0-based atom types
    neighbor_list : NeighborList
        Full list of the ``n_local`` owned atoms (valid for these positions).
    pair_table : array, shape (n_types, n_types, 5), dtype of positions -- :func:`device_pair_table`
    forces : array, shape (n_local, 3), dtype of positions -- overwritten (epsilon / sigma)
    compute_energy : bool
        If False the GPU kernel skips the energy/virial reductions (the hot path between thermo steps).

    Returns
    -------
    array of shape (2,), float64, ``[E_pair, W]`` (epsilon) on the positions' backend, or None when
    ``compute_energy`` is False. On the GPU reading it synchronises; keep it on the device until needed.
    """
    n_local = neighbor_list.n_local
    n_total = positions.shape[0]
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("types", types, shape=(n_total,), dtypes=[np.int32], like=positions)
    check_array("pair_table", pair_table, shape=(None, None, 5), dtypes=[positions.dtype], like=positions)
    check_array("forces", forces, shape=(n_local, 3), dtypes=[positions.dtype], like=positions)
    check_array("neighbor_list.neighbors", neighbor_list.neighbors, like=positions)
    if _is_cupy(positions):
        per_atom = _forces_gpu(positions, types, neighbor_list, pair_table, forces, compute_energy)
        # A fixed-order tree reduction (CuPy's sum), not atomics: the same bits on every run.
        return per_atom.sum(axis=1) if compute_energy else None
    if isinstance(neighbor_list, HalfNeighborList):
        if not compute_energy:
            half_forces(positions, types, neighbor_list, pair_table, forces, None, None)
            return None
        energy_per_atom, virial_per_atom = compute_forces_per_atom(positions, types, neighbor_list, pair_table, forces)
        return np.array([energy_per_atom.sum(), virial_per_atom.sum()])
    energy_per_atom, virial_per_atom = _per_atom_cpu(positions, types, neighbor_list, pair_table, forces)
    if not compute_energy:
        return None
    # Sequential sums of per-atom values keep the CPU result independent of the thread count.
    return np.array([energy_per_atom.sum(), virial_per_atom.sum()])


def compute_forces_per_atom(positions, types, neighbor_list: NeighborList, pair_table, forces):
    """CPU only: forces as :func:`compute_forces`, returning each owned atom's share of E_pair and W.

    Returns
    -------
    energy_per_atom, virial_per_atom : numpy.ndarray, shape (n_local,), float64 (epsilon)
        Half of each pair's energy / virial goes to each atom, so the global sums over all atoms of all
        ranks are ``E_pair`` and ``W``. The distributed driver sums them exactly
        (:mod:`apps.md.reduction`), which makes thermo output independent of the decomposition.
    """
    n_local = neighbor_list.n_local
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("types", types, shape=(positions.shape[0],), dtypes=[np.int32], like=positions)
    check_array("pair_table", pair_table, shape=(None, None, 5), dtypes=[positions.dtype], like=positions)
    check_array("forces", forces, shape=(n_local, 3), dtypes=[positions.dtype], like=positions)
    if _is_cupy(positions):
        per_atom = _forces_gpu(positions, types, neighbor_list, pair_table, forces, True)
        return per_atom[0], per_atom[1]
    if isinstance(neighbor_list, HalfNeighborList):
        energy_per_atom = np.empty(n_local, dtype=np.float64)
        virial_per_atom = np.empty(n_local, dtype=np.float64)
        half_forces(positions, types, neighbor_list, pair_table, forces, energy_per_atom, virial_per_atom)
        return energy_per_atom, virial_per_atom
    return _per_atom_cpu(positions, types, neighbor_list, pair_table, forces)


def _forces_gpu(positions, types, neighbor_list, pair_table, forces, compute_energy):
    """Launch the force kernel; returns the (2, n_local) float64 per-atom (E_pair, W) shares, or None."""
    import cupy

    n_local = neighbor_list.n_local
    per_atom = cupy.zeros((2, n_local), dtype=cupy.float64) if compute_energy else None
    if n_local > 0:
        _launch_gpu(positions, types, neighbor_list, pair_table, forces, per_atom, None)
    return per_atom


def compute_forces_periodic(positions, types, neighbor_list: NeighborList, pair_table, forces, box,
                            per_atom=None, lanes: int = 1) -> None:
    """GPU only: forces with minimum-image pair distances in a periodic ``box`` (no ghost atoms).

    The device-resident driver (:mod:`apps.md.resident`) keeps only owned atoms; the list holds owned
    indices and every pair distance is folded into ``[-L/2, L/2]`` per axis. Same pair math and float64
    accumulation as :func:`compute_forces`. ``lanes`` threads share an atom's neighbours (a fixed shuffle
    tree adds their sums: the same bits on every run); with more than one lane the list is stored atom
    by atom (entry k of atom i at flat index ``i * capacity + k``, the buffer keeping its
    ``(capacity, n_local)`` shape) so that an atom's lanes read consecutive entries.

    Parameters
    ----------
    positions : cupy array, shape (n_local, 3), float32/float64, sigma
    types : cupy array, shape (n_local,), int32
    neighbor_list : NeighborList over these owned atoms (built with minimum-image distances)
    pair_table, forces : as :func:`compute_forces`; forces (n_local, 3) is overwritten
    box : array_like, shape (3,), sigma -- at least 2 (cutoff + skin) long on every axis
    per_atom : cupy float64 array, shape (2, n_local), optional -- receives each atom's share of E_pair
        (row 0) and W (row 1), epsilon; None skips the energy (the hot path). Returns None; nothing is
        allocated, so the call can be captured in a CUDA graph.
    """
    n_local = neighbor_list.n_local
    check_array("positions", positions, shape=(n_local, 3), dtypes=[np.float32, np.float64])
    if not _is_cupy(positions):
        raise ConfigurationError("compute_forces_periodic: expected cupy arrays (the GPU-resident driver); "
                                 "on the CPU use compute_forces with ghost atoms")
    check_array("types", types, shape=(n_local,), dtypes=[np.int32], like=positions)
    check_array("pair_table", pair_table, shape=(None, None, 5), dtypes=[positions.dtype], like=positions)
    check_array("forces", forces, shape=(n_local, 3), dtypes=[positions.dtype], like=positions)
    if per_atom is not None:
        check_array("per_atom", per_atom, shape=(2, n_local), dtypes=[np.float64], like=positions)
    if n_local > 0:
        _launch_gpu(positions, types, neighbor_list, pair_table, forces, per_atom, np.asarray(box, np.float64),
                    lanes=lanes, atom_major=lanes > 1)


def lanes_per_atom(n_atoms: int) -> int:
    """Threads that share one atom's neighbours in the force kernel: enough for ~half a million threads
    (a small system otherwise leaves each thread a long chain of dependent loads on a mostly idle GPU),
    a power of two from 1 to 16."""
    lanes = 1
    while lanes < 16 and n_atoms * lanes * 2 <= 2**19:
        lanes *= 2
    return lanes


def _launch_gpu(positions, types, neighbor_list, pair_table, forces, per_atom, box, lanes=1, atom_major=False):
    """One launch of ``md_lj_forces``; ``box`` None = distances as stored (ghosts), else minimum image;
    ``lanes`` threads per atom (a power of two up to 32); ``atom_major``: the list's storage is
    (n_local, capacity) in memory (see :func:`compute_forces_periodic`)."""
    n_local = neighbor_list.n_local
    real = positions.dtype.type
    real_name = "float" if positions.dtype == np.float32 else "double"
    periodic = box is not None
    box = np.ones(3) if box is None else box
    kernel = raw_kernel(_CUDA_SOURCE, _NAMES, f"md_lj_forces<{real_name}>")
    kernel((blocks_for(n_local * lanes),), (THREADS_PER_BLOCK,),
           (positions, types, neighbor_list.neighbors, neighbor_list.counts, np.int32(n_local),
            np.int32(neighbor_list.capacity), pair_table, np.int32(pair_table.shape[0]), forces,
            np.int32(per_atom is not None), np.uint64(0) if per_atom is None else per_atom,
            np.int32(periodic), *(real(v) for v in box), *(real(1.0 / v) for v in box),
            np.int32(int(lanes).bit_length() - 1), np.int32(bool(atom_major)), np.uint64(0)))


def _per_atom_cpu(positions, types, neighbor_list, pair_table, forces):
    n_local = neighbor_list.n_local
    energy_per_atom = np.empty(n_local, dtype=np.float64)
    virial_per_atom = np.empty(n_local, dtype=np.float64)
    kernel = _forces_cpu_one_type if pair_table.shape[0] == 1 else _forces_cpu
    kernel(positions, types, neighbor_list.neighbors, neighbor_list.counts, pair_table, forces,
           energy_per_atom, virial_per_atom)
    return energy_per_atom, virial_per_atom


@numba.njit(inline="always")
def _lj_pair(rsq, c12, c6, energy_shift):
    """F(r)/r and E(r) of the 12-6 pair at squared distance ``rsq`` (float64 from here: the CPU kernels'
    pair terms; the CUDA kernel writes the same expressions)."""
    inv_r2 = 1.0 / rsq
    inv_r6 = inv_r2 * inv_r2 * inv_r2
    return (12.0 * c12 * inv_r6 - 6.0 * c6) * inv_r6 * inv_r2, (c12 * inv_r6 - c6) * inv_r6 - energy_shift


#: Atoms per task of the one-type CPU kernel (each task allocates its scratch rows once).
_CPU_ATOMS_PER_TASK = 256


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _forces_cpu_one_type(positions, types, neighbors, counts, table, forces, energy_per_atom, virial_per_atom):
    """:func:`_forces_cpu` for one atom type, the same bits 1.5x faster: per atom, the neighbours'
    separations are gathered into scratch rows, the pair terms computed in a loop without branches or
    table look-ups (vectorised; ``error_model="numpy"``: no division check, a coincident pair gives inf),
    then summed in list order as there."""
    capacity = neighbors.shape[0]
    n = forces.shape[0]
    c12, c6, cutoff_sq, energy_shift, force_shift = table[0, 0, 0], table[0, 0, 1], table[0, 0, 2], \
        table[0, 0, 3], table[0, 0, 4]
    for task in numba.prange((n + _CPU_ATOMS_PER_TASK - 1) // _CPU_ATOMS_PER_TASK):
        real = positions.dtype   # separations in the positions' dtype, pair terms in float64, as there
        dxs, dys, dzs = np.empty(capacity, real), np.empty(capacity, real), np.empty(capacity, real)
        rsqs, forces_over_r, pair_energies = np.empty(capacity, real), np.empty(capacity), np.empty(capacity)
        for i in range(task * _CPU_ATOMS_PER_TASK, min(n, (task + 1) * _CPU_ATOMS_PER_TASK)):
            xi, yi, zi = positions[i, 0], positions[i, 1], positions[i, 2]
            count = counts[i]
            for k in range(count):
                j = neighbors[k, i]
                dx = xi - positions[j, 0]
                dy = yi - positions[j, 1]
                dz = zi - positions[j, 2]
                dxs[k], dys[k], dzs[k] = dx, dy, dz
                rsqs[k] = dx * dx + dy * dy + dz * dz
            for k in range(count):
                forces_over_r[k], pair_energies[k] = _lj_pair(rsqs[k], c12, c6, energy_shift)
            if force_shift != 0.0:
                for k in range(count):
                    r = math.sqrt(rsqs[k])
                    forces_over_r[k] -= force_shift / r
                    pair_energies[k] += force_shift * r
            fx = 0.0
            fy = 0.0
            fz = 0.0
            energy = 0.0
            virial = 0.0
            for k in range(count):
                if rsqs[k] < cutoff_sq:
                    fx += dxs[k] * forces_over_r[k]
                    fy += dys[k] * forces_over_r[k]
                    fz += dzs[k] * forces_over_r[k]
                    energy += pair_energies[k]
                    virial += rsqs[k] * forces_over_r[k]
            forces[i, 0] = fx
            forces[i, 1] = fy
            forces[i, 2] = fz
            energy_per_atom[i] = 0.5 * energy
            virial_per_atom[i] = 0.5 * virial


@numba.njit(parallel=True, cache=True)
def _forces_cpu(positions, types, neighbors, counts, table, forces, energy_per_atom, virial_per_atom):
    for i in numba.prange(forces.shape[0]):
        xi, yi, zi = positions[i, 0], positions[i, 1], positions[i, 2]
        type_i = types[i]
        fx = 0.0
        fy = 0.0
        fz = 0.0
        energy = 0.0
        virial = 0.0
        for k in range(counts[i]):
            j = neighbors[k, i]
            dx = xi - positions[j, 0]
            dy = yi - positions[j, 1]
            dz = zi - positions[j, 2]
            rsq = dx * dx + dy * dy + dz * dz
            type_j = types[j]
            if rsq < table[type_i, type_j, 2]:
                c12 = table[type_i, type_j, 0]
                c6 = table[type_i, type_j, 1]
                force_shift = table[type_i, type_j, 4]
                force_over_r, pair_energy = _lj_pair(rsq, c12, c6, table[type_i, type_j, 3])
                if force_shift != 0.0:
                    r = math.sqrt(rsq)
                    force_over_r -= force_shift / r
                    pair_energy += force_shift * r
                fx += dx * force_over_r
                fy += dy * force_over_r
                fz += dz * force_over_r
                energy += pair_energy
                virial += rsq * force_over_r
        forces[i, 0] = fx
        forces[i, 1] = fy
        forces[i, 2] = fz
        energy_per_atom[i] = 0.5 * energy
        virial_per_atom[i] = 0.5 * virial


_CUDA_SOURCE = r"""
template <typename real>
__global__ void md_lj_forces(const real* __restrict__ positions, const int* __restrict__ types,
                             const int* __restrict__ neighbors, const int* __restrict__ counts,
                             int n_local, int capacity, const real* __restrict__ table, int n_types,
                             real* __restrict__ forces, int compute_energy, double* __restrict__ per_atom,
                             int minimum_image, real box_x, real box_y, real box_z,
                             real inverse_x, real inverse_y, real inverse_z, int lane_bits, int atom_major,
                             const int* __restrict__ active) {
    /* 2**lane_bits consecutive threads of one warp share atom i: lane l takes neighbours l, l + lanes, ...
       and the lanes' sums are combined by a fixed shuffle tree. One lane (lane_bits 0) is the plain loop.
       atom_major: entry k of atom i at [i * capacity + k] (consecutive lanes read consecutive entries),
       else at [k * n_local + i] (consecutive atoms, one lane each, read consecutive entries).
       active: null, or the device word holding how many of the n_local rows are atoms now (the slab
       driver, apps.md.resident_slab, keeps fixed-capacity arrays whose owned count changes on the device);
       n_local is then the arrays' row capacity (the list's and per_atom's row stride). */
    const int thread = blockDim.x * blockIdx.x + threadIdx.x;
    const int lanes = 1 << lane_bits;
    const int i = thread >> lane_bits;
    const int lane = thread & (lanes - 1);
    const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << ((threadIdx.x & 31) & ~(lanes - 1));
    if (i >= (active != nullptr ? active[0] : n_local)) return;   /* the same for every lane of a group */
    const real xi = positions[3 * i], yi = positions[3 * i + 1], zi = positions[3 * i + 2];
    const real* row = table + 5 * n_types * types[i];
    double fx = 0.0, fy = 0.0, fz = 0.0;   /* float64 accumulation even in the float32 path */
    double energy = 0.0, virial = 0.0;
    const int count = min(counts[i], capacity);
    for (int k = lane; k < count; k += lanes) {
        const int j = neighbors[atom_major ? (long long)i * capacity + k : (long long)k * n_local + i];
        real dx = xi - positions[3 * j];
        real dy = yi - positions[3 * j + 1];
        real dz = zi - positions[3 * j + 2];
        if (minimum_image) {   /* periodic box without ghosts (apps.md.resident) */
            dx -= box_x * rint(dx * inverse_x);
            dy -= box_y * rint(dy * inverse_y);
            dz -= box_z * rint(dz * inverse_z);
        }
        const real rsq = dx * dx + dy * dy + dz * dz;
        const real* pair = row + 5 * types[j];
        if (rsq < pair[2]) {
            const real inv_r2 = real(1) / rsq;
            const real inv_r6 = inv_r2 * inv_r2 * inv_r2;
            real force_over_r = (real(12) * pair[0] * inv_r6 - real(6) * pair[1]) * inv_r6 * inv_r2;
            real pair_energy = (pair[0] * inv_r6 - pair[1]) * inv_r6 - pair[3];
            const real force_shift = pair[4];
            if (force_shift != real(0)) {
                const real r = sqrt(rsq);
                force_over_r -= force_shift / r;
                pair_energy += force_shift * r;
            }
            fx += (double)(dx * force_over_r);
            fy += (double)(dy * force_over_r);
            fz += (double)(dz * force_over_r);
            if (compute_energy) {
                energy += (double)pair_energy;
                virial += (double)(rsq * force_over_r);
            }
        }
    }
    for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
        fx += __shfl_down_sync(group, fx, offset, lanes);
        fy += __shfl_down_sync(group, fy, offset, lanes);
        fz += __shfl_down_sync(group, fz, offset, lanes);
        if (compute_energy) {
            energy += __shfl_down_sync(group, energy, offset, lanes);
            virial += __shfl_down_sync(group, virial, offset, lanes);
        }
    }
    if (lane != 0) return;
    forces[3 * i] = (real)fx;
    forces[3 * i + 1] = (real)fy;
    forces[3 * i + 2] = (real)fz;
    if (compute_energy) {
        /* Per-atom shares (half of each pair, seen twice in a full list), summed later in a fixed
           order: no float atomics, so thermo is the same on every run. Rows: E_pair, then W. */
        per_atom[i] = 0.5 * energy;
        per_atom[(long long)n_local + i] = 0.5 * virial;
    }
}
"""

_NAMES = ("md_lj_forces<float>", "md_lj_forces<double>")
