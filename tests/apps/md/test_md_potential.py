"""LJ pair potential: known values, continuity of the variants, mixing, tail corrections."""

import numpy as np
import pytest

from apps.md import potential
from hpcgpu.errors import ConfigurationError


def test_minimum_and_zero_crossing():
    lj = potential.lennard_jones(epsilon=1.5, sigma=1.2, cutoff=3.0)
    r_min = 2 ** (1 / 6) * 1.2
    assert lj.energy(r_min, 0, 0) == pytest.approx(-1.5)
    assert lj.force(r_min, 0, 0) == pytest.approx(0.0, abs=1e-12)
    assert lj.energy(1.2, 0, 0) == pytest.approx(0.0, abs=1e-12)
    assert lj.energy(3.0, 0, 0) == 0.0 and lj.energy(3.5, 0, 0) == 0.0


def test_variants_at_the_cutoff():
    below = 2.5 * (1 - 1e-9)
    plain = potential.lennard_jones(cutoff=2.5)
    shift = potential.lennard_jones(cutoff=2.5, variant="shift")
    smooth = potential.lennard_jones(cutoff=2.5, variant="force_shift")
    assert plain.energy(below, 0, 0) == pytest.approx(4 * (2.5**-12 - 2.5**-6))
    assert shift.energy(below, 0, 0) == pytest.approx(0.0, abs=1e-9)
    assert smooth.energy(below, 0, 0) == pytest.approx(0.0, abs=1e-9)
    assert smooth.force(below, 0, 0) == pytest.approx(0.0, abs=1e-9)
    assert shift.force(1.3, 0, 0) == plain.force(1.3, 0, 0)
    r = np.linspace(0.95, 2.45, 50)
    step = 1e-6
    numeric = -(smooth.energy(r + step, 0, 0) - smooth.energy(r - step, 0, 0)) / (2 * step)
    np.testing.assert_allclose(smooth.force(r, 0, 0), numeric, rtol=1e-6, atol=1e-7)


def test_mixing_rules():
    geometric = potential.lennard_jones(epsilon=[1.0, 0.25], sigma=[1.0, 0.64], mixing="geometric")
    arithmetic = potential.lennard_jones(epsilon=[1.0, 0.25], sigma=[1.0, 0.64], mixing="arithmetic")
    assert geometric.epsilon[0, 1] == pytest.approx(0.5) and geometric.sigma[0, 1] == pytest.approx(0.8)
    assert arithmetic.epsilon[0, 1] == pytest.approx(0.5) and arithmetic.sigma[0, 1] == pytest.approx(0.82)
    given = potential.lennard_jones(epsilon=[[1.0, 0.3], [0.3, 0.5]], sigma=[[1.0, 0.9], [0.9, 0.8]])
    assert given.epsilon[1, 0] == 0.3 and given.sigma[0, 1] == 0.9
    with pytest.raises(ConfigurationError, match="symmetric"):
        potential.lennard_jones(epsilon=[[1.0, 0.3], [0.2, 0.5]])
    with pytest.raises(ConfigurationError, match="variant"):
        potential.lennard_jones(variant="smooth")


def test_tail_corrections_match_the_textbook_formulas():
    lj = potential.lennard_jones(epsilon=1.0, sigma=1.0, cutoff=2.5)
    n_atoms, volume = 32000, 32000 / 0.8442
    energy_tail, pressure_tail = potential.tail_corrections(lj, [n_atoms], volume)
    density, inverse = 0.8442, 1 / 2.5
    # Allen & Tildesley: E_tail/N = 8/3 pi rho [1/3 rc^-9 - rc^-3], P_tail = 16/3 pi rho^2 [2/3 rc^-9 - rc^-3]
    assert energy_tail / n_atoms == pytest.approx(8 / 3 * np.pi * density * (inverse**9 / 3 - inverse**3))
    assert pressure_tail == pytest.approx(16 / 3 * np.pi * density**2 * (2 / 3 * inverse**9 - inverse**3))
    # Two identical types split 50/50 give the same correction.
    two = potential.lennard_jones(epsilon=[1.0, 1.0], sigma=[1.0, 1.0], cutoff=2.5)
    assert potential.tail_corrections(two, [16000, 16000], volume) == pytest.approx((energy_tail, pressure_tail))
    with pytest.raises(ConfigurationError, match="plain"):
        potential.tail_corrections(potential.lennard_jones(variant="shift"), [10], 10.0)
