"""Integral diagnostics of one tile: local sums over owned cells, for the app to allreduce ("sum").

Definitions (``dA = dx dy``; averages as in the scheme, see :mod:`apps.stencil.channel.stage`)::

    mass                 = sum_cells h dA                                            [m^3]
    kinetic_energy       = sum_cells h (avg_x u^2 + avg_y v^2) / 2 dA                [m^5/s^2]
    potential_energy     = sum_cells g (h - H)^2 / 2 dA                              [m^5/s^2]
    energy               = kinetic_energy + potential_energy
    potential_enstrophy  = sum_corners w_j h_q q^2 / 2 dA                            [m/s^2]

Energies are per unit density. The potential energy is the *available* one (relative to the fluid
at rest at depth H); it differs from ``sum g h^2 / 2`` by ``g H mass`` plus a constant, so both are
conserved together. The kinetic energy is the one the energy-conserving vorticity term conserves.
Corner rows on a wall (global rows 0 and ny) carry weight ``w_j = 1/2`` (half a control area inside
the channel); the north wall corners live in the first ghost row of the northern tile, which counts
them. Ghosts must be filled (halo exchange and walls) before calling.
"""

from __future__ import annotations

from typing import Any

from apps.stencil.channel.parameters import TileParameters
from hpcgpu.arch import array_module

DIAGNOSTIC_NAMES = ("mass", "kinetic_energy", "potential_energy", "energy", "potential_enstrophy")


def local_diagnostics(h: Any, u: Any, v: Any, params: TileParameters) -> dict[str, float]:
    """Local sums of the integral diagnostics over the owned cells of one tile.

    Parameters
    ----------
    h, u, v : array, shape (n_rows + 2w, n_cols + 2w)
        Padded fields with filled ghosts (NumPy or CuPy).
    params : TileParameters
        Tile parameters.

    Returns
    -------
    dict
        ``{name: float}`` for each name in :data:`DIAGNOSTIC_NAMES`; each is additive over tiles.
    """
    xp = array_module(h)
    w = params.halo_width
    n_rows, n_columns = h.shape[0] - 2 * w, h.shape[1] - 2 * w
    rows = slice(w, w + n_rows)
    columns = slice(w, w + n_columns)
    area = params.dx * params.dy

    depth = h[rows, columns]
    u2 = u * u
    v2 = v * v
    kinetic = 0.25 * ((u2[rows, columns] + u2[rows, w + 1 : w + n_columns + 1])
                      + (v2[rows, columns] + v2[w + 1 : w + n_rows + 1, columns]))  # fmt: skip
    mass = float(xp.sum(depth)) * area
    kinetic_energy = float(xp.sum(depth * kinetic)) * area
    potential_energy = float(xp.sum(0.5 * params.gravity * (depth - params.mean_depth) ** 2)) * area

    # Corner rows this tile counts: its owned rows, plus the north wall row when it touches it.
    corner_stop = w + n_rows + (1 if params.at_north else 0)
    corner_rows = slice(w, corner_stop)
    lower_rows = slice(w - 1, corner_stop - 1)
    left_columns = slice(w - 1, w + n_columns - 1)
    zeta = (v[corner_rows, columns] - v[corner_rows, left_columns]) / params.dx - (
        u[corner_rows, columns] - u[lower_rows, columns]
    ) / params.dy
    h_corner = 0.25 * ((h[lower_rows, left_columns] + h[lower_rows, columns])
                       + (h[corner_rows, left_columns] + h[corner_rows, columns]))  # fmt: skip
    f = params.coriolis_rows[corner_rows][:, None]
    q = (f + zeta) / h_corner
    weights = xp.ones(corner_stop - w, dtype=h.dtype)
    if params.at_south:
        weights[0] = 0.5
    if params.at_north:
        weights[-1] = 0.5
    potential_enstrophy = float(xp.sum(weights[:, None] * 0.5 * h_corner * q * q)) * area

    return {
        "mass": mass,
        "kinetic_energy": kinetic_energy,
        "potential_energy": potential_energy,
        "energy": kinetic_energy + potential_energy,
        "potential_enstrophy": potential_enstrophy,
    }
