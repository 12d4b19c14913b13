"""The shallow-water channel as an ``apps.stencil`` model: SSP-RK3 with overlapped halo exchange.

Each of the three stages of a step::

    start exchanging the stage input (h, u, v packed in one message per neighbour, corners included)
    update the interior of the stage output        (overlaps the exchange)
    wait; fill the wall ghost rows (tiles at the walls)
    update the rim

The time step is fixed for the run: ``--dt`` (checked against the stability limit) or ``--cfl``
times the limit of the initial state (a global minimum, identical on every rank).
"""

from __future__ import annotations

import math

import numpy as np

import hpcgpu
from apps.stencil.checkpointing import C_GRID_ATTRIBUTES, StencilModel
from apps.stencil.swe.boundaries import fill_channel_boundaries
from apps.stencil.swe.diagnostics import DIAGNOSTIC_NAMES, local_diagnostics
from apps.stencil.swe.initial_conditions import fill_initial_state, make_initial_condition
from apps.stencil.swe.parameters import SWEParameters, tile_parameters
from apps.stencil.swe.stage import SSP_RK3_STAGES, swe_stage
from apps.stencil.swe.timestep import check_dt, stability_rate
from hpcgpu.errors import ConfigurationError
from hpcgpu.halo.regions import split_owned

SECONDS_PER_DAY = 86400.0


class SweModel(StencilModel):
    """Nonlinear shallow water on a beta-plane channel (periodic in x, free-slip walls in y)."""

    halo_exchanges_per_step = 3   # one per SSP-RK3 stage

    name = "swe"
    unit = "cell-updates/s"
    default_shape = {"nx": 360, "ny": 180}
    default_days = 6.0

    def __init__(self, comm, arch, options):
        self.comm, self.arch = comm, arch
        self.dtype = "float32" if options.precision == "fp32" else "float64"
        dissipation = {name: value for name, value in (("viscosity", options.viscosity),
                                                        ("hyperviscosity", options.hyperviscosity)) if value is not None}
        self.parameters = SWEParameters(nx=options.nx, ny=options.ny, dx=options.dx, dy=options.dx, **dissipation)
        self.init_name = options.init
        width = self.parameters.halo_width
        self.grid = hpcgpu.Decomposition(comm, (options.ny, options.nx), dims=options.dims, periodic=(False, True))
        for axis, name in enumerate(("y", "x")):
            if self.grid.min_extent(axis) < width:
                raise ConfigurationError(
                    f"swe: every rank needs at least {width} cells along {name} (the stencil reach), but "
                    f"{self.grid} gives {self.grid.min_extent(axis)}; use fewer ranks along {name} (--dims) or a larger grid"
                )
        make = lambda name: hpcgpu.Field(self.grid, arch, halo_width=width, dtype=self.dtype, name=name,  # noqa: E731
                                         attributes=C_GRID_ATTRIBUTES[name])
        self.state = [make("h"), make("u"), make("v")]
        self.work = [[make("h"), make("u"), make("v")] for _ in range(2)]
        self.tile = tile_parameters(self.parameters, self.grid.local_start[0], self.grid.local_shape[0],
                                    halo_width=width, xp=arch.xp, dtype=np.dtype(self.dtype))
        reach = self.tile.stencil_reach
        self.interior, self.rim = split_owned(self.grid.local_shape, (width, width), (reach, reach))
        # --no-overlap: exchange, then one update of every owned cell (bitwise the same result).
        self.overlap = bool(getattr(options, "overlap", True))
        ny, nx = self.grid.local_shape
        self.owned = (width, width + ny, width, width + nx)
        self._fill_initial_state()
        self.exchange(self.state)
        self.initial_h = self.arch.to_host(self.state[0].interior).copy()
        self.dt = self._choose_dt(options)
        days = options.days if options.days is not None else self.default_days
        self.steps = max(1, math.ceil(days * SECONDS_PER_DAY / self.dt))
        self.step_index = 0
        self.updates_per_step = options.nx * options.ny
        # A step reads and writes h, u and v at least once (hpcgpu.app.plausibility).
        self.min_bytes_per_update = 6 * np.dtype(self.dtype).itemsize
        self.initial_diagnostics = self._diagnostics_now()
        self.snapshot_every = options.snapshot_every
        self.snapshots = None

    # ------------------------------------------------------------------ setup
    def _fill_initial_state(self) -> None:
        initial = make_initial_condition(self.init_name, self.parameters)
        host = [np.zeros(f.data.shape, dtype=self.dtype) for f in self.state]
        fill_initial_state(initial, *host, self.parameters, self.grid.local_start, self.parameters.halo_width)
        for field, values in zip(self.state, host):
            field.data[...] = self.arch.from_host(values)

    def _choose_dt(self, options) -> float:
        h, u, v = (f.data for f in self.state)
        rate = self.comm.allreduce(float(stability_rate(h, u, v, self.tile)), "max")
        limit = 1.0 / rate
        if options.dt is not None:
            check_dt(options.dt, limit)
            return float(options.dt)
        if not 0 < options.cfl <= 1:
            raise ConfigurationError(f"--cfl must be in (0, 1]; got {options.cfl}")
        return options.cfl * limit

    def exchange(self, fields) -> None:
        """Fill the ghosts of (h, u, v): one exchange for all three, then the walls."""
        hpcgpu.exchange_halos(fields)
        self.fill_walls(fields)

    def fill_walls(self, fields) -> None:
        h, u, v = (f.data for f in fields)
        fill_channel_boundaries(h, u, v, self.parameters.halo_width, self.tile.at_south, self.tile.at_north)

    # ------------------------------------------------------------------ stepping
    @property
    def fields(self):
        return self.state

    @property
    def time(self) -> float:
        """Model time in seconds."""
        return self.step_index * self.dt

    def step(self, timers) -> None:
        inputs = (self.state, self.work[0], self.work[1])
        outputs = (self.work[0], self.work[1], self.state)
        for (a, b), source, target in zip(SSP_RK3_STAGES, inputs, outputs):
            base, stage, out = ([f.data for f in fs] for fs in (self.state, source, target))
            pending = hpcgpu.exchange_halos(source, wait=False)
            with timers.phase("compute"):
                if self.overlap and self.interior is not None:
                    swe_stage(out, base, stage, a, b, self.dt, self.tile, self.interior)
            with timers.phase("communication"):
                pending.wait()
            with timers.phase("compute"):
                self.fill_walls(source)
                for region in (self.rim if self.overlap else [self.owned]):
                    swe_stage(out, base, stage, a, b, self.dt, self.tile, region)
        self.step_index += 1

    @property
    def default_steps(self) -> int:
        """The steps of ``--days`` (default 6) at the time step ``dt``."""
        return self.steps

    def set_final_step(self, final_step: int) -> None:
        """``--steps`` wins over ``--days``: the header describes the steps that will run."""
        self.steps = final_step

    def capturable(self, n_steps: int = 1) -> bool:
        return not (self.snapshot_every and any((self.step_index + k) % self.snapshot_every == 0 for k in range(1, n_steps + 1)))

    def progress_note(self) -> str:
        return f"day {self.time / SECONDS_PER_DAY:.2f}"

    # ------------------------------------------------------------------ diagnostics and output
    def _diagnostics_now(self) -> dict:
        self.exchange(self.state)
        h, u, v = (f.data for f in self.state)
        local = local_diagnostics(h, u, v, self.tile)
        return {name: self.comm.allreduce(float(local[name]), "sum") for name in DIAGNOSTIC_NAMES}

    def diagnostics(self) -> dict:
        """Collective: integrals now and at the start, their relative changes, and the height error."""
        now = self._diagnostics_now()
        h = self.arch.to_host(self.state[0].interior)
        squared = self.comm.allreduce(float(np.sum((h.astype(np.float64) - self.initial_h) ** 2)), "sum")
        result = {"days": self.time / SECONDS_PER_DAY, "dt_seconds": self.dt, "init": self.init_name}
        for name in DIAGNOSTIC_NAMES:
            result[name] = now[name]
            start = self.initial_diagnostics[name]
            result[f"{name}_relative_change"] = (now[name] - start) / abs(start) if start else float("nan")
        result["height_l2_change_m"] = math.sqrt(squared / (self.parameters.nx * self.parameters.ny))
        if self.init_name == "geostrophic":
            # The balanced jet is an exact steady solution: any change is the scheme's error.
            result["height_l2_error_m"] = result["height_l2_change_m"]
        return result

    def after_step(self, timers, output, total_steps) -> None:
        """Write a snapshot every ``snapshot_every`` steps (and the initial state first).

        The first call opens ``OUTPUT/swe.nc`` (:class:`apps.stencil.snapshots.SnapshotFile`): at step
        0 (a fresh run) an existing file is refused; later (the first step after a restart) the file of
        the run this one continues is appended to. Collective.
        """
        every = self.snapshot_every
        if every is None:
            every = self.snapshot_every = max(1, total_steps // 50)
        if not every:
            return
        from apps.stencil.swe.output import Snapshots

        with timers.phase("io"):
            if self.snapshots is None:
                self.snapshots = Snapshots(self, output / "swe.nc", restarted=self.step_index != 0)
            if self.step_index % every == 0 or self.step_index == total_steps:
                self.snapshots.write(self)

    def finish(self, output, summary, plot: bool = True) -> None:
        """Close the snapshot file and draw the final state (rank 0)."""
        if self.snapshots is not None:
            self.snapshots.close()
        if plot:
            from apps.stencil.swe.output import plot_state

            plot_state(self, output / "swe_final.png")


    # ------------------------------------------------------------------ checkpoint / restart (StencilModel)
    def _extra_state(self) -> dict:
        return {"dt": self.dt, "init": self.init_name}

    def _restore_extra(self, replicated: dict) -> None:
        if replicated["init"] != self.init_name:
            raise ConfigurationError(f"the checkpoint was written with --init {replicated['init']}, not {self.init_name}")
        # The time step of the run continues unchanged (recomputing it from the restored state
        # would change the trajectory).
        self.dt = float(replicated["dt"])

    def after_restore(self) -> None:
        self.exchange(self.state)

    def describe(self) -> str:
        p = self.parameters
        return (f"shallow water, beta-plane channel {p.nx} x {p.ny} cells of {p.dx / 1e3:g} km, init {self.init_name}, "
                f"dt {self.dt:.1f} s, {self.steps} steps = {self.steps * self.dt / SECONDS_PER_DAY:.2f} days, {self.dtype}")
