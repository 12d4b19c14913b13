"""Counter-based random numbers keyed by (seed, step, atom id).

A thermostat or a velocity initialisation must draw the same numbers for an atom whatever rank owns it,
whatever its position in the local arrays and whether the run was restarted. A counter-based generator
gives that: the numbers are a pure function of ``(seed, step, atom_id, k)``, with no state to carry.

The hash is splitmix64 (Steele, Lea & Flood 2014) applied as a chain::

    key   = mix(mix(mix(seed) ^ step) ^ atom_id)
    u_k   = ((mix(key + k) >> 11) + 1) * 2**-53          # uniform in (0, 1], k = 0..3
    n_0,1 = sqrt(-2 ln u_0) * (cos, sin)(2 pi u_1)        # Box-Muller
    n_2   = sqrt(-2 ln u_2) * cos(2 pi u_3)

The same arithmetic is written in Numba (:func:`gaussian3`) and in CUDA (:data:`CUDA_SOURCE`, included by
the GPU thermostat kernel), so CPU and GPU runs agree to the last bits of ``log``/``cos``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._arrays import THREADS_PER_BLOCK, _is_cupy, blocks_for, check_array, raw_kernel

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_ONE = np.uint64(1)
_TWO_POW_M53 = 2.0**-53

#: ``step`` value reserved for initial velocities (never reached by a run).
VELOCITY_STREAM = -1

CUDA_SOURCE = r"""
__device__ __forceinline__ unsigned long long md_splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
__device__ __forceinline__ double md_uniform(unsigned long long key, unsigned long long k) {
    return (double)((md_splitmix64(key + k) >> 11) + 1ULL) * 1.1102230246251565e-16;
}
/* Three standard normal numbers for (seed, step, atom_id); identical to apps.md.rng.gaussian3. */
__device__ __forceinline__ void md_gaussian3(long long seed, long long step, long long atom_id,
                                             double* n0, double* n1, double* n2) {
    unsigned long long key = md_splitmix64(md_splitmix64(md_splitmix64((unsigned long long)seed)
                                           ^ (unsigned long long)step) ^ (unsigned long long)atom_id);
    const double two_pi = 6.283185307179586;
    double r01 = sqrt(-2.0 * log(md_uniform(key, 0ULL)));
    double angle01 = two_pi * md_uniform(key, 1ULL);
    double r2 = sqrt(-2.0 * log(md_uniform(key, 2ULL)));
    double angle2 = two_pi * md_uniform(key, 3ULL);
    *n0 = r01 * cos(angle01);
    *n1 = r01 * sin(angle01);
    *n2 = r2 * cos(angle2);
}
"""


@numba.njit(inline="always")
def _splitmix64(z):
    z = z + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@numba.njit(inline="always")
def _uniform(key, k):
    return np.float64((_splitmix64(key + np.uint64(k)) >> _S11) + _ONE) * _TWO_POW_M53


@numba.njit(inline="always")
def gaussian3(seed, step, atom_id):
    """Three standard normal numbers for ``(seed, step, atom_id)`` (Numba device-style function).

    All three arguments are int64; the result is a tuple of three float64.
    """
    key = _splitmix64(_splitmix64(_splitmix64(np.uint64(seed)) ^ np.uint64(step)) ^ np.uint64(atom_id))
    two_pi = 6.283185307179586
    r01 = math.sqrt(-2.0 * math.log(_uniform(key, 0)))
    angle01 = two_pi * _uniform(key, 1)
    r2 = math.sqrt(-2.0 * math.log(_uniform(key, 2)))
    angle2 = two_pi * _uniform(key, 3)
    return r01 * math.cos(angle01), r01 * math.sin(angle01), r2 * math.cos(angle2)


@numba.njit(parallel=True, cache=True)
def _gaussian_noise_cpu(seed, step, atom_ids, out):
    for i in numba.prange(atom_ids.shape[0]):
        n0, n1, n2 = gaussian3(seed, step, atom_ids[i])
        out[i, 0] = n0
        out[i, 1] = n1
        out[i, 2] = n2


def gaussian_noise(seed: int, step: int, atom_ids) -> np.ndarray:
    """Standard normal 3-vectors, one per atom, that depend only on ``(seed, step, atom id)``.

    Parameters
    ----------
    seed, step : int
        Run seed and time step (any int64; ``VELOCITY_STREAM`` is reserved for initial velocities).
    atom_ids : numpy.ndarray, shape (n_atoms,), int64
        Global atom ids. CuPy input returns a CuPy result computed with :data:`CUDA_SOURCE`.

    Returns
    -------
    array, shape (n_atoms, 3), float64
    """
    check_array("atom_ids", atom_ids, shape=(None,), dtypes=[np.int64])
    if _is_cupy(atom_ids):
        return _gaussian_noise_gpu(int(seed), int(step), atom_ids)
    out = np.empty((atom_ids.shape[0], 3), dtype=np.float64)
    _gaussian_noise_cpu(np.int64(seed), np.int64(step), atom_ids, out)
    return out


_NOISE_KERNEL_SOURCE = CUDA_SOURCE + r"""
extern "C" __global__ void md_gaussian_noise(long long seed, long long step, const long long* atom_ids,
                                             int n_atoms, double* out) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_atoms) return;
    double n0, n1, n2;
    md_gaussian3(seed, step, atom_ids[i], &n0, &n1, &n2);
    out[3 * i] = n0; out[3 * i + 1] = n1; out[3 * i + 2] = n2;
}
"""


def _gaussian_noise_gpu(seed, step, atom_ids):
    import cupy

    kernel = raw_kernel(_NOISE_KERNEL_SOURCE, ("md_gaussian_noise",), "md_gaussian_noise")
    out = cupy.empty((atom_ids.shape[0], 3), dtype=cupy.float64)
    kernel((blocks_for(atom_ids.shape[0]),), (THREADS_PER_BLOCK,),
           (np.int64(seed), np.int64(step), atom_ids, np.int32(atom_ids.shape[0]), out))
    return out
