"""Lazy neighbour-list checks: watch displacements on the device every step, read the result rarely.

A Verlet list with skin ``s`` stays exact while no atom has moved more than ``s / 2`` since the build.
Checking that on the host every step costs a device-to-host synchronisation (and, on many ranks, an
allreduce) per step, which on a GPU is more than the step itself for small systems. Instead:

- every step (on the steps where a rebuild may happen, ``step % rebuild_every == 0``) the first-half
  kick/drift kernel also compares each atom with its position at the build and records, on the
  device, the FIRST step at which some atom exceeded ``s / 2`` (``atomicMin``) and the largest squared
  displacement so far (``atomicMax``): :func:`first_half_and_watch`;
- the host reads those two numbers only at *check* steps (thermo steps, output, and a schedule of at
  most ``check_interval`` steps, see below), combining them over ranks (min / max);
- if the first exceedance is the check step itself, the list is rebuilt right there, exactly as an
  every-step check would do;
- if it happened at an EARLIER step ``s`` (between two checks), the steps since ``s`` used a list that
  an every-step check would have rebuilt: the state saved at the last check is put back and the steps
  are run again, rebuilding at ``s`` (:meth:`RebuildWatch.restore` + replay in
  :mod:`apps.md.distributed`). The kernels are deterministic between rebuilds, so the replayed steps are
  bitwise the steps an every-step check runs: results are IDENTICAL to checking every step, never
  approximately so.

Snapshots are three device copies (owned positions, velocities, forces) at each check; a rollback costs
the steps replayed. To make rollbacks rare the next check is predicted from the displacement growth:
after a check at step ``c`` with largest displacement ``d`` (``b`` = last build), the next check comes
``0.8 (s/2 - d) / rate`` steps later (``rate = d / (c - b)``, a linear extrapolation, which overestimates
the sub-ballistic growth of a liquid), at least 1 and at most ``check_interval`` steps; right after a
build, one step before the shortest of the last three build intervals. Counts of checks and rollbacks go to the summary.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._arrays import THREADS_PER_BLOCK, _is_cupy, array_module, blocks_for, check_array, raw_kernel
from .integrate import _first_half_cpu

#: "No exceedance yet" in the first-step slot of the watch array.
NOT_EXCEEDED = 2**31 - 1


def first_half_and_watch(positions, velocities, forces, masses, dt: float, reference, threshold_sq: float,
                         step: int, watch, step_counter=None) -> None:
    """Velocity Verlet first half (``v += dt/2 f/m; x += dt v``) plus the displacement watch, in place.

    Parameters
    ----------
    positions : array, shape (n_atoms, 3), n_atoms >= n_local; only owned rows change (sigma)
    velocities, forces : arrays, shape (n_local, 3); masses : (n_local,) -- same dtype and backend
    dt : float (tau)
    reference : array, shape (n_local, 3) -- owned positions at the last neighbour-list build
    threshold_sq : float -- ``(skin / 2) ** 2`` (sigma**2)
    step : int -- the step these new positions belong to
    watch : int32 array, shape (2,) -- ``[first step exceeded (NOT_EXCEEDED if none), float32 bits of the
        largest squared displacement]``; updated with atomicMin / atomicMax. Returns None.
    step_counter : cupy int64 array, shape (1,), optional (GPU only) -- when given, the step is read from
        it on the device instead of ``step`` (a CUDA graph replays the same launch on every step:
        :mod:`apps.md.step_graph`)
    """
    n_local = velocities.shape[0]
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    for name, array, shape in (("velocities", velocities, (n_local, 3)), ("forces", forces, (n_local, 3)),
                               ("masses", masses, (n_local,)), ("reference", reference, (n_local, 3))):
        check_array(name, array, shape=shape, dtypes=[positions.dtype], like=positions)
    check_array("watch", watch, shape=(2,), dtypes=[np.int32], like=positions)
    if n_local == 0:
        return
    if _is_cupy(positions):
        real_name = "float" if positions.dtype == np.float32 else "double"
        kernel = raw_kernel(_CUDA_SOURCE, _NAMES, f"md_first_half_watch<{real_name}>")
        kernel((blocks_for(n_local),), (THREADS_PER_BLOCK,),
               (positions, velocities, forces, masses, np.int32(n_local), positions.dtype.type(dt), reference,
                np.float64(threshold_sq), np.int32(step), watch,
                np.uint64(0) if step_counter is None else step_counter, np.uint64(0)))
        return
    _first_half_cpu(positions, velocities, forces, masses, positions.dtype.type(dt))
    displacement_sq = np.empty(n_local, dtype=np.float64)
    exceeded = _displacements_cpu(positions, reference, n_local, threshold_sq, displacement_sq)
    if exceeded:
        watch[0] = min(int(watch[0]), int(step))
    largest = np.float32(displacement_sq.max())
    watch[1] = max(int(watch[1]), int(np.array([largest], np.float32).view(np.int32)[0]))


@numba.njit(parallel=True, cache=True)
def _displacements_cpu(positions, reference, n_local, threshold_sq, displacement_sq):
    # Same arithmetic as neighbors._displacement_exceeds_cpu (the every-step check).
    n_exceeding = 0
    for i in numba.prange(n_local):
        dx = positions[i, 0] - reference[i, 0]
        dy = positions[i, 1] - reference[i, 1]
        dz = positions[i, 2] - reference[i, 2]
        value = dx * dx + dy * dy + dz * dz
        displacement_sq[i] = value
        if value > threshold_sq:
            n_exceeding += 1
    return n_exceeding


class RebuildWatch:
    """The host side of the lazy check: device watch array, schedule of checks, last verified state.

    Parameters
    ----------
    like : array -- any state array (chooses NumPy or CuPy)
    skin : float (sigma); check_interval : int -- at most this many steps between two checks
    """

    def __init__(self, like, skin: float, check_interval: int):
        xp = array_module(like)
        self.xp = xp
        self.threshold_sq = (0.5 * float(skin)) ** 2
        self.half_skin = 0.5 * float(skin)
        self.check_interval = int(check_interval)
        self.values = xp.zeros(2, dtype=xp.int32)
        self._reset_values = xp.asarray(np.array([NOT_EXCEEDED, 0], dtype=np.int32))
        self.build_step = 0
        self.build_intervals = []   # the last few steps-between-builds (the schedule's guess)
        self.verified_step = -1
        self.next_check = 0
        self.n_checks = 0
        self.n_rollbacks = 0
        self.n_replayed_steps = 0
        self._saved = None
        self.values[...] = self._reset_values

    def reset(self, step: int) -> None:
        """A neighbour list was built at ``step`` (device-side reset, no synchronisation)."""
        self.values[...] = self._reset_values
        if step > self.build_step:
            self.build_intervals = (self.build_intervals + [step - self.build_step])[-3:]
        self.build_step = step

    def read(self, comm) -> tuple[int, float]:
        """Collective: (first step any rank exceeded skin/2 or NOT_EXCEEDED, largest displacement, sigma)."""
        host = self.values.get() if _is_cupy(self.values) else self.values.copy()
        first = int(host[0])
        largest = math.sqrt(float(host[1:2].view(np.float32)[0]))
        if comm.size > 1:
            first = int(comm.allreduce(first, "min"))
            largest = float(comm.allreduce(largest, "max"))
        self.n_checks += 1
        return first, largest

    def verified(self, state, largest_displacement: float | None) -> None:
        """The state after step ``state.step`` is known to be right: save it and plan the next check."""
        n_local = state.n_local
        previous = self._saved or {}
        self._saved = {
            "positions": self._copy(previous.get("positions"), state.positions[:n_local]),
            "velocities": self._copy(previous.get("velocities"), state.velocities),
            "forces": self._copy(previous.get("forces"), state.forces),
            "step": state.step, "nose_hoover": state.nose_hoover,
            "energy_virial": state.energy_virial, "energy_step": state.energy_step,
            "per_atom_energy": state.per_atom_energy, "n_builds": state.n_builds}
        self.verified_step = state.step
        self.next_check = state.step + self._steps_to_next_check(state.step, largest_displacement)

    def _copy(self, buffer, values):
        """``values`` copied into ``buffer`` when the shapes match (no allocation per check), else a new copy."""
        if buffer is None or buffer.shape != values.shape or buffer.dtype != values.dtype:
            return self.xp.array(values, copy=True)
        buffer[...] = values
        return buffer

    def _steps_to_next_check(self, step: int, largest: float | None) -> int:
        since_build = step - self.build_step
        if largest is None or since_build <= 0 or largest <= 0.0:
            # Right after a build: one step before the shortest recent build interval.
            guess = min(self.build_intervals) - 1 if self.build_intervals else self.check_interval // 2
        else:
            rate = largest / since_build
            guess = int(0.8 * (self.half_skin - largest) / rate)
        return max(1, min(self.check_interval, guess))

    def restore(self, state) -> None:
        """Put back the last verified state (same neighbour list: no rebuild happened since)."""
        saved = self._saved
        n_local = state.n_local
        state.positions[:n_local] = saved["positions"]
        state.velocities[...] = saved["velocities"]
        state.forces[...] = saved["forces"]
        for name in ("step", "nose_hoover", "energy_virial", "energy_step", "per_atom_energy", "n_builds"):
            setattr(state, name, saved[name])
        self.n_rollbacks += 1

    def summary(self) -> dict:
        return {"check_interval": self.check_interval, "checks": self.n_checks, "rollbacks": self.n_rollbacks,
                "replayed_steps": self.n_replayed_steps}


_CUDA_SOURCE = r"""
template <typename real>
__global__ void md_first_half_watch(real* __restrict__ positions, real* __restrict__ velocities,
                                    const real* __restrict__ forces, const real* __restrict__ masses,
                                    int n_local, real dt, const real* __restrict__ reference,
                                    double threshold_sq, int step, int* watch,
                                    const long long* __restrict__ step_counter, const int* __restrict__ active) {
    /* active: null, or the device word with the number of atoms (rows below n_local) now (the slab
       driver's fixed-capacity arrays, apps.md.resident_slab). */
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (active != nullptr) n_local = active[0];
    if (step_counter != nullptr) step = (int)step_counter[0];   /* graph replays: the step lives on the device */
    float largest = 0.0f;
    bool exceeded = false;
    if (i < n_local) {
        const real half_dt_over_m = real(0.5) * dt / masses[i];
        for (int axis = 0; axis < 3; ++axis) {
            real v = velocities[3 * i + axis] + half_dt_over_m * forces[3 * i + axis];
            velocities[3 * i + axis] = v;
            positions[3 * i + axis] += dt * v;
        }
        /* Same arithmetic as md_displacement_exceeds (the every-step check): float64 differences. */
        double dx = (double)positions[3 * i] - reference[3 * i];
        double dy = (double)positions[3 * i + 1] - reference[3 * i + 1];
        double dz = (double)positions[3 * i + 2] - reference[3 * i + 2];
        const double d2 = dx * dx + dy * dy + dz * dz;
        exceeded = d2 > threshold_sq;
        largest = (float)d2;
    }
    /* One atomic of each kind per block (not per atom or warp): at millions of atoms, per-warp atomics
       on one address queue up for longer than the kick itself takes. Max and min are exact, so the
       result does not depend on how the reduction is split. */
    for (int offset = 16; offset > 0; offset >>= 1)
        largest = fmaxf(largest, __shfl_down_sync(0xffffffff, largest, offset));
    exceeded = __any_sync(0xffffffff, exceeded);
    __shared__ float warp_largest[32];
    __shared__ int block_exceeded;
    if (threadIdx.x == 0) block_exceeded = 0;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        warp_largest[threadIdx.x >> 5] = largest;
        if (exceeded) block_exceeded = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (blockDim.x + 31) >> 5; ++w) largest = fmaxf(largest, warp_largest[w]);
        /* Non-negative floats order like their bit patterns: an integer atomicMax is a float max. */
        if (largest > 0.0f) atomicMax(watch + 1, __float_as_int(largest));
        if (block_exceeded) atomicMin(watch, step);
    }
}
"""

_NAMES = ("md_first_half_watch<float>", "md_first_half_watch<double>")
