"""hpcgpu: scientific computing on many GPUs with MPI, CuPy, Numba and NCCL.

Importing this package has no side effects: MPI is initialised when the first
:class:`Communicator` is built, and a GPU is picked by :func:`hpcgpu.arch.auto`.

>>> import hpcgpu
>>> comm = hpcgpu.Communicator()                                   # doctest: +SKIP
>>> arch = hpcgpu.arch.auto(comm)                                  # doctest: +SKIP
>>> grid = hpcgpu.Decomposition(comm, (4096, 2048), periodic=(False, True))   # doctest: +SKIP
>>> h = hpcgpu.Field(grid, arch, halo_width=2)                     # doctest: +SKIP
>>> pending = h.exchange_halos(wait=False)                         # doctest: +SKIP
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: The public API: name -> (module, attribute; None for the module itself), imported on first use.
_LAZY = {
    # runtime, grid and fields
    "Communicator": ("hpcgpu.runtime.communicator", "Communicator"),
    "Decomposition": ("hpcgpu.decomposition", "Decomposition"),
    "Field": ("hpcgpu.field", "Field"),
    "exchange_halos": ("hpcgpu.halo.exchange", "exchange_halos"),
    "HaloExchange": ("hpcgpu.halo.exchange", "HaloExchange"),
    "abort_on_error": ("hpcgpu.runtime.abort", "abort_on_error"),
    "arch": ("hpcgpu.arch", None),
    "errors": ("hpcgpu.errors", None),
    # the kernel layer
    "stencil": ("hpcgpu.stencils.kernel", "stencil"),
    "StencilKernel": ("hpcgpu.stencils.kernel", "StencilKernel"),
    "stencils": ("hpcgpu.stencils", None),
    # diagnostics with the same bits on any rank count
    "global_sum": ("hpcgpu.reductions", "global_sum"),
    "global_mean": ("hpcgpu.reductions", "global_mean"),
    "global_max": ("hpcgpu.reductions", "global_max"),
    "global_min": ("hpcgpu.reductions", "global_min"),
    # boundary conditions of non-periodic edges
    "BoundaryConditions": ("hpcgpu.halo.boundaries", "BoundaryConditions"),
    "Dirichlet": ("hpcgpu.halo.boundaries", "Dirichlet"),
    "ZeroGradient": ("hpcgpu.halo.boundaries", "ZeroGradient"),
    "Mirror": ("hpcgpu.halo.boundaries", "Mirror"),
    # the simulation driver and what a model plugs into it
    "Simulation": ("hpcgpu.simulation.driver", "Simulation"),
    "Model": ("hpcgpu.simulation.model", "Model"),
    "FieldModel": ("hpcgpu.simulation.field_model", "FieldModel"),
    "Option": ("hpcgpu.simulation.options", "Option"),
    "run_model": ("hpcgpu.simulation.program", "run_model"),
    "Operation": ("hpcgpu.simulation.operations", "Operation"),
    "Periodic": ("hpcgpu.simulation.triggers", "Periodic"),
    "AtEnd": ("hpcgpu.simulation.triggers", "AtEnd"),
    "setup_architecture": ("hpcgpu.simulation.driver", "setup_architecture"),
    "simulation": ("hpcgpu.simulation", None),
    "NetCDFOutput": ("hpcgpu.simulation.netcdf_output", "NetCDFOutput"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __dir__():
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'hpcgpu' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value
