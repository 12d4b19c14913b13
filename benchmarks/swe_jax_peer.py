"""Our shallow-water channel against a JAX/XLA peer on the same device, side by side in one call.

The peer is the widely used teaching model of Häfner's ``shallow-water`` repository (Bornö summer
school 2018, ``shallow_water_nonlinear.py``) written in JAX: an Arakawa C-grid, energy-conserving
vorticity flux, flux-form continuity, lateral friction, Adams-Bashforth 2 (one right-hand side per
step, weights 1.6 / -0.6), periodic in x with walls in y, dt = 0.125 dx / sqrt(g H) = 20 s at
dx = 5 km, H = 100 m, and the whole step loop compiled by XLA (``jax.lax.fori_loop`` under
``jax.jit``). It is the same physical set-up as ``apps.stencil``'s default beta-plane jet (same dx,
depth, f0, beta), so the two models are compared per cell-step and in time to solution: steps/s x dt
is simulated seconds per wall second, each model at its own stable time step (ours: SSP-RK3, three
right-hand sides per step, dt from CFL 0.7, about 61 s).

Each repeat of the peer runs ``--steps`` compiled steps after a warm-up call (compilation excluded);
each repeat of ours is one ``python -m apps.stencil`` run whose ``--summary`` throughput is read (its
timed loop excludes set-up and compilation). Minimum and median over ``--repeats`` are printed.

Usage (GPU machine; the peer needs ``jax`` with CUDA, ours CuPy)::

    python benchmarks/swe_jax_peer.py --nx 3600 --ny 1800 --precisions fp32,fp64 --steps 2000 --repeats 3

``--peer-only`` / ``--ours-only`` run one side. ``--json FILE`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

GRAVITY, DEPTH, F0, BETA, DX = 9.81, 100.0, 2.0e-4, 2.0e-11, 5.0e3
AB_A, AB_B = 1.5 + 0.1, -(0.5 + 0.1)


def peer_model(nx: int, ny: int, precision: str):
    """(initial state, run(state, n_steps) -> state, dt) of the JAX peer on an ``ny x nx`` channel.

    Arrays have one ghost ring: shape (ny + 2, nx + 2), index [j, i] = (y, x); h at centres, u on east
    faces, v on north faces (the repository's convention).
    """
    import jax

    jax.config.update("jax_enable_x64", precision == "fp64")
    import jax.numpy as jnp
    import numpy as np

    dtype = np.float64 if precision == "fp64" else np.float32
    dx = dy = DX
    dt = 0.125 * min(dx, dy) / np.sqrt(GRAVITY * DEPTH)
    viscosity = 1e-3 * F0 * dx ** 2
    y = np.arange(ny + 2) * dy
    x = np.arange(nx + 2) * dx
    yy, xx = np.meshgrid(y, x, indexing="ij")
    lx, ly = (nx + 2) * dx, (ny + 2) * dy
    coriolis = jnp.asarray(F0 + (yy - ly / 2) * BETA, dtype=dtype)
    u0 = 10 * np.exp(-(yy - y[(ny + 2) // 2]) ** 2 / (0.02 * lx) ** 2)
    h_geostrophy = np.cumsum(-dy * u0 * (F0 + (yy - ly / 2) * BETA) / GRAVITY, axis=0)
    h0 = DEPTH + h_geostrophy - h_geostrophy.mean() + 0.2 * np.sin(xx / lx * 10 * np.pi) * np.cos(yy / ly * 8 * np.pi)

    def boundaries(a, grid):
        a = a.at[:, 0].set(a[:, -2]).at[:, -1].set(a[:, 1])   # periodic in x
        if grid == "v":
            a = a.at[-2, :].set(0.0)                          # no flow through the north wall
        return a

    def interior(values):
        return jnp.zeros((ny + 2, nx + 2), dtype).at[1:-1, 1:-1].set(values)

    def tendencies(h, u, v):
        hc = boundaries(jnp.pad(h[1:-1, 1:-1], 1, "edge"), "h")
        fe = boundaries(interior(0.5 * (hc[1:-1, 1:-1] + hc[1:-1, 2:]) * u[1:-1, 1:-1]), "u")
        fn = boundaries(interior(0.5 * (hc[1:-1, 1:-1] + hc[2:, 1:-1]) * v[1:-1, 1:-1]), "v")
        dh = -((fe[1:-1, 1:-1] - fe[1:-1, :-2]) / dx + (fn[1:-1, 1:-1] - fn[:-2, 1:-1]) / dy)
        q = interior((coriolis[1:-1, 1:-1] + (v[1:-1, 2:] - v[1:-1, 1:-1]) / dx - (u[2:, 1:-1] - u[1:-1, 1:-1]) / dy)
                     / (0.25 * (hc[1:-1, 1:-1] + hc[1:-1, 2:] + hc[2:, 1:-1] + hc[2:, 2:])))
        q = boundaries(q, "h")
        du = (-GRAVITY * (h[1:-1, 2:] - h[1:-1, 1:-1]) / dx
              + 0.5 * (q[1:-1, 1:-1] * 0.5 * (fn[1:-1, 1:-1] + fn[1:-1, 2:])
                       + q[:-2, 1:-1] * 0.5 * (fn[:-2, 1:-1] + fn[:-2, 2:])))
        dv = (-GRAVITY * (h[2:, 1:-1] - h[1:-1, 1:-1]) / dy
              - 0.5 * (q[1:-1, 1:-1] * 0.5 * (fe[1:-1, 1:-1] + fe[2:, 1:-1])
                       + q[1:-1, :-2] * 0.5 * (fe[1:-1, :-2] + fe[2:, :-2])))
        ke = boundaries(interior(0.5 * (0.5 * (u[1:-1, 1:-1] ** 2 + u[1:-1, :-2] ** 2)
                                        + 0.5 * (v[1:-1, 1:-1] ** 2 + v[:-2, 1:-1] ** 2))), "h")
        du = du - (ke[1:-1, 2:] - ke[1:-1, 1:-1]) / dx
        dv = dv - (ke[2:, 1:-1] - ke[1:-1, 1:-1]) / dy
        return dh, du, dv

    def friction(a):
        fe = boundaries(interior(viscosity * (a[1:-1, 2:] - a[1:-1, 1:-1]) / dx), "u")
        fn = boundaries(interior(viscosity * (a[2:, 1:-1] - a[1:-1, 1:-1]) / dy), "v")
        return a.at[1:-1, 1:-1].add(dt * ((fe[1:-1, 1:-1] - fe[1:-1, :-2]) / dx + (fn[1:-1, 1:-1] - fn[:-2, 1:-1]) / dy))

    def step(_, state):
        h, u, v, dh_old, du_old, dv_old = state
        dh, du, dv = tendencies(h, u, v)
        h = boundaries(h.at[1:-1, 1:-1].add(dt * (AB_A * dh + AB_B * dh_old)), "h")
        u = boundaries(u.at[1:-1, 1:-1].add(dt * (AB_A * du + AB_B * du_old)), "u")
        v = boundaries(v.at[1:-1, 1:-1].add(dt * (AB_A * dv + AB_B * dv_old)), "v")
        u, v = boundaries(friction(u), "u"), boundaries(friction(v), "v")
        return h, u, v, dh, du, dv

    @jax.jit
    def first_step(h, u, v):
        dh, du, dv = tendencies(h, u, v)   # forward Euler, then AB2 from the stored tendencies
        return (boundaries(h.at[1:-1, 1:-1].add(dt * dh), "h"), boundaries(u.at[1:-1, 1:-1].add(dt * du), "u"),
                boundaries(v.at[1:-1, 1:-1].add(dt * dv), "v"), dh, du, dv)

    @jax.jit
    def run(state, n_steps):
        return jax.lax.fori_loop(0, n_steps, step, state)

    zero = jnp.zeros((ny + 2, nx + 2), dtype)
    state = first_step(boundaries(jnp.asarray(h0, dtype), "h"), boundaries(jnp.asarray(u0, dtype), "u"),
                       boundaries(zero, "v"))
    return state, run, float(dt)


def measure_peer(nx: int, ny: int, precision: str, steps: int, repeats: int) -> dict:
    import jax
    import numpy as np

    state, run, dt = peer_model(nx, ny, precision)
    state = jax.block_until_ready(run(state, steps))           # compile and warm up (same n_steps: no retrace)
    mass_before = float(np.asarray(state[0][1:-1, 1:-1], dtype=np.float64).sum())
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        state = jax.block_until_ready(run(state, steps))
        seconds.append(time.perf_counter() - started)
    h = np.asarray(state[0][1:-1, 1:-1], dtype=np.float64)
    rates = [nx * ny * steps / s for s in seconds]
    return {"side": "JAX peer (AB2)", "precision": precision, "dt": dt, "steps": steps, "rates": rates,
            "finite": bool(np.isfinite(h).all()), "relative_mass_drift": abs(float(h.sum()) - mass_before) / mass_before,
            "device": str(jax.devices()[0])}


def measure_ours(nx: int, ny: int, precision: str, steps: int, repeats: int, extra: list[str]) -> dict:
    rates, dt, checksums = [], None, set()
    with tempfile.TemporaryDirectory(prefix="swe-peer-") as directory:
        for index in range(repeats):
            summary = os.path.join(directory, f"summary{index}.json")
            command = [sys.executable, "-m", "apps.stencil", "--model", "swe", "--nx", str(nx), "--ny", str(ny),
                       "--steps", str(steps), "--precision", precision, "--no-plot", "--snapshot-every", "0",
                       "--output", os.path.join(directory, f"run{index}"), "--summary", summary, *extra]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
            match = re.search(r"dt ([0-9.eE+-]+) s", result.stdout)
            dt = float(match.group(1)) if match else None
            with open(summary) as handle:
                record = json.load(handle)
            rates.append(float(record["throughput"]))
            checksums.add(record["checksum"])
    return {"side": "ours (SSP-RK3)", "precision": precision, "dt": dt, "steps": steps, "rates": rates,
            "repeat_checksums_equal": len(checksums) == 1, "backend": record["backend"], "graph": record.get("graph")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nx", type=int, default=3600)
    parser.add_argument("--ny", type=int, default=1800)
    parser.add_argument("--precisions", default="fp32,fp64", help="comma-separated: fp32, fp64 [fp32,fp64]")
    parser.add_argument("--steps", type=int, default=2000, help="time steps per repeat, each side [2000]")
    parser.add_argument("--repeats", type=int, default=3)
    side = parser.add_mutually_exclusive_group()
    side.add_argument("--peer-only", action="store_true")
    side.add_argument("--ours-only", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("app_args", nargs="*", help="after --: extra apps.stencil arguments (e.g. --no-graph)")
    args = parser.parse_args(argv)
    rows = []
    for precision in args.precisions.split(","):
        pair = {}
        if not args.ours_only:
            pair["peer"] = measure_peer(args.nx, args.ny, precision, args.steps, args.repeats)
        if not args.peer_only:
            pair["ours"] = measure_ours(args.nx, args.ny, precision, args.steps, args.repeats, args.app_args)
        rows.append(pair)
    print(f"\nshallow-water channel {args.nx} x {args.ny}, {args.steps} steps per repeat, {args.repeats} repeats")
    print(f"{'side':<16} {'prec':<5} {'dt s':>6} {'min cell-steps/s':>17} {'median':>10} {'sim s per wall s':>17} check")
    for pair in rows:
        for record in pair.values():
            low, median = min(record["rates"]), statistics.median(record["rates"])
            simulated = median / (args.nx * args.ny) * (record["dt"] or float("nan"))
            check = (f"finite {record['finite']}, mass drift {record['relative_mass_drift']:.1e}" if "finite" in record
                     else f"repeats equal {record['repeat_checksums_equal']}, graph {record['graph']}")
            print(f"{record['side']:<16} {record['precision']:<5} {record['dt'] or float('nan'):>6.1f} {low:>17.3e} "
                  f"{median:>10.3e} {simulated:>17.0f} {check}")
        if len(pair) == 2:
            ours, peer = pair["ours"], pair["peer"]
            per_cell = statistics.median(ours["rates"]) / statistics.median(peer["rates"])
            solution = per_cell * (ours["dt"] or float("nan")) / peer["dt"]
            print(f"  {ours['precision']}: ours / peer per cell-step {per_cell:.2f}x, time to solution {solution:.2f}x "
                  f"(medians)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"nx": args.nx, "ny": args.ny, "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
