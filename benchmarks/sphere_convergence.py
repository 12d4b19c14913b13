"""Williamson case 2 convergence at day 5 and the case-6 drift of the latlon model.

Case 2 (steady zonal geostrophic flow; the initial h is exact at all times) for alpha = 0 and a tilted
alpha at three resolutions: the normalised l1, l2, linf errors of h (Williamson et al. 1992, eq. 82-84,
area-weighted) and the observed orders log2(e_coarse / e_fine). Case 6 (Rossby-Haurwitz wave 4): the
eastward drift of the wavenumber-4 pattern of h at 45N after 5 days against Haurwitz's nondivergent
speed. Runs through :class:`apps.stencil.sphere.model.LatLonModel` (the app's model) on one rank::

    python benchmarks/sphere_convergence.py                    # CPU, ~1.5 min on 2 idle cores
    python benchmarks/sphere_convergence.py --backend cupy     # the same on a GPU
    python benchmarks/sphere_convergence.py --quick            # 2 coarse resolutions, 1 day

Prints Markdown tables last; ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
import types


SECONDS_PER_DAY = 86400.0
TILTED_ALPHA = math.pi / 2 - 0.05


class _Timers:
    def phase(self, name):
        return contextlib.nullcontext()


def run_model(comm, arch, init, nx, ny, days, alpha=0.0, cfl=0.8):
    """Run the model for ``days``; returns it (state at the end)."""
    from apps.stencil.sphere.model import LatLonModel

    options = types.SimpleNamespace(nx=nx, ny=ny, init=init, alpha=alpha, days=days, dt=None, cfl=cfl, dims=None,
                                    precision="fp64", filter_latitude=60.0, snapshot_every=0)  # fmt: skip
    model = LatLonModel(comm, arch, options)
    for _ in range(model.steps):
        model.step(_Timers())
    return model


def case2_table(comm, arch, resolutions, days, alphas):
    rows = []
    for alpha in alphas:
        previous = None
        for nx, ny in resolutions:
            started = time.perf_counter()
            model = run_model(comm, arch, "williamson2", nx, ny, days, alpha)
            errors = model.height_errors()
            row = {"alpha": alpha, "nx": nx, "ny": ny, "dt": model.dt, "steps": model.steps, **errors,
                   "seconds": time.perf_counter() - started}
            for norm in ("l1", "l2", "linf"):
                row[f"order_{norm}"] = math.log2(previous[norm] / errors[norm]) if previous else None
            rows.append(row)
            previous = errors
            print(f"  case 2 alpha={alpha:.4f} {nx}x{ny}: l2 {errors['l2']:.3e} ({row['seconds']:.1f} s)", flush=True)
    return rows


def case6_drifts(comm, arch, resolutions, days):
    from apps.stencil.sphere.diagnostics import rossby_haurwitz_drift

    rows = []
    for nx, ny in resolutions:
        started = time.perf_counter()
        model = run_model(comm, arch, "williamson6", nx, ny, days)
        drift = rossby_haurwitz_drift(model)
        rows.append({"nx": nx, "ny": ny, "seconds": time.perf_counter() - started, **drift})
        print(f"  case 6 {nx}x{ny}: {drift['measured_deg_per_day']:.3f} deg/day ({rows[-1]['seconds']:.1f} s)", flush=True)
    return rows


def _order(value):
    return "" if value is None else f"{value:.2f}"


def markdown(case2, case6, days):
    lines = [f"Williamson case 2, normalised height errors at day {days:g} (CFL 0.8, polar filter at 60 deg):", "",
             "| alpha | grid (nx x ny) | dt (s) | l1 | l2 | linf | order l1 | order l2 | order linf |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in case2:
        lines.append(f"| {r['alpha']:.4f} | {r['nx']} x {r['ny']} | {r['dt']:.1f} | {r['l1']:.3e} | {r['l2']:.3e} | "
                     f"{r['linf']:.3e} | {_order(r['order_l1'])} | {_order(r['order_l2'])} | {_order(r['order_linf'])} |")
    if case6:
        r0 = case6[0]
        lines += ["", f"Williamson case 6, drift of the wavenumber-4 h pattern at 45N over {days:g} days "
                  f"(Haurwitz nondivergent {r0['haurwitz_deg_per_day']:.3f} deg/day):", "",
                  "| grid (nx x ny) | measured (deg/day) | measured / Haurwitz |", "| --- | --- | --- |"]
        for r in case6:
            lines.append(f"| {r['nx']} x {r['ny']} | {r['measured_deg_per_day']:.3f} | {r['ratio_to_haurwitz']:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("numpy", "cupy"), default="numpy")
    parser.add_argument("--quick", action="store_true", help="64x32 and 128x64 for 1 day (a smoke test)")
    parser.add_argument("--days", type=float, default=None, help="simulated days [5]")
    parser.add_argument("--json", default=None, help="write the numbers to this file")
    parser.add_argument("--no-case6", action="store_true")
    options = parser.parse_args(argv)
    import hpcgpu

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend=options.backend)
    days = options.days if options.days is not None else (1.0 if options.quick else 5.0)
    resolutions = [(64, 32), (128, 64)] if options.quick else [(64, 32), (128, 64), (256, 128)]
    started = time.perf_counter()
    case2 = case2_table(comm, arch, resolutions, days, (0.0, TILTED_ALPHA))
    case6 = [] if options.no_case6 else case6_drifts(comm, arch, resolutions if not options.quick else resolutions[:1], days)
    total = time.perf_counter() - started
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"days": days, "backend": arch.name, "case2": case2, "case6": case6, "seconds": total}, handle, indent=1)
    print()
    print(markdown(case2, case6, days))
    print(f"\n({total:.0f} s on {arch.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
