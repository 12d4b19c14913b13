"""The fused GPU diagnostics (``diagnostics_gpu``) against the generic CuPy expressions and NumPy.

Needs CuPy and a GPU. Run on the GPU machine::

    python -m pytest tests/apps/stencil/sphere/test_sphere_diagnostics_gpu.py -m gpu -q
"""

import numpy as np
import pytest
from sphere_reference import global_state, padded_from_global

from apps.stencil.sphere import SphereParameters, diagnostics_gpu, local_diagnostics, tile_parameters
from apps.stencil.sphere.diagnostics import _local_diagnostics_arrays
from apps.stencil.sphere.diagnostics_gpu import local_diagnostics_gpu

pytestmark = pytest.mark.gpu

#: (nx, ny), owned rows, owned columns, halo width: the 1440 x 720 production grid on one tile, an odd
#: grid on one tile, and tiles of an odd grid decomposed in latitude and longitude (middle, north pole).
CASES = {
    "1440x720": ((1440, 720), (0, 720), (0, 1440), 1),
    "97x61": ((97, 61), (0, 61), (0, 97), 1),
    "97x61-middle-tile": ((97, 61), (20, 41), (10, 60), 2),
    "97x61-north-tile": ((97, 61), (41, 61), (0, 97), 2),
}


def _structured_state(parameters, seed):
    """Williamson case 5 (mountain) with a random perturbation: global owned (h, u, v) and the topography."""
    (h, u, v), initial = global_state(parameters, "williamson5")
    rng = np.random.default_rng(seed)
    h = h * (1.0 + 0.01 * rng.standard_normal(h.shape))
    u = u + 5.0 * rng.standard_normal(u.shape)
    v = v + 5.0 * rng.standard_normal(v.shape)
    v[0, :] = 0.0  # the south pole face
    return [h, u, v], initial.topography


def _tile_and_fields(cupy, case, dtype):
    (nx, ny), (r0, r1), (c0, c1), w = CASES[case]
    p = SphereParameters(nx=nx, ny=ny, alpha=0.3)
    state, topography = _structured_state(p, seed=nx + r0 + c0)
    host = [f.astype(dtype) for f in padded_from_global(state, (r0, r1), (c0, c1), p, w)]
    tiles = {xp: tile_parameters(p, r0, r1 - r0, c0, c1 - c0, w, topography, xp=xp, dtype=dtype) for xp in (np, cupy)}
    return host, [cupy.asarray(f) for f in host], tiles[np], tiles[cupy]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_diagnostics_match_generic_cupy_bitwise_and_numpy(cupy, case, dtype):
    """The fused kernel gives the generic CuPy expressions' bits, and NumPy's values to 1e-13."""
    host, device, cpu_tile, gpu_tile = _tile_and_fields(cupy, case, dtype)
    fused = local_diagnostics_gpu(*device, gpu_tile)
    assert local_diagnostics(*device, gpu_tile) == fused  # the dispatch takes the fused path
    generic = _local_diagnostics_arrays(*device, gpu_tile)
    for name, value in generic.items():
        assert fused[name] == value, f"{name}: fused {fused[name]!r} != generic CuPy {value!r} (diff {fused[name] - value:.3e})"
    cpu = local_diagnostics(*host, cpu_tile)
    for name, value in cpu.items():
        assert fused[name] == pytest.approx(value, rel=1e-13, abs=0.0), name


def test_fused_diagnostics_pow_variant_agrees(cupy, monkeypatch):
    """The kernel's ``pow(x, 2.0)`` variant (what CuPy < 14.2 does for ``x ** 2``) agrees with ``x * x``
    to rounding; not bitwise by construction (libdevice's pow vs one multiply)."""
    _, device, _, gpu_tile = _tile_and_fields(cupy, "97x61-middle-tile", np.float64)
    by_multiply = local_diagnostics_gpu(*device, gpu_tile)
    monkeypatch.setattr(diagnostics_gpu, "_square_by_pow", lambda: True)
    by_pow = local_diagnostics_gpu(*device, gpu_tile)
    for name, value in by_multiply.items():
        assert by_pow[name] == pytest.approx(value, rel=1e-15, abs=0.0), name


def test_fused_diagnostics_reject_mismatched_fields(cupy):
    """Fields of another padding or dtype are refused with a message, not read out of bounds."""
    _, (h, u, v), _, gpu_tile = _tile_and_fields(cupy, "97x61-middle-tile", np.float64)
    with pytest.raises(ValueError, match="halo_width"):
        local_diagnostics_gpu(h[2:, 2:], u[2:, 2:], v[2:, 2:], gpu_tile)
    with pytest.raises(TypeError, match="one dtype"):
        local_diagnostics_gpu(h, u.astype(np.float32), v, gpu_tile)
