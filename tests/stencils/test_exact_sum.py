"""The exact sum behind hpcgpu.global_sum (hpcgpu.reductions) on adversarial inputs: it equals math.fsum
wherever that returns (values over the whole double range, subnormals, cancellation, millions of cells),
gives the same bits however the cells are split into parts (ranks), handles NaN, infinities and overflow
as documented, and never writes past its buffer of partials: inputs that need more partials than a
buffer holds (a smooth field decaying over hundreds of binary orders needs more than 256) end in the
exact fallback with the same result."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcgpu.reductions import _FULL, PARTIALS_CAPACITY, _compiled_partials, exact_sum, rounded_total

finite = st.floats(allow_nan=False, allow_infinity=False)           # the whole range, subnormals included
powers_of_two = st.builds(lambda k, sign: math.copysign(math.ldexp(1.0, k), sign),
                          st.integers(-1074, 1023), st.sampled_from([-1.0, 1.0]))
subnormal = st.floats(min_value=-2.2250738585072014e-308, max_value=2.2250738585072014e-308)
SETTINGS = settings(max_examples=300, deadline=None)


def reference(values) -> float:
    """math.fsum, and where it refuses (an intermediate or final overflow) the exact sum rounded once."""
    try:
        return math.fsum(values)
    except OverflowError:
        exact = sum(map(Fraction, values), Fraction(0))
        try:
            return float(exact)
        except OverflowError:
            return math.inf if exact > 0 else -math.inf


def total(values, capacity=PARTIALS_CAPACITY) -> float:
    return rounded_total([exact_sum(np.array(values, dtype=np.float64), capacity)])


def same_bits(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes() or (math.isnan(a) and math.isnan(b))


@SETTINGS
@given(st.lists(st.one_of(finite, powers_of_two, subnormal), max_size=300))
def test_equals_fsum_over_the_whole_double_range(values):
    assert same_bits(total(values), reference(values))


@SETTINGS
@given(st.lists(st.one_of(finite, powers_of_two), max_size=100), st.lists(finite, max_size=20), st.randoms())
def test_equals_fsum_under_cancellation(values, small, random):
    """Every value and its negation, plus a few others, in any order: the survivors must be exact."""
    mixed = values + [-value for value in values] + small
    random.shuffle(mixed)
    assert same_bits(total(mixed), reference(mixed))


@SETTINGS
@given(st.lists(st.one_of(finite, powers_of_two, subnormal), max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_any_split_into_parts_gives_the_same_bits(values, cuts):
    """The parts are what ranks hold: the total cannot depend on where the cells were split."""
    bounds = [0, *sorted(min(cut, len(values)) for cut in cuts), len(values)]
    parts = [exact_sum(np.array(values[a:b], dtype=np.float64)) for a, b in zip(bounds, bounds[1:])]
    assert same_bits(rounded_total(parts), total(values))


@SETTINGS
@given(st.lists(st.one_of(finite, powers_of_two, subnormal), min_size=1, max_size=150))
def test_a_buffer_too_small_falls_back_to_the_same_exact_sum(values):
    assert exact_sum(np.array(values), capacity=3) == exact_sum(np.array(values))


@SETTINGS
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=50))
def test_non_finite_values_give_what_a_plain_sum_gives(values):
    if all(math.isfinite(value) for value in values):
        return
    expected = float(np.sum(np.array(values, dtype=np.float64)))   # nan, or the infinity of one sign
    assert same_bits(total(values), expected)
    # and across parts (ranks): +inf on one, -inf on another is NaN; inf and finite is inf
    half = len(values) // 2
    split = rounded_total([exact_sum(np.array(values[:half])), exact_sum(np.array(values[half:]))])
    assert same_bits(split, expected)


def test_overflow_on_the_way_and_beyond_the_range():
    big = 1.7976931348623157e308
    assert total([big, big, -big]) == big             # math.fsum raises OverflowError here
    assert total([1e308, 1e308, -1e308, -1e308, 5.0]) == 5.0
    assert total([big, big]) == math.inf and total([-big, -big]) == -math.inf
    with pytest.raises(OverflowError):
        math.fsum([big, big, -big])
    # across parts too: each part in range, their total beyond it; and the other way round
    assert rounded_total([exact_sum(np.array([big])), exact_sum(np.array([big]))]) == math.inf
    assert rounded_total([exact_sum(np.array([big, big])), exact_sum(np.array([-big]))]) == big


def smooth_decaying_field(n=512, width=120.0):
    """exp(-r**2 / width) on an n x n grid, row by row: values from 1 down to subnormals and zeros."""
    y, x = np.indices((n, n)) - n // 2
    return np.exp(-(x * x + y * y) / width)


def test_a_field_spanning_hundreds_of_binary_orders_overruns_a_small_buffer_but_not_this_one():
    """The pattern that corrupted the heap (Gray-Scott's v decays to 1e-201): more partials than 128 and
    than 256 are alive at once, so the old fixed 128-slot buffer was written past; the kernel now stops
    at its buffer's end, and its own buffer (bounded by the number of bit positions of a double) holds."""
    values = np.ascontiguousarray(smooth_decaying_field().ravel())
    kernel = _compiled_partials()
    assert kernel(values, np.empty(128)) == _FULL and kernel(values, np.empty(256)) == _FULL
    assert kernel(values, np.empty(PARTIALS_CAPACITY)) > 0
    assert total(values) == math.fsum(values.tolist())
    assert total(values, capacity=128) == total(values)


@pytest.mark.slow
def test_millions_of_cells_over_the_whole_range():
    rng = np.random.default_rng(2026)
    n = 4_000_000
    values = np.ldexp(rng.standard_normal(n), rng.integers(-1074, 960, n))
    values[::1000] = smooth_decaying_field(2000, 3e5).ravel()[: values[::1000].size]
    values[1::3] = -values[::3][: values[1::3].size]   # cancellation of a third of the cells
    expected = math.fsum(values.tolist())
    assert total(values) == expected
    parts = [exact_sum(part) for part in np.array_split(values, 7)]
    assert rounded_total(parts) == expected
