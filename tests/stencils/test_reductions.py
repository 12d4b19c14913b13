"""hpcgpu.global_sum is the correctly rounded sum (math.fsum of all cells) on any rank count and split,
where a plain sum of per-rank sums is not; the FrozenOptions path of the fingerprint; --dims parsing.
Adversarial inputs for the exact sum itself (whole double range, subnormals, overflow): test_exact_sum.py."""

from __future__ import annotations

import math

import numpy as np
import pytest


def _awkward(shape, seed=11):
    """Values whose float64 sum depends on the order: large cancelling terms and tiny ones."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 9, size=shape)
    values.flat[::7] = 1e16
    values.flat[3::7] = -1e16
    return values


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_global_sum_has_the_same_bits_in_every_split(comm):
    import hpcgpu
    from hpcgpu.decomposition.shape import factorizations

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for shape, dtype in [((13, 17), "float64"), ((5, 6, 7), "float64"), ((31, 9), "float32")]:
        values = _awkward(shape).astype(dtype)
        expected = math.fsum(values.astype(np.float64).ravel().tolist())
        for dims in factorizations(comm.size, len(shape)):
            grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=False)
            field = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype)
            field.data[...] = 1e300   # ghosts never count
            field.scatter(values if comm.rank == 0 else None)
            assert hpcgpu.global_sum(field) == expected, (shape, dims)
            assert hpcgpu.global_mean(field) == expected / math.prod(shape)


def test_exact_sum_equals_fsum_and_non_finite_values_propagate():
    from hpcgpu.reductions import exact_sum, rounded_total

    values = _awkward((1000,))
    assert rounded_total([exact_sum(values)]) == math.fsum(values.tolist())
    assert math.isnan(rounded_total([exact_sum(np.array([1.0, np.nan]))]))


def test_fingerprint_of_frozen_options_and_model_declared_options():
    import argparse

    from hpcgpu.app.checkpointing import RESTART_INDEPENDENT_OPTIONS, fingerprinted_options
    from hpcgpu.app.cli import FrozenOptions

    options = FrozenOptions(argparse.Namespace(nx=8, steps=10, threads=4), alpha=0.5)
    assert fingerprinted_options(options) == {"--alpha": 0.5, "--nx": 8, "--threads": 4}
    assert fingerprinted_options(options, RESTART_INDEPENDENT_OPTIONS | {"threads"}) == {"--alpha": 0.5, "--nx": 8}


def test_dims_flag_and_script_help():
    from hpcgpu.app.cli import common_parser, parse_args
    from hpcgpu.errors import ConfigurationError

    parser = common_parser("model.py", "a model", grid_axes=3, version="2.1")
    assert parse_args(parser, ["--dims", "2,*,1"]).dims == (2, 0, 1)
    assert parse_args(parser, []).dims is None
    for bad in ("2,2", "a,b,c", "-1,1,1"):
        with pytest.raises(ConfigurationError, match="expected 3 ranks per axis"):
            parse_args(common_parser("model.py", "a model", grid_axes=3), [f"--dims={bad}"])
    help_text = parser.format_help()
    assert "python model.py" in help_text and "python -m model.py" not in help_text
    assert "python -m apps.x" in common_parser("apps.x", "an app").format_help()
