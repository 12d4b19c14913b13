"""The shallow-water channel as an ``apps.stencil`` model: the core's overlapped SSP-RK3 step on the channel.

The step (:class:`apps.stencil.swe_scheme.model.ShallowWaterModel`) exchanges each stage's input
while the interior updates (the wall ghost rows are the exchange's boundary conditions), then
updates the rim. The time step is
fixed for the run: ``--dt`` (checked against the stability limit) or ``--cfl`` times the limit of
the initial state (a global minimum, identical on every rank).
"""

from __future__ import annotations

import math

import numpy as np

import hpcgpu
from apps.stencil.swe_scheme.model import SECONDS_PER_DAY, ShallowWaterModel
from apps.stencil.channel.diagnostics import DIAGNOSTIC_NAMES, local_diagnostics
from apps.stencil.channel.initial_conditions import fill_initial_state, make_initial_condition
from apps.stencil.channel.parameters import SWEParameters, tile_parameters
from apps.stencil.channel.timestep import check_dt, stability_rate
from hpcgpu.errors import ConfigurationError
from hpcgpu.halo import free_slip_channel_walls


class SweModel(ShallowWaterModel):
    """Nonlinear shallow water on a beta-plane channel (periodic in x, free-slip walls in y)."""

    name = "swe"
    default_shape = {"nx": 360, "ny": 180}
    #: Full-size arrays of the model's precision it certainly holds per cell (h, u, v, their stages and tendencies):
    #: a lower bound of its memory, checked before the state is built (apps.stencil.app.memory_estimate).
    arrays_per_cell = 6
    default_days = 6.0
    diagnostic_names = DIAGNOSTIC_NAMES
    #: What --viscosity and --hyperviscosity mean when left unset: SWEParameters' defaults.
    unset_option_values = {name: SWEParameters.__dataclass_fields__[name].default
                           for name in ("viscosity", "hyperviscosity")}

    def __init__(self, comm, arch, options):
        self.comm, self.arch = comm, arch
        self.dtype = "float32" if options.precision == "fp32" else "float64"
        dissipation = {name: value for name, value in (("viscosity", options.viscosity),
                                                        ("hyperviscosity", options.hyperviscosity)) if value is not None}
        self.parameters = SWEParameters(nx=options.nx, ny=options.ny, dx=options.dx, dy=options.dx, **dissipation)
        self.init_name = options.init
        width = self.parameters.halo_width
        self.grid = hpcgpu.Decomposition(comm, (options.ny, options.nx), dims=options.dims, periodic=(False, True))
        self._check_extents(width, ("y", "x"))
        self.tile = tile_parameters(self.parameters, self.grid.local_start[0], self.grid.local_shape[0],
                                    halo_width=width, xp=arch.xp, dtype=np.dtype(self.dtype))
        self._allocate_fields(width, self.tile.stencil_reach, getattr(options, "overlap", True))
        self._fill_initial_state()
        self.exchange(self.state)
        self.initial_h = self.arch.to_host(self.state[0].interior).copy()
        self.dt = self._choose_dt(options)
        self._set_steps(options.days if options.days is not None else self.default_days)
        self.initial_diagnostics = self._diagnostics_now()
        self.snapshot_every = options.snapshot_every
        self.snapshot_dtype = getattr(options, "snapshot_precision", "float32")
        # --restart given: an existing snapshot file of this configuration is continued even from step 0
        # (--restart latest before the first checkpoint: the job before was killed without writing one).
        self.continuing = getattr(options, "restart", None) is not None
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

    def physical_boundary_conditions(self) -> tuple:
        """Free-slip walls at y = 0 and y = Ly (h, u mirrored even; v odd about the wall face, 0 on it)."""
        return free_slip_channel_walls()

    # ------------------------------------------------------------------ stepping
    def capturable(self, n_steps: int = 1) -> bool:
        """No snapshot step strictly inside the window: :meth:`after_step` runs after the whole replay and
        writes the state of its last step, so a window may end on a snapshot step."""
        every = self.snapshot_every
        return not (every and any((self.step_index + k) % every == 0 for k in range(1, n_steps)))

    def set_final_step(self, final_step: int) -> None:
        """Also fixes the default snapshot interval (``--steps`` / 50) before any window is chosen, on a
        restart too (where no :meth:`after_step` comes before the first step)."""
        super().set_final_step(final_step)
        if self.snapshot_every is None:
            self.snapshot_every = max(1, final_step // 50)

    # ------------------------------------------------------------------ diagnostics and output
    def local_diagnostics(self) -> dict:
        h, u, v = (f.data for f in self.state)
        return local_diagnostics(h, u, v, self.tile)

    def diagnostics(self) -> dict:
        """Collective: integrals now and at the start, their relative changes, and the height error."""
        result = self._integrals_and_changes()
        h = self.arch.to_host(self.state[0].interior)
        squared = self.comm.allreduce(float(np.sum((h.astype(np.float64) - self.initial_h) ** 2)), "sum")
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
        from apps.stencil.channel.output import Snapshots

        with timers.phase("io"):
            if self.snapshots is None:
                self.snapshots = Snapshots(self, output / "swe.nc", restarted=self.step_index != 0 or self.continuing)
            if self.snapshot_trigger()(self.step_index, total_steps):
                self.snapshots.write(self)

    def finish(self, output, summary, plot: bool = True) -> None:
        """Close the snapshot file and draw the final state (rank 0)."""
        if self.snapshots is not None:
            self.snapshots.close()
        if plot:
            from apps.stencil.channel.output import plot_state

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

    def describe(self) -> str:
        p = self.parameters
        return (f"shallow water, beta-plane channel {p.nx} x {p.ny} cells of {p.dx / 1e3:g} km, init {self.init_name}, "
                f"dt {self.dt:.1f} s, {self.steps} steps = {self.steps * self.dt / SECONDS_PER_DAY:.2f} days, {self.dtype}")
