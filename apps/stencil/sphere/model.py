"""The shallow-water model on a latitude-longitude grid as an ``apps.stencil`` model (``--grid latlon``).

The step is the core's (:class:`apps.stencil.swe_scheme.model.ShallowWaterModel`): exchange each
stage's input while the interior updates (the ghost rows beyond the poles -- mirror, zero-length
pole faces -- are the exchange's boundary conditions), update the rim; then this model finishes the
stage with the polar filter (allgather the polar rows' increments in the row communicator, FFT,
combine).

On a GPU (``--backend cupy``) the stages run as the core's per-row-metrics CUDA kernel
(:mod:`apps.stencil.swe_scheme.stage_gpu`) on the compute stream while the halos travel (NCCL or
host-staged MPI); the polar filter stays on the device when each rank holds whole latitude circles
(``--dims N,1``, the default for GPUs) and is staged through the host otherwise
(:mod:`apps.stencil.sphere.polar_filter_gpu`).

CUDA graphs: with whole circles on every rank the filter works in persistent buffers with
pre-planned cuFFT transforms, so a step never synchronises with the host and the driver replays
windows of steps as CUDA graphs (``--graph``, the GPU default; bitwise the eager result).
:meth:`LatLonModel.capturable` keeps the steps at which :meth:`LatLonModel.after_step` records the
energy history or writes a snapshot out of the inside of a window (a window may end on one). With
longitude split across ranks the filter goes through the host every stage: no graphs, and
``--graph`` is refused (:attr:`LatLonModel.graph_unsupported`).

The time step is fixed for the run: ``dt`` (checked against the limit) or ``cfl`` times the limit
of the initial state with the zonal spacing of the filter cutoff latitude.
"""

from __future__ import annotations

import math

import numpy as np

import hpcgpu
from apps.stencil.swe_scheme.model import SECONDS_PER_DAY, ShallowWaterModel
from apps.stencil.sphere.diagnostics import DIAGNOSTIC_NAMES, error_norms, local_diagnostics, local_error_sums
from apps.stencil.sphere.initial_conditions import initial_owned_state, make_initial_condition
from apps.stencil.sphere.parameters import DEFAULT_FILTER_LATITUDE_DEG, SphereParameters, tile_parameters
from apps.stencil.sphere.polar_filter import filter_and_combine, local_gather, make_filter_plan, row_gather
from apps.stencil.sphere.timestep import DEFAULT_CFL, stability_rate
from hpcgpu.errors import ConfigurationError
from hpcgpu.halo import free_slip_channel_walls

OPTION_DEFAULTS = {"nx": 128, "ny": 64, "init": "williamson2", "alpha": 0.0, "days": None, "dt": None,
                   "cfl": DEFAULT_CFL, "dims": None, "precision": "fp64",
                   "filter_latitude": DEFAULT_FILTER_LATITUDE_DEG}  # fmt: skip
"""Options the model reads (``getattr(options, name, default)``); filter_latitude in degrees."""


def _option(options, name):
    value = getattr(options, name, None)
    return OPTION_DEFAULTS[name] if value is None else value


class LatLonModel(ShallowWaterModel):
    """Nonlinear shallow water on the sphere (Williamson test cases 2, 5, 6), lat-lon C-grid."""

    name = "latlon"
    diagnostic_names = DIAGNOSTIC_NAMES
    default_shape = {"nx": 128, "ny": 64}
    #: Full-size arrays of the model's precision it certainly holds per cell (state, stages, tendencies, metrics):
    #: a lower bound of its memory, checked before the state is built (apps.stencil.app.memory_estimate).
    arrays_per_cell = 10
    default_days = 5.0
    #: None where the steps can be captured as CUDA graphs (whole latitude circles on every rank); set
    #: per run to the reason when longitude is split across ranks (the host-staged polar filter).
    graph_unsupported = None

    def __init__(self, comm, arch, options):
        self.comm, self.arch = comm, arch
        self.dtype = "float32" if _option(options, "precision") == "fp32" else "float64"
        nx, ny = int(_option(options, "nx")), int(_option(options, "ny"))
        self.init_name = _option(options, "init")
        alpha = float(_option(options, "alpha")) if self.init_name == "williamson2" else 0.0
        self.parameters = SphereParameters(nx=nx, ny=ny, alpha=alpha,
                                           filter_latitude=math.radians(float(_option(options, "filter_latitude"))))
        dims = _option(options, "dims")
        if dims is None and arch.is_gpu:
            # Latitude bands keep whole circles on each GPU, so the polar filter never leaves the device.
            dims = (0, 1)
        self.grid = hpcgpu.Decomposition(comm, (ny, nx), dims=dims, periodic=(False, True))
        self._check_graph_option(getattr(options, "graph", None))
        width = 1
        self._check_extents(width, ("latitude", "longitude"))
        self.initial = make_initial_condition(self.init_name, self.parameters)
        self._allocate_fields(width, 1, getattr(options, "overlap", True))
        self.increment = [arch.zeros(f.data.shape, dtype=self.dtype) for f in self.state]
        start, shape = self.grid.local_start, self.grid.local_shape
        self.tile = tile_parameters(self.parameters, start[0], shape[0], start[1], shape[1], width,
                                    self.initial.topography, xp=arch.xp, dtype=np.dtype(self.dtype))
        self.plan = make_filter_plan(self.parameters, start[0], shape[0], start[1], shape[1], width)
        self.filtered_rows = self.plan.filtered_rows_like(self.state[0].data)
        # Ranks of one latitude band, ordered by longitude: the polar filter's whole circles.
        self.row_comm = comm.split(color=self.grid.coords[0], key=self.grid.coords[1])
        self.gather = row_gather(self.row_comm, shape[1])
        h, u, v = initial_owned_state(self.initial, self.parameters, start, shape)
        self.exact_h = h.copy()
        for field, values in zip(self.state, (h, u, v)):
            field.interior[...] = arch.from_host(values.astype(self.dtype))
        self.exchange(self.state)
        self.dt = self._choose_dt(options)
        days = _option(options, "days")
        self._set_steps(self.default_days if days is None else float(days))
        self.initial_diagnostics = self._diagnostics_now()
        self.history = [self._history_entry(self.initial_diagnostics)]
        self.snapshot_every = getattr(options, "snapshot_every", None)
        self.snapshot_dtype = getattr(options, "snapshot_precision", "float32")
        # --restart given: an existing snapshot file of this configuration is continued even from step 0
        # (--restart latest before the first checkpoint: the job before was killed without writing one).
        self.continuing = getattr(options, "restart", None) is not None
        self.snapshots = None

    def _check_graph_option(self, graph) -> None:
        """Set :attr:`graph_unsupported` when longitude is split across ranks, and refuse ``--graph``
        (``graph`` True) there on a GPU. Depends only on the decomposition's dims, so it raises the
        same :class:`ConfigurationError` on every rank, before any collective of the model."""
        ranks_along_longitude = self.grid.dims[1]
        if ranks_along_longitude == 1:
            return
        self.graph_unsupported = (
            f"with {ranks_along_longitude} ranks along longitude the polar filter gathers latitude circles "
            "through the host in every stage, which a CUDA graph cannot hold")
        if graph and self.arch.is_gpu:
            raise ConfigurationError(
                f"--graph does not apply to --grid latlon with --dims {self.grid.dims[0]},{ranks_along_longitude}: "
                f"{self.graph_unsupported}. Split latitude only (--dims N,1, the GPU default) or run without --graph."
            )

    def _choose_dt(self, options) -> float:
        h, u, v = (f.data for f in self.state)
        rate = self.comm.allreduce(stability_rate(h, u, v, self.tile, self.parameters.filter_latitude), "max")
        limit = 1.0 / rate
        dt, cfl = getattr(options, "dt", None), float(_option(options, "cfl"))
        if dt is not None:
            if not (0 < dt <= limit):
                raise ConfigurationError(f"--dt {dt} s is outside (0, {limit:.4g}] s, the stability limit of this state")
            return float(dt)
        if not 0 < cfl <= 1:
            raise ConfigurationError(f"--cfl must be in (0, 1]; got {cfl}")
        return cfl * limit

    def physical_boundary_conditions(self) -> tuple:
        """The mirrors beyond the poles, for the halo exchange."""
        # The pole faces have zero length, so the mirror ghosts only ever meet exact zero weights;
        # the channel's wall mirror (v odd, h and u even) is the right fill.
        return free_slip_channel_walls()

    def finish_stage(self, timers, out, base, stage, a: float, b: float) -> None:
        """The polar filter: filter the polar rows' increments over whole circles and combine; returns None."""
        with timers.phase("communication"):
            filter_and_combine(out, base, stage, self.increment, a, b, self.plan, self.gather)

    # ------------------------------------------------------------------ stepping
    def prepare(self) -> None:
        """GPU with whole circles: build the polar filter's persistent buffers and cuFFT plans and load
        its kernels (one filter pass into scratch arrays), so that neither happens inside the timed loop
        or a CUDA graph capture (a run restarted from a checkpoint captures its first window at once);
        the stage kernels first (:meth:`ShallowWaterModel.prepare`)."""
        super().prepare()
        if not self.arch.is_gpu or self.gather is not local_gather or not self.plan.rows:
            return
        scratch = [self.arch.zeros(f.data.shape, dtype=self.dtype) for f in self.state]
        fields = [f.data for f in self.state]
        filter_and_combine(scratch, fields, fields, self.increment, 1.0, 1.0, self.plan, self.gather)
        self.arch.synchronize()

    def capturable(self, n_steps: int = 1) -> bool:
        """True on a GPU with whole latitude circles on every rank (the filter stays on the device), if
        no step strictly inside the window records the history or writes a snapshot: :meth:`after_step`
        runs after the whole replay and sees only its last step, so a window may end on such a step."""
        if self.graph_unsupported is not None or not self.arch.is_gpu:
            return False
        return not any(self._output_due(self.step_index + k) for k in range(1, n_steps))

    def _output_due(self, step: int) -> bool:
        """Whether :meth:`after_step` records a history entry or may write a snapshot after ``step``
        (of a run ending at ``self.steps``; snapshots whether or not there is an output directory)."""
        every = self.snapshot_every
        return step % self._history_every(self.steps) == 0 or bool(every and step % every == 0)

    @staticmethod
    def _history_every(total_steps: int) -> int:
        """Steps between history entries: about 50 per run."""
        return max(1, total_steps // 50)

    def set_final_step(self, final_step: int) -> None:
        """Also fixes the default snapshot interval (final step / 50) before any window is chosen, on a
        restart too (where no :meth:`after_step` comes before the first step)."""
        super().set_final_step(final_step)
        if self.snapshot_every is None:
            self.snapshot_every = max(1, final_step // 50)

    # ------------------------------------------------------------------ diagnostics
    def local_diagnostics(self) -> dict:
        return local_diagnostics(*(f.data for f in self.state), self.tile)

    def _history_entry(self, values: dict) -> dict:
        return {"days": self.time / SECONDS_PER_DAY, **values}

    def after_step(self, timers, output, total_steps) -> None:
        """Record the energy / enstrophy history (about 50 entries per run) and write snapshots.

        Snapshots (``OUTPUT/latlon.nc``, :mod:`apps.stencil.sphere.output`) every ``snapshot_every``
        steps, the initial state first; ``None`` means about 50 per run, 0 none, and no ``output``
        directory none either. The first call opens the file: at step 0 (a fresh run) an existing
        file is refused, after a restart the file of the continued run is appended to. Collective.
        """
        every = self._history_every(total_steps)
        if self.step_index != 0 and (self.step_index % every == 0 or self.step_index == total_steps):
            # (the initial entry is recorded at construction)
            with timers.phase("io"):
                self.history.append(self._history_entry(self._diagnostics_now()))
        self._write_snapshot(timers, output, total_steps)

    def _write_snapshot(self, timers, output, total_steps) -> None:
        if output is None:
            return
        every = self.snapshot_every
        if every is None:
            every = self.snapshot_every = max(1, total_steps // 50)
        if not every:
            return
        from pathlib import Path

        from apps.stencil.sphere.output import SNAPSHOT_NAME, Snapshots

        with timers.phase("io"):
            if self.snapshots is None:
                # Step 0: a fresh run (an existing file is refused); later: the first step after a restart.
                self.snapshots = Snapshots(self, Path(output) / SNAPSHOT_NAME, restarted=self.step_index != 0 or self.continuing)
            if self.snapshot_trigger()(self.step_index, total_steps):
                self.snapshots.write(self)

    def height_errors(self) -> dict:
        """Williamson l1, l2, linf of h against the initial h (the exact solution of case 2). Collective."""
        sums = local_error_sums(self.state[0].data, self.exact_h, self.tile)
        reduced = {key: self.comm.allreduce(value, "max" if key.startswith("max") else "sum") for key, value in sums.items()}
        return error_norms(reduced)

    def diagnostics(self) -> dict:
        """Collective: integrals now and at the start, their relative changes, and the case-2 errors."""
        result = self._integrals_and_changes()
        norms = self.height_errors()
        prefix = "height_error" if self.init_name == "williamson2" else "height_change"
        for key, value in norms.items():
            result[f"{prefix}_{key}"] = value
        return result

    def finish(self, output, summary, plot: bool = True) -> None:
        """Collective: close the snapshots; rank 0 writes the energy / potential-enstrophy history to
        ``latlon_history.json`` and (``plot``) maps of the final h and vorticity to ``latlon_final.png``."""
        if self.snapshots is not None:
            self.snapshots.close()
        if output is None:
            return
        from pathlib import Path

        if self.comm.rank == 0:
            import json

            from hpcgpu.output.atomic import write_atomic

            path = Path(output) / "latlon_history.json"
            write_atomic(path, json.dumps({"init": self.init_name, "dt_seconds": self.dt, "history": self.history}, indent=1))
        if plot:
            from apps.stencil.sphere.output import PLOT_NAME, plot_state

            plot_state(self, Path(output) / PLOT_NAME)

    # ------------------------------------------------------------------ checkpoint / restart
    def _extra_state(self) -> dict:
        return {"dt": self.dt, "init": self.init_name, "alpha": self.parameters.alpha,
                "filter_latitude": self.parameters.filter_latitude}

    def _restore_extra(self, replicated: dict) -> None:
        for key, mine in (("init", self.init_name), ("alpha", self.parameters.alpha),
                          ("filter_latitude", self.parameters.filter_latitude)):
            if replicated[key] != mine:
                theirs = replicated[key].item() if hasattr(replicated[key], "item") else replicated[key]
                raise ConfigurationError(f"the checkpoint was written with {key}={theirs!r}, not {mine!r}")
        self.dt = float(replicated["dt"])

    def describe(self) -> str:
        p = self.parameters
        return (f"shallow water on the sphere, lat-lon C-grid {p.nx} x {p.ny} ({math.degrees(p.dlon):.3g} x "
                f"{math.degrees(p.dlat):.3g} deg), init {self.init_name} (alpha {p.alpha:g}), polar filter "
                f"poleward of {math.degrees(p.filter_latitude):g} deg, dt {self.dt:.1f} s, {self.steps} steps = "
                f"{self.steps * self.dt / SECONDS_PER_DAY:.2f} days, {self.dtype}")
