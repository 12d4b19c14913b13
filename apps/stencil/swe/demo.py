"""Single-rank run of the shallow-water channel (NumPy + Numba) with a vorticity picture.

    python -m apps.stencil.swe.demo --days 20 --output swe_vorticity.png

Runs the default unstable jet on one tile covering the whole channel (x ghosts by wrapping, walls
by :func:`fill_channel_boundaries`), prints the integral diagnostics once per simulated day and the
measured throughput, and saves relative vorticity ``zeta / f0`` at four times (a quarter, half,
three quarters and all of the run) as one PNG. It is a look at the numerics, not the app: no MPI, no
checkpoints, no GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from apps.stencil.swe import (
    INITIAL_CONDITIONS,
    SWEParameters,
    fill_channel_boundaries,
    fill_initial_state,
    local_diagnostics,
    make_initial_condition,
    ssp_rk3_step,
    stable_dt,
    tile_parameters,
)

SECONDS_PER_DAY = 86400.0
# The flow (and with it the stable dt) changes slowly; re-deriving dt every few dozen steps is enough.
DT_UPDATE_INTERVAL = 50


def _parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="python -m apps.stencil.swe.demo",
        description="Single-rank shallow-water channel run; saves a PNG of relative vorticity.",
    )
    parser.add_argument("--days", type=float, default=20.0, help="simulated days (default 20)")
    parser.add_argument("--output", default="swe_vorticity.png", help="PNG path (default swe_vorticity.png)")
    parser.add_argument("--initial", choices=sorted(INITIAL_CONDITIONS), default="jet", help="initial condition")
    parser.add_argument("--nx", type=int, default=360, help="cells in x (default 360)")
    parser.add_argument("--ny", type=int, default=180, help="cells in y (default 180)")
    parser.add_argument("--cfl", type=float, default=0.8, help="CFL number, 1 = stability limit (default 0.8)")
    parser.add_argument("--quiet", action="store_true", help="print only the final summary")
    return parser.parse_args(argv)


def _fill_ghosts_fn(halo_width):
    w = halo_width

    def fill(fields):
        for field in fields:
            field[:, :w] = field[:, -2 * w : -w]  # periodic x
            field[:, -w:] = field[:, w : 2 * w]
        fill_channel_boundaries(*fields, w, at_south=True, at_north=True)

    return fill


def relative_vorticity(h, u, v, params) -> np.ndarray:
    """zeta at the corners of the owned cells, shape (n_rows, n_cols), 1/s (ghosts must be filled)."""
    w = params.halo_width
    rows = slice(w, h.shape[0] - w)
    columns = slice(w, h.shape[1] - w)
    return (v[rows, columns] - v[rows, w - 1 : h.shape[1] - w - 1]) / params.dx - (
        u[rows, columns] - u[w - 1 : h.shape[0] - w - 1, columns]
    ) / params.dy


def main(argv=None) -> int:
    args = _parse_arguments(argv)
    parameters = SWEParameters(nx=args.nx, ny=args.ny)
    w = parameters.halo_width
    shape = (parameters.ny + 2 * w, parameters.nx + 2 * w)
    state = [np.zeros(shape) for _ in range(3)]
    work_1 = [np.zeros(shape) for _ in range(3)]
    work_2 = [np.zeros(shape) for _ in range(3)]
    fill_initial_state(make_initial_condition(args.initial, parameters), *state, parameters, (0, 0), w)
    params = tile_parameters(parameters, 0, parameters.ny, w)
    region = (w, w + parameters.ny, w, w + parameters.nx)
    fill = _fill_ghosts_fn(w)
    fill(state)
    initial = local_diagnostics(*state, params)

    end_time = args.days * SECONDS_PER_DAY
    snapshot_times = [end_time * k / 4 for k in (1, 2, 3, 4)]
    snapshots = []
    time_now, n_steps, next_report = 0.0, 0, SECONDS_PER_DAY
    dt = stable_dt(*state, params, cfl=args.cfl)
    compute_seconds = 0.0
    timed_steps = 0
    while time_now < end_time * (1 - 1e-12):
        if n_steps % DT_UPDATE_INTERVAL == 0:
            fill(state)
            dt = stable_dt(*state, params, cfl=args.cfl)
        step_dt = min(dt, snapshot_times[len(snapshots)] - time_now)
        start = time.perf_counter()
        ssp_rk3_step(state, work_1, work_2, step_dt, params, region, fill)
        elapsed = time.perf_counter() - start
        if n_steps > 0:  # the first step includes the JIT compilation
            compute_seconds += elapsed
            timed_steps += 1
        time_now += step_dt
        n_steps += 1
        if time_now >= snapshot_times[len(snapshots)] * (1 - 1e-12):
            fill(state)
            snapshots.append((time_now, relative_vorticity(*state, params)))
        if time_now >= next_report and not args.quiet:
            fill(state)
            d = local_diagnostics(*state, params)
            print(
                f"day {time_now / SECONDS_PER_DAY:6.2f}  step {n_steps:6d}  dt {dt:6.1f} s  "
                f"mass drift {d['mass'] / initial['mass'] - 1:+.2e}  "
                f"energy {d['energy'] / initial['energy']:.6f}  "
                f"enstrophy {d['potential_enstrophy'] / initial['potential_enstrophy']:.6f}  "
                f"max|v| {np.abs(state[2]).max():5.2f} m/s",
                flush=True,
            )
            next_report += SECONDS_PER_DAY

    rate = parameters.nx * parameters.ny * timed_steps / max(compute_seconds, 1e-12)
    print(
        f"{n_steps} SSP-RK3 steps on {parameters.ny} x {parameters.nx} cells in {compute_seconds:.1f} s "
        f"(excluding the first, JIT-compiling step): {rate / 1e6:.2f} M cell-updates/s "
        f"({3 * rate / 1e6:.2f} M stage cell-updates/s), numba threads: {_numba_threads()}"
    )
    _save_png(args.output, snapshots, parameters, args.initial)
    print(f"saved relative vorticity to {args.output}")
    return 0


def _numba_threads() -> int:
    import numba

    return numba.get_num_threads()


def _save_png(path, snapshots, parameters, initial_name) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    extent = (0, parameters.length_x / 1e3, 0, parameters.length_y / 1e3)
    limit = max(float(np.abs(z).max()) for _, z in snapshots) / parameters.coriolis_f0
    figure, axes = plt.subplots(len(snapshots), 1, figsize=(9, 2.4 * len(snapshots)), sharex=True)
    for axis, (time_now, zeta) in zip(np.atleast_1d(axes), snapshots):
        image = axis.imshow(
            zeta / parameters.coriolis_f0, origin="lower", extent=extent, cmap="RdBu_r",
            vmin=-limit, vmax=limit, aspect="equal", interpolation="nearest",
        )  # fmt: skip
        axis.set_title(f"{initial_name}: relative vorticity / f0, day {time_now / SECONDS_PER_DAY:.1f}")
        axis.set_ylabel("y [km]")
        figure.colorbar(image, ax=axis, shrink=0.9)
    np.atleast_1d(axes)[-1].set_xlabel("x [km]")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
