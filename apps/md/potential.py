"""Lennard-Jones 12-6 pair potential with a cutoff, for one or several atom types.

For a pair of types (a, b) at distance r < r_c(a, b)::

    E_LJ(r) = 4 eps [(sigma / r)**12 - (sigma / r)**6]        F_LJ(r) = -dE_LJ/dr

Variants (LAMMPS names in brackets):

- ``plain``       E = E_LJ(r)                                          (lj/cut)
- ``shift``       E = E_LJ(r) - E_LJ(r_c); forces unchanged             (lj/cut + pair_modify shift yes)
- ``force_shift`` E = E_LJ(r) - E_LJ(r_c) + (r - r_c) F_LJ(r_c),
                  F = F_LJ(r) - F_LJ(r_c): energy and force continuous  (lj/smooth/linear)

Kernels consume a flat *pair table* of shape ``(n_types, n_types, 5)`` with, per pair,
``[c12 = 4 eps sigma**12, c6 = 4 eps sigma**6, r_c**2, energy_offset, force_shift]`` so that::

    E(r)     = c12 r**-12 - c6 r**-6 - energy_offset + force_shift r
    F(r) / r = (12 c12 r**-12 - 6 c6 r**-6) / r**2 - force_shift / r

with ``force_shift = F_LJ(r_c)`` (force_shift variant, else 0) and
``energy_offset = E_LJ(r_c) + force_shift r_c`` (0 for plain). A kernel needs the square root of r**2
only when ``force_shift != 0``.

Tail corrections (:func:`tail_corrections`) follow LAMMPS ``pair_modify tail yes`` and apply to the plain
cut only: they assume g(r) = 1 beyond r_c, which contradicts a shifted potential.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

VARIANTS = ("plain", "shift", "force_shift")
MIXING_RULES = ("geometric", "arithmetic")


@dataclass(frozen=True)
class LennardJones:
    """Per-pair LJ parameters; build it with :func:`lennard_jones`.

    Attributes
    ----------
    epsilon, sigma, cutoff : numpy.ndarray, shape (n_types, n_types), float64
        Well depth (epsilon), size (sigma) and cutoff (sigma) per type pair; symmetric.
    variant : {"plain", "shift", "force_shift"}
    """

    epsilon: np.ndarray
    sigma: np.ndarray
    cutoff: np.ndarray
    variant: str

    @property
    def n_types(self) -> int:
        return self.epsilon.shape[0]

    @property
    def max_cutoff(self) -> float:
        """Largest pair cutoff (sigma); neighbour lists use ``max_cutoff + skin``."""
        return float(self.cutoff.max())

    def pair_table(self, dtype=np.float64) -> np.ndarray:
        """Kernel coefficient table, shape (n_types, n_types, 5), see the module docstring."""
        eps, sig, rc = self.epsilon, self.sigma, self.cutoff
        c12 = 4.0 * eps * sig**12
        c6 = 4.0 * eps * sig**6
        energy_at_cut = c12 * rc**-12.0 - c6 * rc**-6.0
        force_at_cut = (12.0 * c12 * rc**-12.0 - 6.0 * c6 * rc**-6.0) / rc
        zeros = np.zeros_like(eps)
        force_shift = force_at_cut if self.variant == "force_shift" else zeros
        energy_offset = zeros if self.variant == "plain" else energy_at_cut + force_shift * rc
        table = np.stack([c12, c6, rc**2, energy_offset, force_shift], axis=-1)
        return np.ascontiguousarray(table, dtype=dtype)

    def energy(self, r, type_i, type_j):
        """Pair energy (epsilon) at distances ``r`` (sigma); zero beyond the cutoff. NumPy, any shape."""
        energy, _ = self._evaluate(r, type_i, type_j)
        return energy

    def force(self, r, type_i, type_j):
        """Scalar pair force ``-dE/dr`` (epsilon / sigma) at distances ``r``; zero beyond the cutoff."""
        _, force = self._evaluate(r, type_i, type_j)
        return force

    def _evaluate(self, r, type_i, type_j):
        table = self.pair_table()[type_i, type_j]
        r = np.asarray(r, dtype=np.float64)
        c12, c6, cut2, energy_offset, force_shift = np.moveaxis(table, -1, 0)
        inside = r * r < cut2
        inv6 = r**-6.0
        energy = c12 * inv6 * inv6 - c6 * inv6 - energy_offset + force_shift * r
        force = (12.0 * c12 * inv6 * inv6 - 6.0 * c6 * inv6) / r - force_shift
        return np.where(inside, energy, 0.0), np.where(inside, force, 0.0)


def lennard_jones(epsilon=1.0, sigma=1.0, cutoff=2.5, variant="plain", mixing="geometric") -> LennardJones:
    """Build a :class:`LennardJones` table.

    Parameters
    ----------
    epsilon, sigma : float, array of shape (n_types,) or (n_types, n_types)
        Scalars for one type; per-type vectors are mixed with ``mixing``; full symmetric matrices are
        taken as given.
    cutoff : float or array of shape (n_types, n_types)
        Pair cutoff(s) in sigma units of length (absolute, not multiples of sigma).
    variant : {"plain", "shift", "force_shift"}
    mixing : {"geometric", "arithmetic"}
        ``geometric``: eps_ab = sqrt(eps_a eps_b), sigma_ab = sqrt(sigma_a sigma_b);
        ``arithmetic`` (Lorentz-Berthelot): eps geometric, sigma_ab = (sigma_a + sigma_b) / 2.
    """
    if variant not in VARIANTS:
        raise ConfigurationError(f"LJ variant: expected one of {VARIANTS}, found {variant!r}")
    if mixing not in MIXING_RULES:
        raise ConfigurationError(f"LJ mixing: expected one of {MIXING_RULES}, found {mixing!r}")
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    sig = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    n_types = max(eps.shape[0], sig.shape[0])
    eps = _pair_matrix("epsilon", eps, n_types, mixing, is_sigma=False)
    sig = _pair_matrix("sigma", sig, n_types, mixing, is_sigma=True)
    cut = np.asarray(cutoff, dtype=np.float64)
    cut = np.full((n_types, n_types), float(cut)) if cut.ndim == 0 else cut
    for name, matrix in (("epsilon", eps), ("sigma", sig), ("cutoff", cut)):
        if matrix.shape != (n_types, n_types) or not np.allclose(matrix, matrix.T):
            raise ConfigurationError(f"LJ {name}: expected a symmetric ({n_types}, {n_types}) matrix, found {matrix}")
        if np.any(matrix < 0) or (name != "epsilon" and np.any(matrix <= 0)):
            raise ConfigurationError(f"LJ {name}: expected positive values, found {matrix}")
    return LennardJones(epsilon=eps, sigma=sig, cutoff=cut, variant=variant)


def tail_corrections(potential: LennardJones, type_counts, volume: float):
    """Long-range corrections of a plain cut, as LAMMPS ``pair_modify tail yes``.

    Parameters
    ----------
    potential : LennardJones
        Must use ``variant="plain"``.
    type_counts : array_like, shape (n_types,)
        Global number of atoms of each type.
    volume : float
        Box volume (sigma**3).

    Returns
    -------
    energy_tail : float
        Total energy correction (epsilon, whole system; divide by N for per-atom).
    pressure_tail : float
        Pressure correction (epsilon / sigma**3), added to the virial pressure.
    """
    if potential.variant != "plain":
        raise ConfigurationError(
            f"tail corrections: expected variant 'plain' (they assume an unshifted cut), found "
            f"{potential.variant!r}; drop the tail correction or use the plain cut"
        )
    counts = np.asarray(type_counts, dtype=np.float64)
    if counts.shape != (potential.n_types,):
        raise ConfigurationError(f"type_counts: expected shape ({potential.n_types},), found {counts.shape}")
    sig6 = potential.sigma**6
    rc3 = potential.cutoff**3
    rc6, rc9 = rc3 * rc3, rc3**3
    pair_counts = np.outer(counts, counts)  # sum over ordered pairs == LAMMPS's i<=j loop counted twice for i!=j
    prefactor = 8.0 * np.pi * pair_counts * potential.epsilon * sig6 / (9.0 * rc9)
    energy_tail = float(np.sum(prefactor * (sig6 - 3.0 * rc6))) / volume
    pressure_tail = float(np.sum(2.0 * prefactor * (2.0 * sig6 - 3.0 * rc6))) / volume**2
    return energy_tail, pressure_tail


def _pair_matrix(name, values, n_types, mixing, is_sigma):
    if values.ndim == 2:
        return values
    if values.shape[0] == 1:
        values = np.full(n_types, values[0])
    if values.shape != (n_types,):
        raise ConfigurationError(f"LJ {name}: expected {n_types} per-type values, found {values.shape[0]}")
    if is_sigma and mixing == "arithmetic":
        return 0.5 * (values[:, None] + values[None, :])
    return np.sqrt(values[:, None] * values[None, :])
