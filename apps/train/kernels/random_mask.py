"""Counter-based random keep-masks for dropout.

A dropout mask must not depend on *where* a sample is processed (which rank, which
micro-batch, which position inside a micro-batch), otherwise an N-rank run would not
reproduce the 1-rank run. So instead of drawing from a stateful generator, every
mask bit is a pure function of its coordinates::

    h = mix(mix(mix(mix(mix(seed ^ GOLDEN) ^ step) ^ stream) ^ sample) ^ element)
    keep = (h >> 32) < threshold,   threshold = round(keep_prob * 2**32)

``mix`` is the SplitMix64 finaliser (Steele, Lea & Flood 2014), a bijection on
64-bit integers with full avalanche, applied after folding in each coordinate.
``stream`` separates different dropout layers, ``sample`` is the *global* sample
index, ``element`` the flat index of the element inside one sample.

The public function :func:`keep_mask` dispatches to a CuPy ElementwiseKernel or a
Numba CPU loop; a plain NumPy reference lives in the tests.
"""

import functools

import numba
import numpy as np

from .backend import cpu_threads_for, is_cupy

GOLDEN = 0x9E3779B97F4A7C15
_MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MIX_MULTIPLIER_2 = 0x94D049BB133111EB


def keep_threshold(keep_prob):
    """Integer threshold on the top 32 hash bits that keeps a fraction ``keep_prob``."""
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(
            f"keep probability: expected 0 < keep_prob <= 1, found {keep_prob}; "
            "dropout probability p must satisfy 0 <= p < 1"
        )
    return min(int(round(keep_prob * 2.0**32)), 2**32)


def keep_mask(sample_index, n_elements, seed, step, stream, keep_prob):
    """Boolean keep-mask for a batch of samples.

    Parameters
    ----------
    sample_index : ndarray of int64, shape (batch,)
        Global index of each sample (NumPy or CuPy; the result lives on the same
        backend).
    n_elements : int
        Number of elements per sample (product of the non-batch dimensions).
    seed, step, stream : int
        Run seed, optimiser step and dropout-layer id (non-negative, < 2**63).
    keep_prob : float
        Probability of keeping an element, ``1 - p``.

    Returns
    -------
    ndarray of bool, shape (batch, n_elements)
    """
    if sample_index.ndim != 1 or sample_index.dtype.kind not in "iu":
        raise TypeError(
            f"sample_index: expected a 1-D integer array, found dtype {sample_index.dtype} "
            f"and shape {tuple(sample_index.shape)}"
        )
    for name, value in (("seed", seed), ("step", step), ("stream", stream)):
        if not 0 <= int(value) < 2**63:
            raise ValueError(f"{name}: expected 0 <= {name} < 2**63, found {value}")
    threshold = keep_threshold(keep_prob)
    batch = int(sample_index.shape[0])
    if is_cupy(sample_index):
        import cupy

        mask = cupy.empty((batch, int(n_elements)), dtype=cupy.bool_)
        _cupy_keep_mask_kernel()(
            sample_index.astype(cupy.int64), np.uint64(seed), np.uint64(step),
            np.uint64(stream), int(n_elements), np.uint64(threshold), mask,
            size=mask.size,
        )
        return mask
    mask = np.empty((batch, int(n_elements)), dtype=np.bool_)
    with cpu_threads_for(mask.size):
        _keep_mask_cpu(
            np.ascontiguousarray(sample_index, dtype=np.int64), np.uint64(seed),
            np.uint64(step), np.uint64(stream), np.uint64(threshold), mask,
        )
    return mask


# ---------------------------------------------------------------- CPU (Numba) --

@numba.njit(inline="always")
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX_MULTIPLIER_1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX_MULTIPLIER_2)
    return z ^ (z >> np.uint64(31))


@numba.njit(parallel=True, cache=True)
def _keep_mask_cpu(sample_index, seed, step, stream, threshold, mask):
    batch, n_elements = mask.shape
    prefix = _mix64(_mix64(_mix64(seed ^ np.uint64(GOLDEN)) ^ step) ^ stream)
    for b in numba.prange(batch):
        key = _mix64(prefix ^ np.uint64(sample_index[b]))
        for e in range(n_elements):
            h = _mix64(key ^ np.uint64(e))
            mask[b, e] = (h >> np.uint64(32)) < threshold


# ----------------------------------------------------------------- GPU (CuPy) --

_PREAMBLE = r"""
__device__ __forceinline__ unsigned long long hpcgpu_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
"""

_KEEP_MASK_BODY = r"""
    const long long b = i / n_elements;
    const unsigned long long e = (unsigned long long)(i % n_elements);
    unsigned long long h = hpcgpu_mix64(seed ^ 0x9E3779B97F4A7C15ULL);
    h = hpcgpu_mix64(h ^ step);
    h = hpcgpu_mix64(h ^ stream);
    h = hpcgpu_mix64(h ^ (unsigned long long)sample_index[b]);
    h = hpcgpu_mix64(h ^ e);
    mask[i] = (h >> 32) < threshold;
"""


@functools.lru_cache(maxsize=None)
def _cupy_keep_mask_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "raw int64 sample_index, uint64 seed, uint64 step, uint64 stream, "
        "int64 n_elements, uint64 threshold",
        "raw bool mask", _KEEP_MASK_BODY, "hpcgpu_train_keep_mask", preamble=_PREAMBLE,
    )
