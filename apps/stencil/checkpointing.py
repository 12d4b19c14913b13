"""The ``apps.stencil`` models' common part of the :class:`hpcgpu.simulation.Model` interface: what a
checkpoint holds, how a model continues from one, the checksum, NaN check and summary of a grid model."""

from __future__ import annotations

import numpy as np

from hpcgpu.app.checksum import fields_checksum
from hpcgpu.app.progress import format_rate
from hpcgpu.decomposition.nodes import header_line
from hpcgpu.errors import ConfigurationError
from hpcgpu.simulation import Model


#: Units and grid location of the shallow-water fields (channel and lat-lon), stored with each
#: checkpoint's datasets. They hold the C-grid values themselves: u and v on faces, unlike the cell-centre
#: averages the netCDF snapshots write.
C_GRID_ATTRIBUTES = {
    "h": {"units": "m", "long_name": "fluid depth", "grid_location": "cell centre (i + 1/2, j + 1/2)"},
    "u": {"units": "m s-1", "long_name": "eastward velocity (x on the channel)",
          "grid_location": "west cell face (i, j + 1/2), Arakawa C-grid"},
    "v": {"units": "m s-1", "long_name": "northward velocity (y on the channel)",
          "grid_location": "south cell face (i + 1/2, j), Arakawa C-grid"},
}


class StencilModel(Model):
    """Base of the stencil models: state fields (owned cells) on a decomposed grid, plus replicated scalars.

    A model provides ``name``, ``grid``, ``dtype``, ``fields``, ``step_index``, ``time`` and the hooks
    ``_extra_state()`` (more replicated values), ``_restore_extra(replicated)`` (check / adopt them) and
    ``after_restore()`` (fill ghost cells); this class turns them into the simulation interface.
    """

    unit = "cell-updates/s"
    #: ``units`` attributes of the checkpoint's replicated values: ``time`` counts iterations here
    #: ("1", dimensionless); models with a physical clock override it (shallow water: seconds).
    replicated_units = {"step": "1", "time": "1"}
    #: The step this job started from: 0, or the checkpoint's step after a restart (set by :meth:`restore`).
    first_step = 0

    def checkpoint_state(self) -> dict:
        """``{"fields": {name: Field}, "replicated": {...}, "units": {...}}`` for the checkpoint manager."""
        return {"fields": {f.name: f for f in self.fields},
                "replicated": {"model": self.name, "global_shape": list(self.grid.global_shape),
                               "precision": self.dtype, "step": self.step_index, "time": self.time,
                               **self._extra_state()},
                "units": {"replicated": dict(self.replicated_units)}}

    def load_checkpoint(self, control) -> int | None:
        """Collective: fill the fields from ``--restart`` and continue from its step (None: fresh start)."""
        restored = control.restore(fields={f.name: f for f in self.fields})
        if restored is None:
            return None
        self.restore(restored.replicated, restored.step)
        return restored.step

    def restore(self, replicated: dict, step: int) -> None:
        """Continue from a loaded checkpoint (fields already filled); refuse an incompatible one."""
        expected = {"model": self.name, "global_shape": list(self.grid.global_shape), "precision": self.dtype}
        found = {key: (list(replicated[key]) if key == "global_shape" else replicated[key]) for key in expected}
        if found != expected:
            raise ConfigurationError(
                f"the checkpoint holds {found} but this run is {expected}; restart with the same --model, "
                "grid size and --precision (any number of ranks works)"
            )
        self.step_index = self.first_step = int(step)
        self._restore_extra(replicated)
        self.after_restore()

    # ------------------------------------------------------------------ the rest of the simulation interface
    #: Halo exchanges of :attr:`fields` per time step (3 for the SSP-RK3 shallow-water step).
    halo_exchanges_per_step = 1

    def header_lines(self, comm, arch) -> list[str]:
        lines = [f"backend: {arch.name} ({arch.reason})", f"ranks: {comm.size} on {comm.n_nodes} node(s); {self.grid}"]
        # On several (real or HPCGPU_SIMULATE_NODES) nodes: halo bytes that cross nodes, chosen vs naive layout.
        traffic = header_line(self.grid, halo_width=self.fields[0].halo_width,
                              itemsize=sum(np.dtype(f.dtype).itemsize for f in self.fields),
                              exchanges_per_step=self.halo_exchanges_per_step)
        return lines + ([f"nodes: {traffic}"] if traffic else [])

    def decomposition(self) -> dict:
        return {"dims": list(self.grid.dims), "global_shape": list(self.grid.global_shape),
                "periodic": list(self.grid.periodic)}

    def finite_arrays(self) -> list:
        return [f.interior for f in self.fields]

    def nan_message(self, step: int, ranks: list[int]) -> str:
        return (f"the {self.name} state holds NaN/Inf at step {step} (ranks {ranks}); expected finite values. "
                "The time step is probably unstable: lower --dt or --cfl, or add --viscosity.")

    def checksum(self) -> str:
        """Collective: the fields' owned cells in global index order."""
        return fields_checksum(self.comm, self.fields)

    def summary_extra(self, simulation) -> dict:
        return {"model": self.name, "precision": self.dtype, "updates_per_step": self.updates_per_step,
                "graph": simulation.graph_used}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        return (f"{steps} steps in {wall:.3f} s: {format_rate(throughput, self.unit)} "
                f"({format_rate(throughput / n_ranks, 'per rank')})")


#: The earlier name of :class:`StencilModel`.
CheckpointedModel = StencilModel
