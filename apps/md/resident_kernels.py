"""CUDA kernels of the device-resident MD driver (:mod:`apps.md.resident`): begin, bin, sort cells, neighbours.

The step they belong to, and what [flag] means, is described in :mod:`apps.md.resident`; the slab
driver (:mod:`apps.md.resident_slab`) launches the same kernels. :func:`_kernel` returns one compiled
instantiation (``dtype`` picks float or double for the templated ones).
"""

from __future__ import annotations

import numpy as np

from ._arrays import raw_kernel

_CUDA_SOURCE = r"""
#define NOT_EXCEEDED 2147483647

/* Start of a step: advance the step counter, clear the rebuild flag of the previous step (the watch's
   first-exceeded word), zero the cell counts for this step's possible binning. */
extern "C" __global__ void md_resident_begin(long long* counter, int* watch, int* cell_count, int n_cells) {
    const int c = blockDim.x * blockIdx.x + threadIdx.x;
    if (c == 0) {
        counter[0] += 1;
        watch[0] = NOT_EXCEEDED;
        watch[1] = 0;
    }
    if (c < n_cells) cell_count[c] = 0;
}

/* [flag] Wrap into the box (wrap = 1: positions, images and reference updated; wrap = 0: bin the
   reference positions as they are), then append each atom to its cell's slots. */
template <typename real>
__global__ void md_resident_bin(real* __restrict__ positions, int* __restrict__ images, real* __restrict__ reference,
                                int n, int wrap, real box_x, real box_y, real box_z,
                                real cells_per_x, real cells_per_y, real cells_per_z, int nx, int ny, int nz,
                                int* __restrict__ cell_count, int* __restrict__ cell_atoms, int cell_capacity,
                                const int* __restrict__ watch, int* __restrict__ control) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n) return;
    const real box[3] = {box_x, box_y, box_z};
    real p[3];
    for (int axis = 0; axis < 3; ++axis) {
        real x = wrap ? positions[3 * i + axis] : reference[3 * i + axis];
        if (wrap) {   /* the arithmetic of ghosts.md_wrap */
            int crossings = (int)floor(x / box[axis]);
            x -= crossings * box[axis];
            if (x >= box[axis]) { x -= box[axis]; crossings += 1; }
            positions[3 * i + axis] = x;
            reference[3 * i + axis] = x;
            images[3 * i + axis] += crossings;
        }
        p[axis] = x;
    }
    const int cx = min(max((int)floor(p[0] * cells_per_x), 0), nx - 1);
    const int cy = min(max((int)floor(p[1] * cells_per_y), 0), ny - 1);
    const int cz = min(max((int)floor(p[2] * cells_per_z), 0), nz - 1);
    const int cell = (cz * ny + cy) * nx + cx;
    const int slot = atomicAdd(cell_count + cell, 1);
    if (slot < cell_capacity) cell_atoms[(long long)cell * cell_capacity + slot] = i;
    else atomicMax(control + 2, slot + 1);
}

/* [flag] Ascending atom index inside every cell: the list order, hence the forces' summation order,
   does not depend on the order of the atomics above. One warp per cell: each lane ranks the entries it
   holds against all of the cell's entries (indices are distinct), then writes them at their ranks. */
#define SORT_PER_LANE 8
extern "C" __global__ void md_resident_sort_cells(const int* __restrict__ watch, const int* __restrict__ cell_count,
                                                  int n_cells, int cell_capacity, int* __restrict__ cell_atoms) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int c = (blockDim.x * blockIdx.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (c >= n_cells) return;   /* the same for the whole warp */
    int* slots = cell_atoms + (long long)c * cell_capacity;
    const int m = min(cell_count[c], cell_capacity);
    if (m > 32 * SORT_PER_LANE) {   /* a grown, crowded cell: insertion sort by one lane */
        if (lane == 0)
            for (int k = 1; k < m; ++k) {
                const int value = slots[k];
                int q = k - 1;
                while (q >= 0 && slots[q] > value) { slots[q + 1] = slots[q]; --q; }
                slots[q + 1] = value;
            }
        return;
    }
    int value[SORT_PER_LANE], rank[SORT_PER_LANE];
    for (int v = 0; v < SORT_PER_LANE; ++v) {
        const int k = lane + 32 * v;
        value[v] = k < m ? slots[k] : 0;
        rank[v] = 0;
    }
    for (int t = 0; t < m; ++t) {
        const int other = slots[t];   /* the same address in every lane: one broadcast load */
        for (int v = 0; v < SORT_PER_LANE; ++v) rank[v] += other < value[v];
    }
    __syncwarp();   /* every lane has read every entry before any is overwritten */
    for (int v = 0; v < SORT_PER_LANE; ++v)
        if (lane + 32 * v < m) slots[rank[v]] = value[v];
}

/* [flag] Full neighbour list from the reference (build-time) positions, 27 periodic neighbour cells,
   minimum-image distances. 2**lane_bits consecutive threads of a warp share atom i: they test a cell's
   slots side by side and append the hits with a ballot, in slot order, so the list is the one a single
   thread would write. Storage: one lane k-major ([k * n + i]), several lanes atom-major ([i * capacity + k]),
   as the force kernel reads it. Counts past the capacity are recorded (control[1]) but not stored. */
template <typename real>
__global__ void md_resident_neighbors(const real* __restrict__ reference, int n, real box_x, real box_y, real box_z,
                                      real inverse_x, real inverse_y, real inverse_z,
                                      real cells_per_x, real cells_per_y, real cells_per_z, int nx, int ny, int nz,
                                      const int* __restrict__ cell_count, const int* __restrict__ cell_atoms,
                                      int cell_capacity, real cutoff_sq, int capacity, int* __restrict__ neighbors,
                                      int* __restrict__ counts, const int* __restrict__ watch,
                                      int* __restrict__ control, int count_build, int lane_bits,
                                      real origin_x, real origin_y, real origin_z, int periodic_mask,
                                      const int* __restrict__ active) {
    /* The slab driver (apps.md.resident_slab) reuses this kernel: its cell grid starts at origin and is
       periodic only on the axes of periodic_mask (bit a: axis a; others hold ghost cells, box and inverse
       are 0 there, so the minimum-image terms vanish); list rows for the first active[0] of the n rows
       (n: the arrays' capacity and the k-major stride). One GPU: origin 0, mask 7, active null. */
    if (watch[0] == NOT_EXCEEDED) return;
    const int thread = blockDim.x * blockIdx.x + threadIdx.x;
    if (thread == 0 && count_build) control[0] += 1;
    const int lanes = 1 << lane_bits;
    const int i = thread >> lane_bits;
    const int lane = thread & (lanes - 1);
    const int first_lane = (threadIdx.x & 31) & ~(lanes - 1);
    const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << first_lane;
    if (i >= (active != nullptr ? active[0] : n)) return;   /* the same for every lane of a group */
    const real xi = reference[3 * i], yi = reference[3 * i + 1], zi = reference[3 * i + 2];
    const int cx = min(max((int)floor((xi - origin_x) * cells_per_x), 0), nx - 1);
    const int cy = min(max((int)floor((yi - origin_y) * cells_per_y), 0), ny - 1);
    const int cz = min(max((int)floor((zi - origin_z) * cells_per_z), 0), nz - 1);
    int count = 0;
    for (int oz = -1; oz <= 1; ++oz) {
        int z = cz + oz;
        if (periodic_mask & 4) z = (z + nz) % nz;
        else if (z < 0 || z >= nz) continue;
        for (int oy = -1; oy <= 1; ++oy) {
            int y = cy + oy;
            if (periodic_mask & 2) y = (y + ny) % ny;
            else if (y < 0 || y >= ny) continue;
            for (int ox = -1; ox <= 1; ++ox) {
                int x = cx + ox;
                if (periodic_mask & 1) x = (x + nx) % nx;
                else if (x < 0 || x >= nx) continue;
                const int cell = (z * ny + y) * nx + x;
                const int* slots = cell_atoms + (long long)cell * cell_capacity;
                const int m = min(cell_count[cell], cell_capacity);
                for (int base = 0; base < m; base += lanes) {
                    const int k = base + lane;
                    int j = -1;
                    bool hit = false;
                    if (k < m) {
                        j = slots[k];
                        real dx = xi - reference[3 * j];
                        real dy = yi - reference[3 * j + 1];
                        real dz = zi - reference[3 * j + 2];
                        dx -= box_x * rint(dx * inverse_x);
                        dy -= box_y * rint(dy * inverse_y);
                        dz -= box_z * rint(dz * inverse_z);
                        hit = j != i && dx * dx + dy * dy + dz * dz < cutoff_sq;
                    }
                    if (lanes == 1) {   /* no ballot: single-lane masks would serialise a diverged warp */
                        if (hit && count < capacity) neighbors[(long long)count * n + i] = j;   /* k-major */
                        count += hit;
                        continue;
                    }
                    const unsigned hits = (__ballot_sync(group, hit) & group) >> first_lane;
                    if (hit) {
                        const int position = count + __popc(hits & ((1u << lane) - 1u));
                        if (position < capacity) neighbors[(long long)i * capacity + position] = j;   /* atom-major */
                    }
                    count += __popc(hits);
                }
            }
        }
    }
    if (lane != 0) return;
    counts[i] = count;
    atomicMax(control + 1, count);
}
"""

_NAMES = ("md_resident_begin", "md_resident_sort_cells",
          *(f"{kernel}<{real}>" for kernel in ("md_resident_bin", "md_resident_neighbors") for real in ("float", "double")))


def _kernel(name, dtype=None):
    if dtype is None:
        return raw_kernel(_CUDA_SOURCE, _NAMES, name)
    real = "float" if np.dtype(dtype) == np.float32 else "double"
    return raw_kernel(_CUDA_SOURCE, _NAMES, f"{name}<{real}>")
