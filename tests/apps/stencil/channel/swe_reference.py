"""Test helpers for the shallow-water numerics: a NumPy slicing reference and a tiny "halo exchange".

The reference writes every discrete quantity with the same expression tree as the kernels
(``apps/stencil/channel/stage_cpu.py``), evaluated on shifted slices, so it agrees with them bitwise.
The tile helpers emulate a decomposition without MPI: each tile's ghosts are copied from a global
array (x wrapped periodically), then the physical walls are filled by ``fill_channel_boundaries``.
"""

from __future__ import annotations

import numpy as np

from apps.stencil.channel import (
    SSP_RK3_STAGES,
    SWEParameters,
    fill_channel_boundaries,
    kernel_constants,
    swe_stage,
    tile_parameters,
)


def reference_stage(out, base, stage, a, b, dt, params, region) -> None:
    """NumPy version of ``swe_stage``: same arithmetic, same order, on slices; in place."""
    h, u, v = stage
    j0, j1, i0, i1 = region
    c = kernel_constants(params)
    real = params.dtype.type
    a, b, dt = real(a), real(b), real(dt)
    half, quarter, two = c["half"], c["quarter"], c["two"]
    rdx, rdy, rdx2, rdy2 = c["rdx"], c["rdy"], c["rdx2"], c["rdy2"]
    gravity, viscosity, hyperviscosity = c["gravity"], c["viscosity"], c["hyperviscosity"]

    def at(array, dj, di):
        return array[j0 + dj : j1 + dj, i0 + di : i1 + di]

    def u_flux(dj, di):
        return (half * (at(h, dj, di - 1) + at(h, dj, di))) * at(u, dj, di)

    def v_flux(dj, di):
        return (half * (at(h, dj - 1, di) + at(h, dj, di))) * at(v, dj, di)

    def potential_vorticity(dj, di):
        zeta = (at(v, dj, di) - at(v, dj, di - 1)) * rdx - (at(u, dj, di) - at(u, dj - 1, di)) * rdy
        h_corner = quarter * ((at(h, dj - 1, di - 1) + at(h, dj - 1, di)) + (at(h, dj, di - 1) + at(h, dj, di)))
        f = params.coriolis_rows[j0 + dj : j1 + dj][:, None]
        return (f + zeta) / h_corner

    def bernoulli(dj, di):
        kinetic = quarter * (
            (at(u, dj, di) * at(u, dj, di) + at(u, dj, di + 1) * at(u, dj, di + 1))
            + (at(v, dj, di) * at(v, dj, di) + at(v, dj + 1, di) * at(v, dj + 1, di))
        )
        return gravity * at(h, dj, di) + kinetic

    def laplacian(array, dj, di):
        return ((at(array, dj, di - 1) + at(array, dj, di + 1)) - two * at(array, dj, di)) * rdx2 + (
            (at(array, dj - 1, di) + at(array, dj + 1, di)) - two * at(array, dj, di)
        ) * rdy2

    def bilaplacian(array):
        centre = laplacian(array, 0, 0)
        west, east = laplacian(array, 0, -1), laplacian(array, 0, 1)
        south, north = laplacian(array, -1, 0), laplacian(array, 1, 0)
        return ((west + east) - two * centre) * rdx2 + ((south + north) - two * centre) * rdy2

    dh = -((u_flux(0, 1) - u_flux(0, 0)) * rdx + (v_flux(1, 0) - v_flux(0, 0)) * rdy)
    q_here, q_north, q_east = potential_vorticity(0, 0), potential_vorticity(1, 0), potential_vorticity(0, 1)
    v_flux_south = half * (v_flux(0, -1) + v_flux(0, 0))
    v_flux_north = half * (v_flux(1, -1) + v_flux(1, 0))
    u_flux_west = half * (u_flux(-1, 0) + u_flux(0, 0))
    u_flux_east = half * (u_flux(-1, 1) + u_flux(0, 1))
    bernoulli_here = bernoulli(0, 0)
    du = half * (q_here * v_flux_south + q_north * v_flux_north) - (bernoulli_here - bernoulli(0, -1)) * rdx
    dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (bernoulli_here - bernoulli(-1, 0)) * rdy
    if viscosity != 0:
        du = du + viscosity * laplacian(u, 0, 0)
        dv = dv + viscosity * laplacian(v, 0, 0)
    if hyperviscosity != 0:
        du = du - hyperviscosity * bilaplacian(u)
        dv = dv - hyperviscosity * bilaplacian(v)
    dv = dv * params.v_face_mask[j0:j1][:, None]

    for out_field, base_field, stage_field, tendency in zip(out, base, stage, (dh, du, dv)):
        out_field[j0:j1, i0:i1] = a * at(base_field, 0, 0) + b * (at(stage_field, 0, 0) + dt * tendency)


def owned_region(shape, halo_width):
    """(j0, j1, i0, i1) of the owned cells of a padded array."""
    return (halo_width, shape[0] - halo_width, halo_width, shape[1] - halo_width)


def tile_from_global(global_fields, rows, columns, halo_width, parameters: SWEParameters):
    """Padded copies (h, u, v) of a tile's part of global (ny, nx) fields, ghosts filled.

    ``rows`` and ``columns`` are (start, stop) of the owned global indices. Ghosts come from the
    global arrays (x periodic, y inside the channel) and the walls from ``fill_channel_boundaries``.
    """
    ny, nx = parameters.ny, parameters.nx
    w = halo_width
    global_rows = np.arange(rows[0] - w, rows[1] + w)
    global_columns = np.arange(columns[0] - w, columns[1] + w) % nx
    inside = (global_rows >= 0) & (global_rows < ny)
    tile = []
    for field in global_fields:
        padded = np.zeros((len(global_rows), len(global_columns)), dtype=field.dtype)
        padded[inside] = field[global_rows[inside]][:, global_columns]
        tile.append(padded)
    fill_channel_boundaries(*tile, w, at_south=rows[0] == 0, at_north=rows[1] == ny)
    return tile


def run_tiled(global_state, parameters, row_splits, column_splits, dt, n_steps, halo_width=None):
    """Step global (h, u, v) with SSP-RK3, tile by tile, refilling ghosts from global each stage."""
    w = parameters.halo_width if halo_width is None else halo_width
    tiles = [
        ((row_splits[r], row_splits[r + 1]), (column_splits[c], column_splits[c + 1]))
        for r in range(len(row_splits) - 1)
        for c in range(len(column_splits) - 1)
    ]
    params_of_tile = {
        rows: tile_parameters(parameters, rows[0], rows[1] - rows[0], w) for rows, _ in tiles
    }
    state = [field.copy() for field in global_state]
    for _ in range(n_steps):
        base_global = state
        stage_global = state
        for a, b in SSP_RK3_STAGES:
            new_global = [np.full_like(field, np.nan) for field in state]
            for rows, columns in tiles:
                base = tile_from_global(base_global, rows, columns, w, parameters)
                stage = tile_from_global(stage_global, rows, columns, w, parameters)
                out = [np.zeros_like(field) for field in stage]
                swe_stage(out, base, stage, a, b, dt, params_of_tile[rows], owned_region(out[0].shape, w))
                for new_field, out_field in zip(new_global, out):
                    new_field[rows[0] : rows[1], columns[0] : columns[1]] = out_field[w:-w, w:-w]
            stage_global = new_global
        state = stage_global
    return state


def single_tile_fill_fn(parameters: SWEParameters, halo_width: int):
    """A ``fill_ghosts_fn`` for one tile covering the whole channel: periodic x, then the walls."""
    w = halo_width

    def fill(fields):
        for field in fields:
            field[:, :w] = field[:, -2 * w : -w]
            field[:, -w:] = field[:, w : 2 * w]
        fill_channel_boundaries(*fields, w, at_south=True, at_north=True)

    return fill
