"""NumPy slicing reference of the sphere stage kernel, and single-rank tile-by-tile drivers.

``reference_stage`` writes the kernel's expressions with the same parentheses and order, vectorised
over the region, so it agrees with the Numba kernel bitwise. ``run_tiled`` steps a global state tile
by tile, refilling every tile's ghosts from the assembled global state before each stage and
building whole latitude circles for the polar filter from the tiles of a band (what the halo
exchange and the row communicator do in the model).
"""

import numpy as np

from apps.stencil.sphere import (
    SSP_RK3_STAGES,
    filter_and_combine,
    initial_owned_state,
    make_filter_plan,
    make_initial_condition,
    sphere_stage,
    tile_parameters,
)
from apps.stencil.channel.boundaries import fill_channel_boundaries


def reference_stage(out, base, stage, increment, a, b, dt, params, filtered_rows, region):
    j0, j1, i0, i1 = region
    if j0 == j1 or i0 == i1:
        return
    h, u, v = stage
    real = params.dtype.type
    half, quarter, gravity, rdy = real(0.5), real(0.25), real(params.gravity), real(params.rdy)
    a, b, dt = real(a), real(b), real(dt)
    cc, rc = params.cos_center[:, None], params.rcos_center[:, None]
    rdxc, rdyc = params.rdx_center[:, None], params.rdy_center[:, None]
    cf, rdxf, rdyf = params.cos_face[:, None], params.rdx_face[:, None], params.rdy_face[:, None]
    mask = params.v_face_mask[:, None]
    f, hs = params.coriolis, params.topography

    def s(array, dj=0, di=0):
        return array[j0 + dj:j1 + dj, i0 + di:i1 + di]

    def row(array, dj=0):
        return array[j0 + dj:j1 + dj]

    def u_flux(dj, di):
        return (half * (s(h, dj, di - 1) + s(h, dj, di))) * s(u, dj, di)

    def v_flux(dj, di):
        return ((half * (s(h, dj - 1, di) + s(h, dj, di))) * s(v, dj, di)) * row(cf, dj)

    def pv(dj, di):
        zeta = (s(v, dj, di) - s(v, dj, di - 1)) * row(rdxf, dj) - (
            s(u, dj, di) * row(cc, dj) - s(u, dj - 1, di) * row(cc, dj - 1)) * row(rdyf, dj)
        h_corner = quarter * ((s(h, dj - 1, di - 1) + s(h, dj - 1, di)) + (s(h, dj, di - 1) + s(h, dj, di)))
        return (s(f, dj, di) + zeta) / h_corner

    def bernoulli(dj, di):
        kinetic = quarter * ((s(u, dj, di) * s(u, dj, di) + s(u, dj, di + 1) * s(u, dj, di + 1))
                             + ((s(v, dj, di) * s(v, dj, di)) * row(cf, dj)
                                + (s(v, dj + 1, di) * s(v, dj + 1, di)) * row(cf, dj + 1)) * row(rc, dj))
        return gravity * (s(h, dj, di) + s(hs, dj, di)) + kinetic

    dh = -((u_flux(0, 1) - u_flux(0, 0)) * row(rdxc) + (v_flux(1, 0) - v_flux(0, 0)) * row(rdyc))
    q_here, q_north, q_east = pv(0, 0), pv(1, 0), pv(0, 1)
    v_south = half * (v_flux(0, -1) + v_flux(0, 0))
    v_north = half * (v_flux(1, -1) + v_flux(1, 0))
    u_west = half * (u_flux(-1, 0) + u_flux(0, 0))
    u_east = half * (u_flux(-1, 1) + u_flux(0, 1))
    b_here = bernoulli(0, 0)
    du = (half * (q_here * v_south + q_north * v_north)) * row(rc) - (b_here - bernoulli(0, -1)) * row(rdxc)
    dv = -(half * (q_here * u_west + q_east * u_east)) - (b_here - bernoulli(-1, 0)) * rdy
    dv = dv * row(mask)
    polar = row(filtered_rows[:, None]) != 0
    for field, tendency in enumerate((dh, du, dv)):
        new = a * s(base[field]) + b * (s(stage[field]) + dt * tendency)
        target = out[field][j0:j1, i0:i1]
        target[...] = np.where(polar, target, new)
        inc = increment[field][j0:j1, i0:i1]
        inc[...] = np.where(polar, dt * tendency, inc)


def global_state(parameters, init="williamson2"):
    """Owned-cell (h, u, v) of the whole sphere and the topography function of the case."""
    initial = make_initial_condition(init, parameters)
    return list(initial_owned_state(initial, parameters, (0, 0), (parameters.ny, parameters.nx))), initial


def padded_from_global(global_fields, row_range, column_range, parameters, w=1):
    """A tile's padded arrays with all ghosts (periodic longitude, neighbours, pole mirrors) filled."""
    (r0, r1), (c0, c1) = row_range, column_range
    nx, ny = parameters.nx, parameters.ny
    rows = np.clip(np.arange(r0 - w, r1 + w), 0, ny - 1)
    columns = np.arange(c0 - w, c1 + w) % nx
    padded = [np.ascontiguousarray(g[np.ix_(rows, columns)]) for g in global_fields]
    fill_channel_boundaries(*padded, w, r0 == 0, r1 == ny)
    return padded


def run_tiled(global_fields, parameters, row_splits, column_splits, dt, n_steps, topography_fn=None):
    """Step the global (h, u, v) ``n_steps`` SSP-RK3 steps tile by tile; returns new global arrays."""
    state = [g.copy() for g in global_fields]
    tiles = [((r0, r1), (c0, c1)) for r0, r1 in zip(row_splits[:-1], row_splits[1:])
             for c0, c1 in zip(column_splits[:-1], column_splits[1:])]
    tile_params = {t: tile_parameters(parameters, t[0][0], t[0][1] - t[0][0], t[1][0], t[1][1] - t[1][0], 1, topography_fn)
                   for t in tiles}
    plans = {t: make_filter_plan(parameters, t[0][0], t[0][1] - t[0][0], t[1][0], t[1][1] - t[1][0]) for t in tiles}
    for _ in range(n_steps):
        stages = [state, None, None]
        for stage_index, (a, b) in enumerate(SSP_RK3_STAGES):
            source = stages[stage_index]
            new_global = [np.empty_like(g) for g in state]
            increments = {}
            pieces = {}
            for t in tiles:
                (r0, r1), (c0, c1) = t
                stage_padded = padded_from_global(source, *t, parameters)
                base_padded = padded_from_global(state, *t, parameters)
                out = [np.zeros_like(p) for p in stage_padded]
                inc = [np.zeros_like(p) for p in stage_padded]
                region = (1, 1 + r1 - r0, 1, 1 + c1 - c0)
                sphere_stage(out, base_padded, stage_padded, inc, a, b, dt, tile_params[t], plans[t].filtered_rows, region)
                increments[t] = (out, base_padded, stage_padded, inc)
                rows = list(plans[t].rows)
                pieces[t] = np.stack([np.stack([x[j, 1:1 + c1 - c0] for x in inc]) for j in rows]) if rows else None
            for t in tiles:
                out, base_padded, stage_padded, inc = increments[t]
                band = [pieces[s] for s in tiles if s[0] == t[0]]
                circle = None if pieces[t] is None else np.concatenate(band, axis=-1)
                filter_and_combine(out, base_padded, stage_padded, inc, a, b, plans[t], lambda block, c=circle: c)
                (r0, r1), (c0, c1) = t
                for g, o in zip(new_global, out):
                    g[r0:r1, c0:c1] = o[1:1 + r1 - r0, 1:1 + c1 - c0]
            if stage_index < 2:
                stages[stage_index + 1] = new_global
            else:
                state = new_global
    return state
