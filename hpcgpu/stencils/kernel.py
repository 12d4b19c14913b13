"""A stencil kernel: one Python function of one cell, applied to :class:`~hpcgpu.Field` objects.

:func:`stencil` turns the function into a :class:`StencilKernel`. The kernel is compiled the first
time it meets a combination of fields (their dtype, ghost widths and, on GPUs, block shape): a Numba
``njit(parallel=True)`` function on a CPU architecture, a CUDA C kernel on a GPU one, both printed
from the same expression tree (:mod:`hpcgpu.stencils.codegen_cpu`, :mod:`hpcgpu.stencils.codegen_cuda`).

Two ways to run it:

- :meth:`StencilKernel.apply` updates one region of the owned cells: ``"owned"`` (all),
  ``"interior"`` (the cells whose neighbourhood holds no ghost cell) or ``"rim"`` (the others);
  the caller fills the ghosts;
- :meth:`StencilKernel.update` does a whole overlapped update: start the halo exchange of the input
  fields the stencil reads around the cell, update the interior while the messages travel, wait,
  update the rim. A rank whose only neighbours are itself (one block along every periodic axis)
  fills its ghosts by local copies and updates all owned cells in one pass.

Regions, in owned coordinates, for a 2D block and a stencil of reach 1 (``split_owned``)::

    +-----------+   rim slab 0: first row      interior: rows 1 .. ny-2,
    |   slab 0  |   rim slab 1: last row                 columns 1 .. nx-2
    |s|       |s|   rim slab 2: first column
    |2| inter |3|   rim slab 3: last column
    |s|       |s|
    |   slab 1  |
    +-----------+

On GPUs every kernel goes to CuPy's current stream, which hpcgpu keeps as the architecture's compute
stream (checked by :meth:`~StencilKernel.update`), with no host synchronisation and no allocation
after the first call: a step made of these calls can be captured and replayed as a CUDA graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import numbers
import sys

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.field import Field
from hpcgpu.halo.exchange import exchange_halos
from hpcgpu.halo.regions import split_owned
from hpcgpu.stencils import codegen_cpu, codegen_cuda
from hpcgpu.stencils.compile import cpu_function, gpu_function
from hpcgpu.runtime.abort import exit_before_mpi
from hpcgpu.stencils.definition import StencilDefinitionError, parse
from hpcgpu.stencils.neighbourhood import Neighbourhood

REGIONS = ("owned", "interior", "rim")
DTYPES = ("float32", "float64")


class StencilKernel:
    """A stencil function compiled for the fields it is applied to (see :func:`stencil`).

    Attributes
    ----------
    definition : hpcgpu.stencils.definition.StencilDefinition
        What was read from the function.
    neighbourhood : hpcgpu.stencils.neighbourhood.Neighbourhood
        The cells it reads (halo width per axis, corners).
    fields, parameters : tuple of str
        Names of the input fields and scalar parameters, in the function's order.
    n_outputs : int
        Fields written per call (values returned by the function).
    """

    def __init__(self, function):
        self.function = function
        self.definition = parse(function)
        self.neighbourhood = Neighbourhood.of(self.definition)
        self.fields = self.definition.fields
        self.parameters = self.definition.parameters
        self.n_outputs = self.definition.n_outputs
        self._bindings: dict = {}
        functools.update_wrapper(self, function)

    def __repr__(self) -> str:
        return (f"<stencil {self.definition.name}: fields {', '.join(self.fields)}; parameters "
                f"{', '.join(self.parameters) or 'none'}; {self.n_outputs} output(s); {self.neighbourhood.describe()}>")

    @property
    def halo_width(self) -> tuple:
        """The ghost width per axis the input fields need (at least; see :class:`Neighbourhood`)."""
        return self.neighbourhood.halo_width

    @property
    def corners(self) -> bool:
        """True if the stencil reads diagonal neighbours (the exchange then fills corner ghosts)."""
        return self.neighbourhood.corners

    # ------------------------------------------------------------------ running
    def apply(self, outputs, inputs, params=None, region: str = "owned") -> None:
        """Update ``region`` of the owned cells of ``outputs`` from ``inputs``; in place, returns None.

        The ghost cells of ``inputs`` that the region reads must be valid (``"interior"`` reads none).

        Parameters
        ----------
        outputs : Field or sequence of Field
            One per value the function returns; none of them may be an input.
        inputs : mapping of str to Field, or sequence of Field
            The input fields by parameter name, or in the order of :attr:`fields`.
        params : mapping of str to float, optional
            One value per scalar parameter (:attr:`parameters`), converted to the fields' dtype.
        region : {"owned", "interior", "rim"}

        Raises
        ------
        ConfigurationError
            Missing or unknown fields or parameters, fields on different grids, dtypes other than one
            of float32 / float64, or an input whose ``halo_width`` is smaller than the stencil reads.
        """
        if region not in REGIONS:
            raise ConfigurationError(f"stencil {self.definition.name!r}: region must be one of {', '.join(REGIONS)}; "
                                     f"got {region!r}")
        binding = self.bind(outputs, inputs)
        values = binding.parameter_values(params)
        if _checking_only.get():
            return
        binding.run(region, values)

    def update(self, outputs, inputs, params=None, timers=None, boundary_conditions=None) -> None:
        """Exchange the inputs' halos and update all owned cells of ``outputs``, overlapped; returns None.

        The exchange (corners included only if the stencil reads them) starts first; the interior is
        updated while it is in flight, then the rim after ``wait()``. Arguments as :meth:`apply`.

        Parameters
        ----------
        timers : hpcgpu.app.timers.PhaseTimers, optional
            The step's timers: the updates count as ``compute``, the exchange as ``communication``.
        boundary_conditions : optional
            Passed to :func:`hpcgpu.exchange_halos`: one ``BoundaryConditions`` (or None) per exchanged
            field, in the order of :attr:`fields` restricted to those read around the cell.
        """
        binding = self.bind(outputs, inputs)
        values = binding.parameter_values(params)
        if _checking_only.get():
            return
        phase = timers.phase if timers is not None else _no_phase
        if not binding.exchanged:
            with phase("compute"):
                binding.run("owned", values)
            return
        if binding.arch.is_gpu:
            binding.arch.check_compute_stream(f"stencil {self.definition.name!r}")
        with phase("communication"):
            pending = exchange_halos(binding.exchanged, wait=False, corners=self.corners,
                                     boundary_conditions=boundary_conditions)
        if pending.is_local:
            # Nothing travels: the ghosts are filled by local copies already queued. One pass.
            pending.wait()
            with phase("compute"):
                binding.run("owned", values)
            return
        with phase("compute"):
            binding.run("interior", values)
        with phase("communication"):
            pending.wait()
        with phase("compute"):
            binding.run("rim", values)

    # ------------------------------------------------------------------ binding fields
    def bind(self, outputs, inputs) -> "_Binding":
        """The validated, compiled application of this kernel to these fields (cached per fields).

        The first :meth:`apply` or :meth:`update` binds; binding before the timed loop (a model's
        ``prepare``) keeps the compilation out of the timings.
        """
        outputs = [outputs] if isinstance(outputs, Field) else list(outputs)
        inputs = self._inputs_by_name(inputs)
        key = tuple(id(f) for f in outputs) + tuple(id(inputs[name]) for name in self.fields)
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = _Binding(self, outputs, inputs)
        return binding

    def _inputs_by_name(self, inputs) -> dict:
        name = self.definition.name
        if isinstance(inputs, Field):
            inputs = [inputs]
        if hasattr(inputs, "keys"):
            given = dict(inputs)
            missing = [f for f in self.fields if f not in given]
            unknown = [f for f in given if f not in self.fields]
            if missing or unknown:
                raise ConfigurationError(
                    f"stencil {name!r} reads the fields {', '.join(self.fields)}; inputs "
                    + (f"lack {', '.join(missing)}" if missing else "") + ("; " if missing and unknown else "")
                    + (f"name unknown field(s) {', '.join(unknown)}" if unknown else "")
                    + ". Pass inputs={name: Field} with exactly these names.")
            return given
        inputs = list(inputs)
        if len(inputs) != len(self.fields):
            raise ConfigurationError(f"stencil {name!r} reads {len(self.fields)} field(s) ({', '.join(self.fields)}), "
                                     f"got {len(inputs)} input(s); pass them in this order or by name.")
        return dict(zip(self.fields, inputs))

    def generated_source(self, outputs, inputs) -> str:
        """The source compiled for these fields: Python (Numba) on a CPU, CUDA C on a GPU."""
        return self.bind(outputs, inputs).source


@contextlib.contextmanager
def _no_phase(name):
    yield


#: Set while :func:`checking_only` is active: apply/update bind and check, and compute nothing.
_checking_only = contextvars.ContextVar("hpcgpu_stencil_checking_only", default=False)


@contextlib.contextmanager
def checking_only():
    """Within the block, :meth:`StencilKernel.apply` and :meth:`~StencilKernel.update` bind (compile) and
    check their fields and parameters as usual, but exchange no halo and change no cell.

    :meth:`hpcgpu.FieldModel.check_step` runs a model's step this way before the run starts, so a
    mistake is reported before anything is written, and the step's stencils are compiled.
    """
    token = _checking_only.set(True)
    try:
        yield
    finally:
        _checking_only.reset(token)


class _Binding:
    """One kernel applied to fixed fields: validated once, compiled once, regions computed once."""

    def __init__(self, kernel: StencilKernel, outputs: list, inputs: dict):
        definition, neighbourhood = kernel.definition, kernel.neighbourhood
        name = definition.name
        self.kernel = kernel
        if len(outputs) != definition.n_outputs:
            raise ConfigurationError(f"stencil {name!r} returns {definition.n_outputs} value(s), got "
                                     f"{len(outputs)} output field(s); pass one output Field per returned value.")
        every = outputs + [inputs[f] for f in definition.fields]
        for field in every:
            if not isinstance(field, Field):
                raise ConfigurationError(f"stencil {name!r}: expected hpcgpu.Field inputs and outputs, "
                                         f"got {type(field).__name__}")
        grid, arch = every[0].decomposition, every[0].arch
        for field in every[1:]:
            if field.decomposition is not grid or field.arch is not arch:
                raise ConfigurationError(
                    f"stencil {name!r}: fields {every[0].name!r} and {field.name!r} live on different "
                    "Decompositions or architectures; expected one grid for all inputs and outputs.")
        if grid.ndim != definition.ndim:
            raise ConfigurationError(f"stencil {name!r} indexes {definition.ndim} axes, but the fields have "
                                     f"{grid.ndim}; write one offset per axis of the grid.")
        dtypes = {np.dtype(f.dtype).name for f in every}
        if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
            found = ", ".join(f"{f.name}: {np.dtype(f.dtype).name}" for f in every)
            raise ConfigurationError(f"stencil {name!r}: expected all fields float32 or all float64, found {found}. "
                                     "Create the fields with one floating dtype.")
        for field_name in definition.fields:
            field = inputs[field_name]
            needed = neighbourhood.field_halo_width(field_name)
            if any(have < need for have, need in zip(field.halo_width, needed)):
                raise ConfigurationError(
                    f"stencil {name!r} reads {field_name!r} up to {needed} cells away per axis, but the field "
                    f"{field.name!r} passed for it has halo_width {field.halo_width}. Create it with "
                    f"halo_width={tuple(max(a, b) for a, b in zip(field.halo_width, needed))} or more.")
        for k, out in enumerate(outputs):
            if any(out is f for f in inputs.values()):
                raise ConfigurationError(
                    f"stencil {name!r}: output {k} ({out.name!r}) is also an input; a stencil reads its "
                    "neighbours' old values, so it needs a separate output Field (swap the two after the step).")
            if any(out is other for other in outputs[:k]):
                raise ConfigurationError(f"stencil {name!r}: the field {out.name!r} is passed as two outputs.")
        self.arch, self.grid = arch, grid
        self.dtype = np.dtype(every[0].dtype)
        self.outputs, self.inputs = outputs, [inputs[f] for f in definition.fields]
        self.arrays = tuple(f.data for f in self.outputs + self.inputs)
        #: Input fields read around the cell, whose halos :meth:`StencilKernel.update` exchanges.
        self.exchanged = [inputs[f] for f in definition.fields if neighbourhood.reads_neighbours(f)]
        local_shape = grid.local_shape
        interior, rim = split_owned(local_shape, (0,) * grid.ndim, neighbourhood.halo_width)
        owned = tuple(v for n in local_shape for v in (0, n))
        self.regions = {"owned": [owned], "interior": [interior] if interior is not None else [], "rim": rim}
        #: Cells per thread along axis ndim - 2 of the GPU form (also used by its host build in tests).
        self.rows_per_thread = codegen_cuda.rows_per_thread(grid.ndim, self.dtype)
        if arch.is_gpu:
            self.source = self.cuda_source()
            self.function = gpu_function(self.source, codegen_cuda.kernel_name(definition), codegen_cuda.NVRTC_OPTIONS)
            self.launches = {
                region: [(shape, tuple(np.int32(v) for v in bounds)) for bounds in bounds_list
                         if (shape := codegen_cuda.launch_shape(grid.ndim, bounds, self.rows_per_thread)) is not None]
                for region, bounds_list in self.regions.items()}
        else:
            self.source = codegen_cpu.python_source(
                definition, self.dtype, {f: inputs[f].halo_width for f in definition.fields},
                tuple(f.halo_width for f in outputs))
            self.function = cpu_function(self.source, codegen_cpu.function_name(definition))
            self.tables = {region: np.array(bounds_list, dtype=np.int64).reshape(len(bounds_list), 2 * grid.ndim)
                           for region, bounds_list in self.regions.items()}
            # Compile now (Numba compiles at the first call): a call over no region touches no cell.
            no_region = np.zeros((0, 2 * grid.ndim), dtype=np.int64)
            self.function(*self.arrays, *(self.dtype.type(0) for _ in definition.parameters), no_region)

    def cuda_source(self) -> str:
        """The CUDA C source of this kernel for these fields (compiled on GPUs; printable anywhere)."""
        definition = self.kernel.definition
        return codegen_cuda.cuda_source(
            definition, self.dtype, {name: (f.data.shape, f.halo_width) for name, f in zip(definition.fields, self.inputs)},
            tuple((f.data.shape, f.halo_width) for f in self.outputs), self.rows_per_thread)

    def parameter_values(self, params) -> tuple:
        """The scalar parameters in the kernel's order, converted to the fields' dtype."""
        kernel = self.kernel
        params = dict(params or {})
        missing = [p for p in kernel.parameters if p not in params]
        unknown = [p for p in params if p not in kernel.parameters]
        if missing or unknown:
            raise ConfigurationError(
                f"stencil {kernel.definition.name!r} takes the parameters {', '.join(kernel.parameters) or '(none)'}; "
                + (f"missing {', '.join(missing)}" if missing else "") + ("; " if missing and unknown else "")
                + (f"unknown {', '.join(unknown)}" if unknown else "") + ". Pass params={name: number}.")
        values = []
        for p in kernel.parameters:
            value = params[p]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigurationError(f"stencil {kernel.definition.name!r}: parameter {p} = {value!r}; "
                                         "expected a real number (a Python or NumPy scalar).")
            values.append(self.dtype.type(value))
        return tuple(values)

    def run(self, region: str, values: tuple) -> None:
        """Launch (GPU) or run (CPU) the kernel over ``region``; returns None."""
        if self.arch.is_gpu:
            for (grid, block), bounds in self.launches[region]:
                self.function(grid, block, self.arrays + values + bounds)
            return
        table = self.tables[region]
        if len(table):
            self.function(*self.arrays, *values, table)


def stencil(function) -> StencilKernel:
    """Decorator: make ``function`` (the update of one cell) a :class:`StencilKernel`.

    Example
    -------
    >>> @stencil
    ... def heat(u, alpha):
    ...     return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])
    >>> heat.halo_width, heat.corners
    ((1, 1), False)

    A function the layer cannot compile raises :class:`~hpcgpu.stencils.StencilDefinitionError`
    naming its file and line. In a script being run (``python model.py``, ``mpiexec ... python
    model.py``) the job ends there instead: one ``error:`` line from the launcher's rank 0, no
    traceback, exit code 2, before MPI starts or anything is written.
    """
    try:
        return StencilKernel(function)
    except StencilDefinitionError as error:
        if _defined_in_running_script(function):
            exit_before_mpi(error)
        raise


def _defined_in_running_script(function) -> bool:
    """True when ``function`` belongs to the script Python was started with (not an import, not a REPL)."""
    main = sys.modules.get("__main__")
    return getattr(function, "__module__", None) == "__main__" and getattr(main, "__file__", None) is not None
