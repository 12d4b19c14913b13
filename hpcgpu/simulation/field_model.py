"""A model whose state is a set of Fields on one grid, advanced by stencils: :class:`FieldModel`.

A model names its fields, options and stencils, sets the initial state and writes :meth:`~Model.step`;
hpcgpu does the rest -- the command line, the architecture, checkpoints and restarts on any rank
count, the checksum, the NaN check, CF netCDF output of the fields, the mean of every field as a
diagnostic (the same bits on any rank count), CUDA graph replay of the steps::

    @hpcgpu.stencil
    def heat(u, alpha):
        return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])

    class Heat(hpcgpu.FieldModel):
        \"\"\"2D heat diffusion on a periodic square.\"\"\"
        name, version, default_steps = "heat", "1.0", 100
        fields, stencils = ("u",), (heat,)
        options = (hpcgpu.Option("n", int, 64, "cells per side", minimum=1),
                   hpcgpu.Option("alpha", float, 0.2, "kappa dt / dx^2", positive=True, maximum=0.25))

        def __init__(self, comm, arch, options):
            n = options.n
            super().__init__(comm, arch, hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True))
            self.current["u"].set_from_global(lambda y, x: np.sin(2 * np.pi * x / n))

        def step(self, timers):
            self.advance(heat, timers=timers)     # alpha: the option of that name

    if __name__ == "__main__":
        raise SystemExit(Heat.main())

Three kinds of fields, each a :class:`~hpcgpu.Field` with the halo the stencils need:

- ``fields``: the *state*, two buffers each. A step reads the current values (``current``) and
  writes the new ones into the spare buffers; :meth:`advance` ends the step by making them current.
  Checkpointed, written to the netCDF output, part of the checksum.
- ``constant_fields``: read, never written (coefficients, masks, topography). One buffer each, set
  in ``__init__``; not checkpointed (``__init__`` makes them again on a restart).
- ``work_fields``: intermediate stages of one step (one buffer each, not part of the state).

:meth:`stage` runs a stencil into work fields or into the new values of state fields;
:meth:`advance` runs one more and ends the step. Within a step a state field always reads its value
at the start of the step, so several stages need no buffer juggling (SSP-RK3)::

    def step(self, timers):
        self.stage(euler, into="u1", timers=timers)                            # u1 = u + dt L(u)
        self.stage(blend, into="u2", read={"v": "u1"}, params={"a": 0.75}, timers=timers)
        self.advance(blend, read={"v": "u2"}, params={"a": 1 / 3}, timers=timers)

A stencil's scalar parameters come from ``params=``, then from :attr:`params`, then from the model's
options of the same name. Boundary conditions of non-periodic axes are :attr:`boundary_conditions`.

On a GPU the driver replays runs of steps as CUDA graphs, which repeat the kernel launches they
captured with the parameters they captured, and run no Python in between. A model whose step reads
values on the host (:func:`hpcgpu.global_max` for an adaptive time step) or gives its stencils
parameters that change from step to step after the second step sets ``graph_unsupported = "why"``
(the steps then run eagerly).

``model.state`` maps each state field to a :class:`CurrentField`: a handle that always refers to the
current buffer, for operations that keep fields (``NetCDFOutput(..., fields=model.state)``).

Before anything is written, :meth:`check_step` runs one step in which the stencils are bound and
checked but nothing is computed: a stencil that reads a field the model does not have, returns the
wrong number of values, needs a parameter nobody gives, or indexes beyond the halo ends the job with
one line naming the user's file and line.
"""

from __future__ import annotations

import difflib
import math

from hpcgpu.app.checksum import fields_checksum
from hpcgpu.errors import ConfigurationError, HpcgpuError, replicated
from hpcgpu.field import Field
from hpcgpu.locations import caller_site
from hpcgpu.reductions import global_mean
from hpcgpu.simulation.model import Model
from hpcgpu.simulation.netcdf_output import NetCDFOutput
from hpcgpu.simulation.triggers import AtEnd, Periodic
from hpcgpu.stencils.kernel import checking_only


class CurrentField:
    """The current buffer of one field of a :class:`FieldModel`: every attribute is the current Field's."""

    __slots__ = ("_model", "_name")

    def __init__(self, model: "FieldModel", name: str):
        self._model, self._name = model, name

    def __getattr__(self, attribute):
        return getattr(self._model.current[self._name], attribute)

    def __repr__(self) -> str:
        return f"CurrentField({self._model.current[self._name]!r})"


class FieldSet(dict):
    """Fields by name; a missing name raises :class:`ConfigurationError` naming the user's line and the names there are."""

    def __init__(self, fields, model_name: str, kind: str):
        super().__init__(fields)
        self.model_name, self.kind = model_name, kind

    def __missing__(self, name):
        raise replicated(ConfigurationError(
            f"{_at(caller_site())}{self.model_name} has no {self.kind} {name!r}{_did_you_mean(name, self)}; "
            f"its {self.kind}s are {', '.join(self) or '(none)'}"))


def _at(where: str | None) -> str:
    return f"{where}: " if where else ""


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _stencil_text(kernel) -> str:
    where = kernel.definition.site
    return f"stencil {kernel.definition.name!r}" + (f" ({where})" if where else "")


class FieldModel(Model):
    """A :class:`~hpcgpu.simulation.Model` over named Fields advanced by stencils (see the module docstring).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    grid : hpcgpu.Decomposition
    names : sequence of str, optional
        The state fields, in a fixed order (checkpoints, checksum, diagnostics); default :attr:`fields`.
    halo_width : int or tuple of int, optional
        Ghost cells per axis of every field; default the class's :attr:`halo_width`, else the largest
        reach of :attr:`stencils` per axis, else 1.
    dtype : str, optional
        ``"float64"`` or ``"float32"``; default the class's :attr:`dtype`.
    attributes : dict of str to dict, optional
        Per name, what the values mean (``{"u": {"units": "1"}}``), stored with checkpoints and the
        netCDF output; default :attr:`field_attributes`.

    Attributes
    ----------
    fields : tuple of str
        The state fields (class attribute: their names; two buffers each).
    constant_fields : tuple of str
        Fields read by stencils, never written (one buffer each, set in ``__init__``).
    work_fields : tuple of str
        Intermediate stages of a step (one buffer each).
    stencils : tuple of StencilKernel
        The stencils :meth:`step` runs: they set the halo width and are compiled before the clock starts.
    halo_width : int, tuple of int or None
        Ghost cells per axis; None: inferred from :attr:`stencils`.
    boundary_conditions : BoundaryConditions, dict of str to BoundaryConditions, or None
        What the ghosts beyond a non-periodic edge of the domain hold after each exchange: one
        :class:`~hpcgpu.BoundaryConditions` for every field, or one per field name. None: those ghosts
        are left as they are (every axis periodic needs none).
    params : dict of str to float
        Scalar parameters of the stencils not given as ``params=`` (before the options).
    checkpointed_values : tuple of str
        Names of numeric attributes that are part of the state besides the fields (the model time of
        an adaptive time step): saved with checkpoints and restored on ``--restart``.
    output_every : int or None
        Default of ``--output-every``: steps between records of ``NAME.nc`` (0: initial and final
        only); None: the model writes no netCDF file.
    output_dtype : str
        ``"float32"`` (half the size) or ``"float64"`` (the model's bits) in the netCDF file.
    field_attributes : dict of str to dict
        Per state field: ``units``, ``long_name``, ``standard_name`` (netCDF and checkpoints).
    dtype : str
        ``"float64"`` or ``"float32"``.
    current : dict of str to Field
        The state after the last step, and the constant and work fields.
    spare : dict of str to Field
        Where the step writes the new values of the state fields.
    state : dict of str to CurrentField
        Handles to the current buffers of the state fields.
    """

    unit = "cell-updates/s"
    fields: tuple = ()
    constant_fields: tuple = ()
    work_fields: tuple = ()
    stencils: tuple = ()
    halo_width = None
    boundary_conditions = None
    output_every: int | None = 100
    output_dtype = "float32"
    field_attributes: dict = {}
    params: dict = {}
    checkpointed_values: tuple = ()
    dtype = "float64"

    def __init__(self, comm, arch, grid, names=None, halo_width=None, dtype: str | None = None,
                 attributes: dict | None = None):
        model = type(self).__name__
        where = caller_site()
        names = tuple(type(self).fields if names is None else names)
        kinds = {"state field": names, "constant field": tuple(self.constant_fields),
                 "work field": tuple(self.work_fields)}
        every = [name for group in kinds.values() for name in group]
        if not names or len(set(every)) != len(every) or not all(isinstance(n, str) for n in every):
            raise replicated(ConfigurationError(
                f"{_at(where)}{model} needs distinct field names and at least one state field; got "
                + "; ".join(f"{kind}s {group!r}" for kind, group in kinds.items())
                + ". Declare fields = ('u', ...) in the class"))
        self.comm, self.arch, self.grid = comm, arch, grid
        self.fields = names
        self.params = dict(getattr(self, "params", None) or {})
        self.option_values = getattr(self, "option_values", None)
        self._check_stencils(grid, model, where)
        halo_width = self._halo_width(grid, halo_width)
        self._check_blocks(grid, halo_width, model, where)
        dtype = dtype or self.dtype
        attributes = dict(self.field_attributes if attributes is None else attributes)
        unknown = [name for name in attributes if name not in every]
        if unknown:
            raise replicated(ConfigurationError(
                f"{_at(where)}{model}.field_attributes names {', '.join(map(repr, unknown))}, not a field of the "
                f"model{_did_you_mean(unknown[0], every)}; its fields are {', '.join(every)}"))

        def make(name):
            return Field(grid, arch, halo_width=halo_width, dtype=dtype, name=name, attributes=attributes.get(name))

        self.current = FieldSet({name: make(name) for name in every}, model, "field")
        self.spare = FieldSet({name: make(name) for name in names}, model, "field")
        for name in every[len(names):]:
            self.spare[name] = self.current[name]   # one buffer: the same Field in both sets
        self.state = {name: CurrentField(self, name) for name in names}
        self.updates_per_step = math.prod(grid.global_shape)
        self.step_index = 0
        self._written: set = set()   # state fields whose new values this step has written
        self._resolved: dict = {}    # (stencil, into, read, buffer order) -> outputs, inputs, conditions

    # ------------------------------------------------------------------ set-up checks
    def _check_stencils(self, grid, model: str, where) -> None:
        for kernel in self.stencils:
            if not hasattr(kernel, "definition"):
                raise replicated(ConfigurationError(
                    f"{model}.stencils holds {kernel!r}; expected functions decorated with @hpcgpu.stencil"))
            if kernel.definition.ndim != grid.ndim:
                raise replicated(ConfigurationError(
                    f"{_at(where)}{_stencil_text(kernel)} indexes its fields with {kernel.definition.ndim} offset(s), but the "
                    f"grid of {model} has {grid.ndim} axes ({' x '.join(map(str, grid.global_shape))}); write one "
                    f"offset per axis, e.g. {kernel.fields[0]}[{', '.join(['0'] * grid.ndim)}]"))

    def _halo_width(self, grid, halo_width):
        declared = halo_width if halo_width is not None else type(self).halo_width
        if declared is not None:
            return declared
        if not self.stencils:
            return 1
        return tuple(max(kernel.halo_width[axis] for kernel in self.stencils) for axis in range(grid.ndim))

    @staticmethod
    def _check_blocks(grid, halo_width, model: str, where) -> None:
        widths = (halo_width,) * grid.ndim if isinstance(halo_width, int) else tuple(halo_width)
        for axis, width in enumerate(widths[:grid.ndim]):
            thinnest = grid.min_extent(axis)
            if thinnest < width:
                shape = " x ".join(map(str, grid.global_shape))
                raise replicated(ConfigurationError(
                    f"{_at(where)}{model}: the grid of {shape} cells split {' x '.join(map(str, grid.dims))} over "
                    f"{grid.n_ranks} ranks gives blocks of {thinnest} cell(s) along axis {axis}, fewer than the "
                    f"stencils' halo of {width}; use fewer ranks along that axis (--dims), or a larger grid"))

    # ------------------------------------------------------------------ stepping
    def swap(self) -> None:
        """Make the spare buffers of the state fields current (after a step wrote them); returns None."""
        self.current, self.spare = self.spare, self.current

    def stage(self, kernel, into, params=None, timers=None, read=None, boundary_conditions=None) -> None:
        """Run ``kernel`` over all owned cells, writing ``into``; returns None.

        Parameters
        ----------
        kernel : StencilKernel
        into : str or sequence of str
            Where each returned value goes, in order: a work field, or a state field (its new value,
            current after the step ends).
        params : mapping of str to float, optional
            Scalar parameters (before :attr:`params` and the options of the same name).
        timers : PhaseTimers, optional
        read : mapping of str to str, optional
            Which model field each of the stencil's fields reads, where the names differ
            (``read={"v": "u1"}``); the others read the model field of their own name. A state field
            reads its value at the start of the step.
        boundary_conditions : optional
            One per field the stencil reads around the cell (default from :attr:`boundary_conditions`).
        """
        try:
            into = (into,) if isinstance(into, str) else tuple(into)
            # Resolved once per stencil, mapping and buffer order (the two orders alternate step by step).
            key = (kernel, into, tuple(read.items()) if read else None, id(self.current))
            resolved = self._resolved.get(key)
            if resolved is None:
                resolved = self._resolved[key] = self._resolve(kernel, into, read)
            outputs, inputs, conditions = resolved
            values = self._parameters(kernel, params)
            if boundary_conditions is not None:
                conditions = boundary_conditions
            kernel.update(outputs=outputs, inputs=inputs, params=values, timers=timers,
                          boundary_conditions=conditions)   # binds and checks only inside check_step
        except HpcgpuError as error:
            raise self._located(error, kernel) from None
        self._written.update(name for name in into if name in self.state)

    def advance(self, kernel, params=None, timers=None, boundary_conditions=None, *, into=None, read=None) -> None:
        """The last stage of a step: :meth:`stage`, then :meth:`end_step`; returns None.

        ``into`` defaults to the state fields the stencil reads, in its order (``return u_new, v_new``
        for a stencil of ``u, v``).
        """
        if into is None:
            mapping = dict(read or {})
            into = tuple(mapping.get(name, name) for name in kernel.fields
                         if mapping.get(name, name) in self.state)
            if len(into) != kernel.n_outputs:
                raise replicated(ConfigurationError(
                    f"{_at(caller_site())}{_stencil_text(kernel)} returns {kernel.n_outputs} value(s) but reads "
                    f"{len(into)} state field(s) ({', '.join(into) or 'none'}); return one new value per state "
                    "field it reads, or say where the values go with into=(...)"))
        self.stage(kernel, into, params, timers, read, boundary_conditions)
        self.end_step()

    def end_step(self) -> None:
        """Make the new values of the state fields current and count the step; returns None.

        Every state field must have been written by a stage of this step.
        """
        missing = [name for name in self.state if name not in self._written]
        if missing:
            raise replicated(ConfigurationError(
                f"{_at(caller_site())}the step of {type(self).__name__} wrote no new value of "
                f"{', '.join(missing)}; every state field gets a new value each step. Write it (into=...), "
                "or declare it in constant_fields if it never changes"))
        self._written = set()
        self.swap()
        self.step_index += 1

    def _resolve(self, kernel, into, read):
        """Output Fields, input Fields by stencil name, boundary conditions of the exchanged inputs."""
        if not hasattr(kernel, "definition"):
            raise ConfigurationError(f"expected a function decorated with @hpcgpu.stencil, got {kernel!r}")
        mapping = dict(read or {})
        unknown = [name for name in mapping if name not in kernel.fields]
        if unknown:
            raise ConfigurationError(f"read= names {', '.join(map(repr, unknown))}, not a field of the stencil"
                                     f"{_did_you_mean(unknown[0], kernel.fields)}; it reads {', '.join(kernel.fields)}")
        if len(into) != kernel.n_outputs:
            raise ConfigurationError(f"it returns {kernel.n_outputs} value(s) but into= names {len(into)} field(s) "
                                     f"({', '.join(into)}); give one field per returned value")
        inputs = {}
        for name in kernel.fields:
            source = mapping.get(name, name)
            if source not in self.current:
                raise ConfigurationError(
                    f"it reads the field {source!r}, which the model does not have{_did_you_mean(source, self.current)}; "
                    f"its fields are {', '.join(self.current)}. Declare it in fields, constant_fields or "
                    "work_fields, or map the stencil's name to a field with read={...}")
            inputs[name] = self.current[source]
            needed = kernel.neighbourhood.field_halo_width(name)
            have = inputs[name].halo_width
            if any(h < n for h, n in zip(have, needed)):
                raise ConfigurationError(
                    f"it reads {source!r} up to {needed} cells away per axis, beyond the model's halo of {have}; "
                    f"declare halo_width = {tuple(max(h, n) for h, n in zip(have, needed))} in {type(self).__name__}, "
                    "or leave it undeclared and list the stencil in stencils (the halo follows from them)")
        outputs = []
        for name in into:
            if name in self.state:
                outputs.append(self.spare[name])
            elif name in self.work_fields:
                outputs.append(self.current[name])
            else:
                kind = "a constant field" if name in self.constant_fields else "not a field of the model"
                raise ConfigurationError(f"into= names {name!r}, {kind}{_did_you_mean(name, self.current)}; a stage "
                                         f"writes state fields ({', '.join(self.state)}) or work fields "
                                         f"({', '.join(self.work_fields) or 'none declared'})")
        read_names = [mapping.get(name, name) for name in kernel.fields if kernel.neighbourhood.reads_neighbours(name)]
        conditions = self._conditions(read_names)
        return outputs, inputs, conditions

    def _conditions(self, names):
        declared = self.boundary_conditions
        if declared is None:
            return None
        if isinstance(declared, dict):
            return [declared.get(name) for name in names]
        return [declared] * len(names)

    def _parameters(self, kernel, params) -> dict:
        """The stencil's scalar parameters: ``params``, then :attr:`params`, then the options."""
        given = params or {}
        values = {}
        missing = []
        for name in kernel.parameters:
            if name in given:
                values[name] = given[name]
            elif name in self.params:
                values[name] = self.params[name]
            elif self.option_values is not None and hasattr(self.option_values, name):
                values[name] = getattr(self.option_values, name)
            else:
                missing.append(name)
        unknown = [name for name in given if name not in kernel.parameters]
        if missing:
            known = list(given) + list(self.params) + ([] if self.option_values is None else
                                                       list(self.option_values.as_dict()))
            raise ConfigurationError(
                f"it takes the parameter {missing[0]!r}{_did_you_mean(missing[0], known)}, which is neither in "
                f"params=, in the model's params nor an option of the model; declare an Option({missing[0]!r}, ...), "
                "or pass params={" + repr(missing[0]) + ": value}")
        if unknown:
            raise ConfigurationError(f"params= gives {', '.join(map(repr, unknown))}, not a parameter of the stencil"
                                     f"{_did_you_mean(unknown[0], kernel.parameters)}; it takes "
                                     f"{', '.join(kernel.parameters) or 'none'}")
        return values

    def _located(self, error: HpcgpuError, kernel) -> HpcgpuError:
        """``error`` reworded to start with the user's line and the stencil (file and line)."""
        if getattr(error, "located", False):
            return error
        text = str(error)
        name = getattr(getattr(kernel, "definition", None), "name", None)
        prefix = f"stencil {name!r}: "
        if name and text.startswith(prefix):
            text = text[len(prefix):]
        elif name and text.startswith(f"stencil {name!r} "):
            text = text[len(f"stencil {name!r} "):]
        subject = _stencil_text(kernel) if name else repr(kernel)
        try:
            located = type(error)(f"{_at(caller_site())}{subject}: {text}")
        except TypeError:   # an error class with another signature
            located = ConfigurationError(f"{_at(caller_site())}{subject}: {text}")
        located.located = True
        return replicated(located) if getattr(error, "replicated", False) else located

    # ------------------------------------------------------------------ checks and compilation
    def check_step(self) -> None:
        """Collective: run :meth:`step` once binding and checking the stencils without computing; returns None.

        Every field, output and parameter a step names is looked up as in a real step, so a mistake
        ends the job here, before the run writes anything, with the line of ``step`` that makes it.
        The model is as before afterwards: its attributes are restored, and stencils (through
        :meth:`stage`, :meth:`advance` or ``kernel.update``/``apply`` called directly) compute nothing
        (:func:`hpcgpu.stencils.kernel.checking_only`). Host work of the step itself (a global
        maximum) does run.
        """
        saved = dict(self.__dict__)
        try:
            with checking_only():   # kernel.update/apply bind and check, compute nothing (also when called directly)
                self.step(None)
        finally:
            self.__dict__.clear()
            self.__dict__.update(saved)

    def prepare(self) -> None:
        """Collective: compile the stencils of a step for both buffer orders (:meth:`check_step` twice; no
        cell changes)."""
        self.check_step()
        self.swap()
        try:
            self.check_step()
        finally:
            self.swap()

    # ------------------------------------------------------------------ Model, from the fields
    def describe(self) -> str:
        shape = " x ".join(map(str, self.grid.global_shape))
        return f"{self.name} on {shape} cells ({', '.join(self.state)})"

    def decomposition(self) -> dict:
        return {"dims": list(self.grid.dims), "global_shape": list(self.grid.global_shape),
                "periodic": list(self.grid.periodic)}

    def checkpoint_state(self) -> dict:
        values = {name: getattr(self, name) for name in self.checkpointed_values}
        return {"fields": self._state_fields(), "replicated": {"step": self.step_index, **values}}

    def load_checkpoint(self, control) -> int | None:
        restored = control.restore(fields=self._state_fields())
        if restored is None:
            return None
        self.step_index = restored.step
        for name in self.checkpointed_values:
            setattr(self, name, restored.replicated[name])
        return restored.step

    def _state_fields(self) -> dict:
        return {name: self.current[name] for name in self.state}

    def checksum(self) -> str:
        return fields_checksum(self.comm, list(self._state_fields().values()))

    def finite_arrays(self) -> list:
        return [self.current[name].interior for name in self.state]

    def diagnostics(self) -> dict:
        return {f"mean_{name}": global_mean(self.current[name]) for name in self.state}

    def capturable(self, n_steps: int) -> bool:
        """Steps made of stencil updates never wait for the host: any even number can be a CUDA graph."""
        return n_steps % 2 == 0

    def graph_key(self):
        """Which buffers are current: a graph replays the addresses it captured."""
        return tuple(id(self.current[name]) for name in self.state)

    # ------------------------------------------------------------------ what hpcgpu.run_model builds
    def operations(self, options) -> list:
        """The run's operations (:func:`hpcgpu.run_model`): the state fields to ``NAME.nc`` every
        ``--output-every`` steps and at the end (none when :attr:`output_every` is None)."""
        if type(self).output_every is None:
            return []
        attributes = {name: dict(self.field_attributes.get(name, {})) for name in self.state}
        return [NetCDFOutput(
            f"{self.name}.nc", self.state, trigger=Periodic(options.output_every) | AtEnd(),
            units={name: a["units"] for name, a in attributes.items() if "units" in a},
            long_names={name: a["long_name"] for name, a in attributes.items() if "long_name" in a},
            standard_names={name: a["standard_name"] for name, a in attributes.items() if "standard_name" in a},
            dtype=self.output_dtype, title=(self.__doc__ or self.name).strip().split("\n")[0].rstrip("."))]
