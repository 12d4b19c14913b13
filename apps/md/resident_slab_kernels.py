"""CUDA kernels of the slab driver (:mod:`apps.md.resident_slab`): migration and ghosts on the device.

Every kernel here runs inside a CUDA graph that replays the same launches each step, so none takes a
count from the host: counts live in the ``words`` array on the device (layout below, mirrored by the
``W_*`` constants of :mod:`apps.md.resident_slab`), and kernels marked [flag] return at once unless
this step rebuilds (the watch word is not NOT_EXCEEDED after the allreduce).

Stable compaction in three launches (deterministic: list order is atom order, never atomics order):
``classify``/``select`` give each atom a 4-bit category mask and count each category per block (the grid
is a fixed number of blocks, each owning a contiguous range of rows), ``scan`` turns the block counts
into offsets and totals (one block), ``scatter`` writes each category's row indices in row order.
"""

_CUDA_SOURCE = r"""
#define NOT_EXCEEDED 2147483647
#define TILE 256
/* words[]: 0 builds, 1 neighbours needed, 2 cell slots needed (the one-GPU kernels' control words),
   3 owned rows needed, 4 ghost rows needed (per side), 5 migrants needed (per side), 6 atoms lost,
   7 a peer-exchange wait timed out,
   8 owned atoms, 9 staying atoms, 10/11 ghost rows to send low/high, 12/13 leaving low/high,
   14 leaving (both sides), 16/17 ghost rows received from low/high. */
#define W_OWNED_NEEDED 3
#define W_GHOSTS_NEEDED 4
#define W_MIGRANTS_NEEDED 5
#define W_LOST 6
#define W_PEER_TIMEOUT 7
#define W_OWNED 8
#define W_STAY 9
#define W_SEND 10
#define W_LEAVE 12
#define W_LEAVE_ALL 14
#define W_RECEIVED 16
#define MIGRANT_WORDS 12

__device__ __forceinline__ int rows_per_block(int n_rows) {
    const int per_block = (n_rows + gridDim.x - 1) / gridDim.x;
    return (per_block + TILE - 1) / TILE * TILE;
}

/* Block totals of the 4 category bits of `mask` (thread 0 adds them to totals[]). */
__device__ __forceinline__ void count_categories(int mask, int* totals) {
    for (int k = 0; k < 4; ++k) {
        const int c = __syncthreads_count((mask >> k) & 1);
        if (threadIdx.x == 0) totals[k] += c;
    }
}

/* [flag] Wrap the owned atoms into the box (image flags follow) and sort them by destination along
   `axis`: bit 0 stays, bit 1 goes to the low neighbour, bit 2 to the high one, bit 3 leaves (either).
   An atom in none of the three slabs moved more than a slab in one rebuild interval: counted as lost. */
template <typename real>
__global__ void slab_classify(real* __restrict__ positions, int* __restrict__ images, int* __restrict__ words,
                              int n_rows, real box_x, real box_y, real box_z, int axis, real lower, real upper,
                              real low_lower, real low_upper, real high_lower, real high_upper,
                              int* __restrict__ masks, int* __restrict__ block_counts, const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int n = words[W_OWNED];
    const int span = rows_per_block(n_rows);
    const int first = blockIdx.x * span;
    const real box[3] = {box_x, box_y, box_z};
    __shared__ int totals[4];
    if (threadIdx.x < 4) totals[threadIdx.x] = 0;
    __syncthreads();
    for (int base = first; base < first + span; base += TILE) {
        const int i = base + threadIdx.x;
        int mask = 0;
        if (i < n) {
            real along = 0;
            for (int a = 0; a < 3; ++a) {   /* the arithmetic of ghosts.md_wrap */
                real x = positions[3 * i + a];
                int crossings = (int)floor(x / box[a]);
                x -= crossings * box[a];
                if (x >= box[a]) { x -= box[a]; crossings += 1; }
                positions[3 * i + a] = x;
                images[3 * i + a] += crossings;
                if (a == axis) along = x;
            }
            if (along >= lower && along < upper) mask = 1;
            else if (along >= low_lower && along < low_upper) mask = 2 | 8;
            else if (along >= high_lower && along < high_upper) mask = 4 | 8;
            else { mask = 2 | 8; atomicAdd(words + W_LOST, 1); }
        }
        if (i < n_rows && i >= 0) masks[i] = mask;
        count_categories(mask, totals);
    }
    if (threadIdx.x < 4) block_counts[threadIdx.x * gridDim.x + blockIdx.x] = totals[threadIdx.x];
}

/* [flag] Ghost candidates along `axis`: bit 0 within `width` of the low face, bit 1 of the high face
   (both for a slab thinner than two widths: two images). Rows: the owned atoms, from `source`. */
template <typename real>
__global__ void slab_select_ghosts(const real* __restrict__ source, const int* __restrict__ words, int n_rows,
                                   int axis, real low_limit, real high_limit, int* __restrict__ masks,
                                   int* __restrict__ block_counts, const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int n = words[W_OWNED];
    const int span = rows_per_block(n_rows);
    const int first = blockIdx.x * span;
    __shared__ int totals[4];
    if (threadIdx.x < 4) totals[threadIdx.x] = 0;
    __syncthreads();
    for (int base = first; base < first + span; base += TILE) {
        const int i = base + threadIdx.x;
        int mask = 0;
        if (i < n) {
            const real x = source[3 * i + axis];
            mask = (x < low_limit ? 1 : 0) | (x >= high_limit ? 2 : 0);
        }
        if (i < n_rows) masks[i] = mask;
        count_categories(mask, totals);
    }
    if (threadIdx.x < 4) block_counts[threadIdx.x * gridDim.x + blockIdx.x] = totals[threadIdx.x];
}

/* [flag] One block of 1024 threads: exclusive prefix sums of the block counts of each category (in
   place: they become each block's first output slot), totals into words[total_k] (skipped if < 0). */
extern "C" __global__ void slab_scan(int* __restrict__ block_counts, int n_blocks, int* __restrict__ words,
                                     int total_0, int total_1, int total_2, int total_3,
                                     const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    __shared__ int warp_sums[32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int total_word[4] = {total_0, total_1, total_2, total_3};
    for (int k = 0; k < 4; ++k) {
        const int value = t < n_blocks ? block_counts[k * n_blocks + t] : 0;
        int x = value;
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, offset);
            if (lane >= offset) x += y;
        }
        if (lane == 31) warp_sums[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int s = warp_sums[lane];
            for (int offset = 1; offset < 32; offset <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, s, offset);
                if (lane >= offset) s += y;
            }
            warp_sums[lane] = s;
        }
        __syncthreads();
        if (t < n_blocks) block_counts[k * n_blocks + t] = (warp > 0 ? warp_sums[warp - 1] : 0) + x - value;
        if (t == 0 && total_word[k] >= 0) words[total_word[k]] = warp_sums[31];
        __syncthreads();
    }
}

/* [flag] Row indices of each category in row order: out_k[slot] = i for the rows with bit k, slots from
   the block's offset; slots at or past capacity_k are not written (the totals say how many were needed). */
extern "C" __global__ void slab_scatter(const int* __restrict__ masks, const int* __restrict__ words, int n_rows,
                                        const int* __restrict__ block_offsets,
                                        int* __restrict__ out_0, int capacity_0, int* __restrict__ out_1, int capacity_1,
                                        int* __restrict__ out_2, int capacity_2, int* __restrict__ out_3, int capacity_3,
                                        const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int n = words[W_OWNED];
    const int span = rows_per_block(n_rows);
    const int first = blockIdx.x * span;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int* const out[4] = {out_0, out_1, out_2, out_3};
    const int capacity[4] = {capacity_0, capacity_1, capacity_2, capacity_3};
    int offset[4];
    for (int k = 0; k < 4; ++k) offset[k] = block_offsets[k * gridDim.x + blockIdx.x];
    __shared__ int warp_counts[4][TILE / 32];
    for (int base = first; base < first + span; base += TILE) {
        const int i = base + threadIdx.x;
        const int mask = i < n ? masks[i] : 0;
        int rank[4];
        for (int k = 0; k < 4; ++k) {
            const unsigned bits = __ballot_sync(0xffffffffu, (mask >> k) & 1);
            rank[k] = __popc(bits & ((1u << lane) - 1u));
            if (lane == 0) warp_counts[k][warp] = __popc(bits);
        }
        __syncthreads();
        for (int k = 0; k < 4; ++k) {
            int before = 0, tile_total = 0;
            for (int w = 0; w < TILE / 32; ++w) {
                if (w < warp) before += warp_counts[k][w];
                tile_total += warp_counts[k][w];
            }
            const int slot = offset[k] + before + rank[k];
            if (((mask >> k) & 1) && out[k] != nullptr && slot < capacity[k]) out[k][slot] = i;
            offset[k] += tile_total;
        }
        __syncthreads();
    }
}

/* [flag] Records of the leaving atoms (MIGRANT_WORDS doubles each: x y z vx vy vz m ix iy iz id type),
   after a count word: send[side][0] = count, records from send[side][1]. Threads: 2 * capacity. */
template <typename real>
__global__ void slab_pack_migrants(const real* __restrict__ positions, const real* __restrict__ velocities,
                                   const real* __restrict__ masses, const int* __restrict__ images,
                                   const long long* __restrict__ ids, const int* __restrict__ types,
                                   const int* __restrict__ leaving_low, const int* __restrict__ leaving_high,
                                   int* __restrict__ words, int capacity, double* __restrict__ send_low,
                                   double* __restrict__ send_high, const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int t = blockDim.x * blockIdx.x + threadIdx.x;
    if (t >= 2 * capacity) return;
    const int side = t / capacity, k = t % capacity;
    const int count = words[W_LEAVE + side];
    double* send = side ? send_high : send_low;
    if (k == 0) {
        send[0] = (double)count;
        if (count > capacity) atomicMax(words + W_MIGRANTS_NEEDED, count);
    }
    if (k >= min(count, capacity)) return;
    const int i = (side ? leaving_high : leaving_low)[k];
    double* record = send + 1 + (long long)MIGRANT_WORDS * k;
    for (int a = 0; a < 3; ++a) {
        record[a] = (double)positions[3 * i + a];
        record[3 + a] = (double)velocities[3 * i + a];
        record[7 + a] = (double)images[3 * i + a];
    }
    record[6] = (double)masses[i];
    record[10] = (double)ids[i];
    record[11] = (double)types[i];
}

__device__ __forceinline__ int lower_bound(const int* values, int begin, int end, int key) {
    while (begin < end) {
        const int middle = (begin + end) >> 1;
        if (values[middle] < key) begin = middle + 1; else end = middle;
    }
    return begin;
}

template <typename real>
__device__ __forceinline__ void move_atom(real* positions, real* velocities, real* masses, int* images,
                                          long long* ids, int* types, int from, int to) {
    for (int a = 0; a < 3; ++a) {
        positions[3 * to + a] = positions[3 * from + a];
        velocities[3 * to + a] = velocities[3 * from + a];
        images[3 * to + a] = images[3 * from + a];
    }
    masses[to] = masses[from];
    ids[to] = ids[from];
    types[to] = types[from];
}

/* [flag] Close the gaps the leaving atoms open below n_stay: the staying atoms at rows >= n_stay move, in
   row order, into the leaving rows < n_stay, in row order (`leaving`: all leaving rows, ascending). One
   thread per row of the tail [n_stay, n_owned); after it the staying atoms are rows [0, n_stay). */
template <typename real>
__global__ void slab_fill_gaps(real* __restrict__ positions, real* __restrict__ velocities, real* __restrict__ masses,
                               int* __restrict__ images, long long* __restrict__ ids, int* __restrict__ types,
                               const int* __restrict__ leaving, int capacity, const int* __restrict__ words,
                               const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int n_leaving = min(words[W_LEAVE_ALL], capacity);
    const int n_stay = words[W_STAY];
    const int t = blockDim.x * blockIdx.x + threadIdx.x;
    if (t >= n_leaving) return;
    const int row = n_stay + t;
    const int tail_begin = lower_bound(leaving, 0, n_leaving, n_stay);   /* leaving rows >= n_stay start here */
    const int at = lower_bound(leaving, tail_begin, n_leaving, row);
    if (at < n_leaving && leaving[at] == row) return;   /* this tail row leaves: nothing to move */
    const int mover = t - (at - tail_begin);            /* staying tail rows before this one */
    move_atom(positions, velocities, masses, images, ids, types, row, leaving[mover]);
}

/* [flag] Append the arriving atoms after the staying ones (from the low neighbour first), set the owned
   count. Threads: 2 * capacity. */
template <typename real>
__global__ void slab_unpack_migrants(real* __restrict__ positions, real* __restrict__ velocities,
                                     real* __restrict__ masses, int* __restrict__ images, long long* __restrict__ ids,
                                     int* __restrict__ types, const double* __restrict__ from_low,
                                     const double* __restrict__ from_high, int capacity, int* __restrict__ words,
                                     int n_rows, const int* __restrict__ watch) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int t = blockDim.x * blockIdx.x + threadIdx.x;
    if (t >= 2 * capacity) return;
    const int n_stay = words[W_STAY];
    const int count_low = min((int)from_low[0], capacity), count_high = min((int)from_high[0], capacity);
    if (t == 0) {
        const int total = n_stay + count_low + count_high;
        words[W_OWNED] = min(total, n_rows);
        if (total > n_rows) atomicMax(words + W_OWNED_NEEDED, total);
    }
    const int side = t / capacity, k = t % capacity;
    if (k >= (side ? count_high : count_low)) return;
    const int row = n_stay + (side ? count_low : 0) + k;
    if (row >= n_rows) return;
    const double* record = (side ? from_high : from_low) + 1 + (long long)MIGRANT_WORDS * k;
    for (int a = 0; a < 3; ++a) {
        positions[3 * row + a] = (real)record[a];
        velocities[3 * row + a] = (real)record[3 + a];
        images[3 * row + a] = (int)record[7 + a];
    }
    masses[row] = (real)record[6];
    ids[row] = (long long)record[10];
    types[row] = (int)record[11];
}

/* Every step: the ghost rows for each neighbour, from `source` (positions; reference positions when a
   list is rebuilt from them), shifted by a box length across the periodic boundary. Threads: 2 * capacity.
   Destinations per side (low, high): positions (capacity, 3), types (capacity), one count word -- this
   rank's send buffers (NCCL), or the neighbours' own ghost rows and received-count words, mapped from
   their memory (peer exchange: the stores go over NVLink). */
template <typename real>
__global__ void slab_pack_ghosts(const real* __restrict__ source, const int* __restrict__ types,
                                 const int* __restrict__ send_low, const int* __restrict__ send_high,
                                 int* __restrict__ words, int capacity, int axis, real shift_low, real shift_high,
                                 real* __restrict__ positions_low, real* __restrict__ positions_high,
                                 int* __restrict__ types_low, int* __restrict__ types_high,
                                 int* __restrict__ count_low, int* __restrict__ count_high) {
    const int t = blockDim.x * blockIdx.x + threadIdx.x;
    if (t >= 2 * capacity) return;
    const int side = t / capacity, k = t % capacity;
    const int count = words[W_SEND + side];
    if (k == 0) {
        *(side ? count_high : count_low) = min(count, capacity);
        if (count > capacity) atomicMax(words + W_GHOSTS_NEEDED, count);
    }
    if (k >= min(count, capacity)) return;
    const int i = (side ? send_high : send_low)[k];
    const real shift = side ? shift_high : shift_low;
    real* out = (side ? positions_high : positions_low) + 3 * (long long)k;
    for (int a = 0; a < 3; ++a) out[a] = source[3 * i + a] + (a == axis ? shift : real(0));
    (side ? types_high : types_low)[k] = types[i];
}

/* Peer exchange, after the stores into the neighbours' memory (the kernel before this one on the stream):
   raise this rank's sequence number `sequence[0]` and publish it into one flag in each neighbour's memory
   (flag_low: the low neighbour's "from high" flag, and the other way round). With `only_on_rebuild`
   ([flag] messages: the migrants) nothing happens on a step without a rebuild, on every rank alike. */
extern "C" __global__ void slab_signal(unsigned long long* __restrict__ sequence, unsigned long long* flag_low,
                                       unsigned long long* flag_high, int only_on_rebuild,
                                       const int* __restrict__ watch) {
    if (only_on_rebuild && watch[0] == NOT_EXCEEDED) return;
    const unsigned long long value = ++sequence[0];
    __threadfence_system();
    *(volatile unsigned long long*)flag_low = value;
    *(volatile unsigned long long*)flag_high = value;
}

/* Peer exchange: raise the expected sequence number `sequence[0]` and wait until both flags (this rank's
   memory, written by the neighbours' slab_signal: from low, from high) reach it. Gives up after about
   `timeout_seconds` (a neighbour that never signals: a bug or a dead rank), records that in
   words[W_PEER_TIMEOUT] -- the host's check of the chunk raises -- and from then on waits no more. */
extern "C" __global__ void slab_wait(unsigned long long* __restrict__ sequence, const unsigned long long* flags,
                                     int only_on_rebuild, const int* __restrict__ watch, int* words,
                                     double timeout_seconds) {
    if (only_on_rebuild && watch[0] == NOT_EXCEEDED) return;
    const unsigned long long value = ++sequence[0];
    if (*(volatile int*)(words + W_PEER_TIMEOUT)) return;
    unsigned long long started;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(started));
    const unsigned long long limit = (unsigned long long)(timeout_seconds * 1e9);
    for (int side = 0; side < 2; ++side) {
        const volatile unsigned long long* flag = flags + side;
        while (*flag < value) {
            unsigned long long now;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            if (now - started > limit) {
                *(volatile int*)(words + W_PEER_TIMEOUT) = 1;
                return;
            }
            __nanosleep(256);
        }
    }
    __threadfence_system();
}

/* [flag] Bin the owned rows [0, n_owned) and the ghost rows (low: [n_rows, n_rows + received_low), high:
   [n_rows + ghost_capacity, ...)) of the reference positions into the cell grid (origin, cells per sigma,
   shape). copy_owned / copy_ghosts: reference := positions first for those rows (a rebuild at this step). */
template <typename real>
__global__ void slab_bin(const real* __restrict__ positions, real* __restrict__ reference,
                         const int* __restrict__ words, int n_rows, int ghost_capacity, int copy_owned, int copy_ghosts,
                         real origin_x, real origin_y, real origin_z,
                         real cells_per_x, real cells_per_y, real cells_per_z, int nx, int ny, int nz,
                         int* __restrict__ cell_count, int* __restrict__ cell_atoms, int cell_capacity,
                         const int* __restrict__ watch, int* __restrict__ control) {
    if (watch[0] == NOT_EXCEEDED) return;
    const int t = blockDim.x * blockIdx.x + threadIdx.x;
    if (t >= n_rows + 2 * ghost_capacity) return;
    bool copy;
    if (t < n_rows) {
        if (t >= words[W_OWNED]) return;
        copy = copy_owned;
    } else {
        const int side = (t - n_rows) / ghost_capacity, k = (t - n_rows) % ghost_capacity;
        if (k >= min(words[W_RECEIVED + side], ghost_capacity)) return;
        copy = copy_ghosts;
    }
    if (copy)
        for (int a = 0; a < 3; ++a) reference[3 * (long long)t + a] = positions[3 * (long long)t + a];
    const real x = reference[3 * (long long)t], y = reference[3 * (long long)t + 1], z = reference[3 * (long long)t + 2];
    const int cx = min(max((int)floor((x - origin_x) * cells_per_x), 0), nx - 1);
    const int cy = min(max((int)floor((y - origin_y) * cells_per_y), 0), ny - 1);
    const int cz = min(max((int)floor((z - origin_z) * cells_per_z), 0), nz - 1);
    const int cell = (cz * ny + cy) * nx + cx;
    const int slot = atomicAdd(cell_count + cell, 1);
    if (slot < cell_capacity) cell_atoms[(long long)cell * cell_capacity + slot] = t;
    else atomicMax(control + 2, slot + 1);
}
"""

_NAMES = ("slab_scan", "slab_scatter", "slab_signal", "slab_wait",
          *(f"{kernel}<{real}>" for kernel in ("slab_classify", "slab_select_ghosts", "slab_pack_migrants",
                                               "slab_fill_gaps", "slab_unpack_migrants", "slab_pack_ghosts", "slab_bin")
            for real in ("float", "double")))
