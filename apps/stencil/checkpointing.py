"""What a checkpoint of an ``apps.stencil`` model holds, and how a model continues from one."""

from __future__ import annotations

from hpcgpu.errors import ConfigurationError


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


class CheckpointedModel:
    """Mixin for the stencil models: state fields (owned cells) plus replicated scalars.

    A model provides ``name``, ``grid``, ``dtype``, ``fields``, ``step_index``, ``time`` and the hooks
    ``_extra_state()`` (more replicated values), ``_restore_extra(replicated)`` (check / adopt them) and
    ``after_restore()`` (fill ghost cells).
    """

    def checkpoint_state(self) -> dict:
        """``{"fields": {name: Field}, "replicated": {...}}`` for the checkpoint manager."""
        return {"fields": {f.name: f for f in self.fields},
                "replicated": {"model": self.name, "global_shape": list(self.grid.global_shape),
                               "precision": self.dtype, "step": self.step_index, "time": self.time,
                               **self._extra_state()}}

    def restore(self, replicated: dict, step: int, options: dict) -> None:
        """Continue from a loaded checkpoint (fields already filled); refuse an incompatible one."""
        expected = {"model": self.name, "global_shape": list(self.grid.global_shape), "precision": self.dtype}
        found = {key: (list(replicated[key]) if key == "global_shape" else replicated[key]) for key in expected}
        if found != expected:
            raise ConfigurationError(
                f"the checkpoint holds {found} but this run is {expected}; restart with the same --model, "
                "grid size and --precision (any number of ranks works)"
            )
        self.step_index = int(step)
        self._restore_extra(replicated)
        self.after_restore()
