"""What the two shallow-water models share: fields, the overlapped SSP-RK3 step, time, diagnostics bookkeeping.

Each of the three stages of a step (on a rank without remote neighbours the exchange is one local
gather and the interior and rim are one update)::

    start exchanging the stage input (h, u, v packed in one message per neighbour, corners included)
    update the interior of the stage output          (overlaps the exchange)
    wait: the neighbours' ghosts, then the physical ones (channel walls, or the mirrors beyond the poles)
    update the rim
    finish the stage                                 (lat-lon: the polar filter; channel: nothing)

The physical ghosts are boundary conditions of the exchange (:mod:`hpcgpu.halo.boundaries`), so the
step never asks where its tile lies. A grid's model (:class:`apps.stencil.channel.model.SweModel`,
:class:`apps.stencil.sphere.model.LatLonModel`) builds its decomposition, tile parameters and initial
state, and provides :meth:`ShallowWaterModel.physical_boundary_conditions`,
:meth:`ShallowWaterModel.local_diagnostics` and, where it has one, :meth:`ShallowWaterModel.finish_stage`.
"""

from __future__ import annotations

import math

import numpy as np

import hpcgpu
from apps.stencil.checkpointing import C_GRID_ATTRIBUTES, StencilModel
from apps.stencil.swe_scheme.stage import SSP_RK3_STAGES, shallow_water_stage
from hpcgpu.errors import ConfigurationError
from hpcgpu.halo.regions import split_owned
from hpcgpu.simulation.triggers import AtEnd, Periodic, Trigger

SECONDS_PER_DAY = 86400.0


class ShallowWaterModel(StencilModel):
    """Base of the shallow-water models: state (h, u, v), two work triples, the overlapped SSP-RK3 step.

    A subclass sets ``comm``, ``arch``, ``dtype``, ``grid``, ``tile`` (with ``tile.metrics``), ``dt``,
    ``init_name``, ``diagnostic_names`` and ``initial_diagnostics``, calls :meth:`_allocate_fields`
    and :meth:`_set_steps`, and provides :meth:`physical_boundary_conditions` and :meth:`local_diagnostics`.
    ``increment`` and ``filtered_rows`` (the polar filter's rows) stay empty on a grid without a filter.
    """

    halo_exchanges_per_step = 3   # one per SSP-RK3 stage
    unit = "cell-updates/s"
    replicated_units = {"step": "1", "time": "s", "dt": "s"}   # checkpoint attributes (StencilModel)
    increment: tuple = ()
    filtered_rows = None

    # ------------------------------------------------------------------ setup helpers
    def _check_extents(self, width: int, labels: tuple[str, str]) -> None:
        """Refuse a decomposition that leaves a rank fewer than ``width`` cells along an axis."""
        for axis, label in enumerate(labels):
            if self.grid.min_extent(axis) < width:
                raise ConfigurationError(
                    f"{self.name}: every rank needs at least {width} cells along {label} (the stencil reach), but "
                    f"{self.grid} gives {self.grid.min_extent(axis)}; use fewer ranks along {label} (--dims) or a larger grid"
                )

    def _allocate_fields(self, width: int, reach: int, overlap: bool) -> None:
        """State and work triples with ``width`` ghosts; the interior / rim split for a stencil ``reach``."""
        make = lambda name: hpcgpu.Field(self.grid, self.arch, halo_width=width, dtype=self.dtype, name=name,  # noqa: E731
                                         attributes=C_GRID_ATTRIBUTES[name])
        self.state = [make("h"), make("u"), make("v")]
        self.work = [[make("h"), make("u"), make("v")] for _ in range(2)]
        shape = self.grid.local_shape
        self.interior, self.rim = split_owned(shape, (width, width), (reach, reach))
        # --no-overlap: exchange, then one update of every owned cell (bitwise the same result).
        self.overlap = bool(overlap)
        self.owned = (width, width + shape[0], width, width + shape[1])
        self.boundary_conditions = self.physical_boundary_conditions()
        for triple in self.work:
            self.exchange(triple)   # plans the stage exchanges now, not in the first (timed) step

    def _set_steps(self, days: float) -> None:
        """``--days`` of steps at ``dt``; the work and the minimum traffic of one step."""
        self.steps = max(1, math.ceil(days * SECONDS_PER_DAY / self.dt))
        self.step_index = 0
        self.updates_per_step = self.grid.global_shape[0] * self.grid.global_shape[1]
        # A step reads and writes h, u and v at least once (hpcgpu.app.plausibility).
        self.min_bytes_per_update = 6 * np.dtype(self.dtype).itemsize

    # ------------------------------------------------------------------ what a grid provides
    def physical_boundary_conditions(self) -> tuple:
        """The boundary conditions of (h, u, v) beyond the non-periodic edges, for the halo exchange."""
        raise NotImplementedError

    def finish_stage(self, timers, out, base, stage, a: float, b: float) -> None:
        """Complete a stage after every owned cell is updated (the lat-lon polar filter); returns None."""

    def local_diagnostics(self) -> dict:
        """Local sums of ``diagnostic_names`` over the owned cells (ghosts filled)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ stepping
    def exchange(self, fields) -> None:
        """Fill all ghosts of (h, u, v): one exchange for all three, physical boundaries included."""
        hpcgpu.exchange_halos(fields, boundary_conditions=self.boundary_conditions)

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
        metrics, increment, filtered = self.tile.metrics, self.increment, self.filtered_rows
        for (a, b), source, target in zip(SSP_RK3_STAGES, inputs, outputs):
            base, stage, out = ([f.data for f in fs] for fs in (self.state, source, target))
            pending = hpcgpu.exchange_halos(source, wait=False, boundary_conditions=self.boundary_conditions)
            # Nothing to overlap without remote neighbours (one rank): one update of every owned cell.
            overlap = self.overlap and not pending.is_local
            with timers.phase("compute"):
                if overlap and self.interior is not None:
                    shallow_water_stage(out, base, stage, a, b, self.dt, metrics, self.interior, increment, filtered)
            with timers.phase("communication"):
                pending.wait()   # the neighbours' ghosts, then the walls / pole mirrors
            with timers.phase("compute"):
                for region in (self.rim if overlap else [self.owned]):
                    shallow_water_stage(out, base, stage, a, b, self.dt, metrics, region, increment, filtered)
            self.finish_stage(timers, out, base, stage, a, b)
        self.step_index += 1

    def prepare(self) -> None:
        """GPU: compile and load the stage kernels a step launches (one launch per region of the
        step, for the first stage, whose base is its input, and for the others), writing only the
        scratch triples, so that the timed loop does not compile them."""
        if not self.arch.is_gpu:
            return
        state, first, second = ([f.data for f in fields] for fields in (self.state, self.work[0], self.work[1]))
        regions = [self.owned] + ([self.interior] if self.interior is not None else []) + list(self.rim)
        for source, target in ((state, first), (first, second)):
            for region in regions:
                shallow_water_stage(target, state, source, 0.0, 1.0, self.dt, self.tile.metrics, region,
                                    self.increment, self.filtered_rows)
        self.arch.synchronize()

    @property
    def default_steps(self) -> int:
        """The steps of ``--days`` at the time step ``dt``."""
        return self.steps

    def set_final_step(self, final_step: int) -> None:
        """``--steps`` wins over ``--days``: the header describes the steps that will run."""
        self.steps = final_step

    def snapshot_trigger(self) -> Trigger:
        """When :meth:`after_step` writes a snapshot: every ``snapshot_every`` steps (the initial state
        included) and at the final step; never with ``snapshot_every`` 0 or unset."""
        every = self.snapshot_every or 0
        return Periodic(every) | AtEnd() if every else Periodic(0)

    def progress_note(self) -> str:
        return f"day {self.time / SECONDS_PER_DAY:.2f}"

    def after_restore(self) -> None:
        self.exchange(self.state)

    # ------------------------------------------------------------------ diagnostics
    def _diagnostics_now(self) -> dict:
        """Collective: the global integrals now (ghosts refilled first)."""
        self.exchange(self.state)
        local = self.local_diagnostics()
        return {name: self.comm.allreduce(float(local[name]), "sum") for name in self.diagnostic_names}

    def _integrals_and_changes(self) -> dict:
        """Collective: days, dt, init, and each integral now with its change relative to the start."""
        now = self._diagnostics_now()
        result = {"days": self.time / SECONDS_PER_DAY, "dt_seconds": self.dt, "init": self.init_name}
        for name in self.diagnostic_names:
            start = self.initial_diagnostics[name]
            result[name] = now[name]
            result[f"{name}_relative_change"] = (now[name] - start) / abs(start) if start else float("nan")
        return result


__all__ = ["SECONDS_PER_DAY", "ShallowWaterModel"]
