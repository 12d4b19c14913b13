"""A model whose state is a set of Fields on one grid, advanced by stencils into spare buffers.

Most grid models update every field from the old values of all of them: the new values go to a
second set of fields, which then becomes the current one (ping-pong). :class:`FieldModel` owns both
sets and implements everything of :class:`~hpcgpu.simulation.Model` that follows from the fields
alone -- checkpoints, restarts on any rank count, the checksum, the NaN check, the decomposition in
the summary, CUDA graph replay of the steps, and the mean of every field as a diagnostic (with the
same bits on any rank count, :func:`hpcgpu.reductions.global_mean`). A subclass sets the initial
state and writes :meth:`~Model.step`::

    class Heat(FieldModel):
        name = "heat"

        def __init__(self, comm, arch, options):
            grid = hpcgpu.Decomposition(comm, (options.ny, options.nx), dims=options.dims, periodic=True)
            super().__init__(comm, arch, grid, names=("u",), halo_width=heat.halo_width)
            self.current["u"].set_from_global(lambda y, x: np.sin(2 * np.pi * x / options.nx))

        def step(self, timers):
            self.advance(heat, {"alpha": 0.1}, timers)   # exchange, interior, rim; then swap

``model.state`` maps each name to a :class:`CurrentField`: a handle that always refers to the current
buffer. Give it to operations that keep fields (``NetCDFOutput(..., fields=model.state)``), which would
otherwise keep writing one of the two buffers.
"""

from __future__ import annotations

import math

from hpcgpu.app.checksum import fields_checksum
from hpcgpu.errors import ConfigurationError
from hpcgpu.field import Field
from hpcgpu.reductions import global_mean
from hpcgpu.simulation.model import Model


class CurrentField:
    """The current buffer of one field of a :class:`FieldModel`: every attribute is the current Field's."""

    __slots__ = ("_model", "_name")

    def __init__(self, model: "FieldModel", name: str):
        self._model, self._name = model, name

    def __getattr__(self, attribute):
        return getattr(self._model.current[self._name], attribute)

    def __repr__(self) -> str:
        return f"CurrentField({self._model.current[self._name]!r})"


class FieldModel(Model):
    """A :class:`~hpcgpu.simulation.Model` over named Fields with two buffers each (see the module docstring).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    grid : hpcgpu.Decomposition
    names : sequence of str
        The fields of the state, in a fixed order (checkpoints, checksum, diagnostics).
    halo_width : int or tuple of int
        Ghost cells per axis (a stencil's ``halo_width``, or the largest of the model's stencils).
    dtype : str
        ``"float64"`` (default) or ``"float32"``.
    attributes : dict of str to dict, optional
        Per name, what the values mean (``{"u": {"units": "1"}}``), stored with checkpoints.

    Attributes
    ----------
    current : dict of str to Field
        The state after the last step.
    spare : dict of str to Field
        Where the next step writes (its values are not part of the state).
    state : dict of str to CurrentField
        Handles to the current buffers, for operations that keep fields.
    """

    unit = "cell-updates/s"

    #: The stencils :meth:`advance` runs: :meth:`prepare` compiles them for both buffer orders before
    #: the clock starts (otherwise the first step compiles them).
    stencils: tuple = ()

    def __init__(self, comm, arch, grid, names, halo_width=1, dtype: str = "float64", attributes: dict | None = None):
        names = tuple(names)
        if not names or len(set(names)) != len(names):
            raise ConfigurationError(f"a FieldModel needs distinct field names; got {names!r}")
        self.comm, self.arch, self.grid = comm, arch, grid
        attributes = dict(attributes or {})
        self.current, self.spare = (
            {name: Field(grid, arch, halo_width=halo_width, dtype=dtype, name=name, attributes=attributes.get(name))
             for name in names} for _ in range(2))
        self.state = {name: CurrentField(self, name) for name in names}
        self.updates_per_step = math.prod(grid.global_shape)
        self.step_index = 0

    # ------------------------------------------------------------------ stepping helpers
    def swap(self) -> None:
        """Make the spare buffers current (after a step wrote them); returns None."""
        self.current, self.spare = self.spare, self.current

    def advance(self, kernel, params=None, timers=None, boundary_conditions=None) -> None:
        """One step of ``kernel``: its outputs, in the order of its fields, go to the spare buffers of
        those fields; then :meth:`swap` and count the step. Returns None.

        For a stencil that returns one new value per field it reads (``return u_new, v_new`` for
        fields ``u, v``). Other shapes of step call ``kernel.update`` directly, then :meth:`swap`.
        """
        if kernel.n_outputs != len(kernel.fields):
            raise ConfigurationError(
                f"advance() needs a stencil returning one value per field it reads; {kernel.definition.name!r} "
                f"reads {len(kernel.fields)} and returns {kernel.n_outputs}. Call kernel.update(...) and swap().")
        outputs = [self.spare[name] for name in kernel.fields]
        kernel.update(outputs=outputs, inputs={name: self.current[name] for name in kernel.fields}, params=params,
                      timers=timers, boundary_conditions=boundary_conditions)
        self.swap()
        self.step_index += 1

    def prepare(self) -> None:
        """Compile :attr:`stencils` for both buffer orders (no cell changes)."""
        for kernel in self.stencils:
            for old, new in ((self.current, self.spare), (self.spare, self.current)):
                if all(name in old for name in kernel.fields):
                    kernel.bind([new[name] for name in kernel.fields][:kernel.n_outputs],
                                {name: old[name] for name in kernel.fields})

    # ------------------------------------------------------------------ Model, from the fields
    def describe(self) -> str:
        shape = " x ".join(map(str, self.grid.global_shape))
        return f"{self.name} on {shape} cells ({', '.join(self.current)})"

    def decomposition(self) -> dict:
        return {"dims": list(self.grid.dims), "global_shape": list(self.grid.global_shape),
                "periodic": list(self.grid.periodic)}

    def checkpoint_state(self) -> dict:
        return {"fields": dict(self.current), "replicated": {"step": self.step_index}}

    def load_checkpoint(self, control) -> int | None:
        restored = control.restore(fields=dict(self.current))
        if restored is None:
            return None
        self.step_index = restored.step
        return restored.step

    def checksum(self) -> str:
        return fields_checksum(self.comm, list(self.current.values()))

    def finite_arrays(self) -> list:
        return [field.interior for field in self.current.values()]

    def diagnostics(self) -> dict:
        return {f"mean_{name}": global_mean(field) for name, field in self.current.items()}

    def capturable(self, n_steps: int) -> bool:
        """Steps made of stencil updates never wait for the host: any even number can be a CUDA graph."""
        return n_steps % 2 == 0

    def graph_key(self):
        """Which buffers are current: a graph replays the addresses it captured."""
        return tuple(id(field) for field in self.current.values())
