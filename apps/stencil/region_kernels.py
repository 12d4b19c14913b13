"""The kernel layer's CPU kernels run over regions of padded arrays: how Jacobi and heat3d compute on CPUs.

Jacobi and heat3d write the update of one cell once, as an ``@hpcgpu.stencil`` function
(:mod:`apps.stencil.jacobi.stencil`, :mod:`apps.stencil.heat3d.stencil`). On CPUs their sweeps run
the Numba kernel the kernel layer prints from that function (:mod:`hpcgpu.stencils.codegen_cpu`),
the same code a user's model runs: no hand-written CPU kernel. The apps keep their own schedule
(:mod:`apps.stencil.pingpong`: the rim, the exchange of the *new* state, the interior) and Jacobi
leaves its Dirichlet columns out of every region, so they call the generated kernel on regions in
padded indices here rather than :meth:`hpcgpu.stencils.StencilKernel.apply`, which updates whole
:class:`~hpcgpu.Field` objects over the regions ``"owned"``, ``"interior"`` or ``"rim"`` only.

Arithmetic is the layer's: the expression tree in Python's evaluation order, constants and
parameters in the data dtype, no fused multiply-add; so the result is the bits of the former
hand-written kernels, which evaluated the same expressions in the same order. On GPUs the apps keep
their CUDA kernels (:mod:`apps.stencil.jacobi.gpu`, :mod:`apps.stencil.heat3d.gpu`); see
``docs/stencil.md`` for why.
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.stencils import codegen_cpu
from hpcgpu.stencils.compile import cpu_function


@functools.lru_cache(maxsize=None)
def region_kernel(kernel, dtype_name: str, halo_width: int):
    """The layer's Numba kernel of ``kernel`` for arrays of ``dtype_name`` with ``halo_width`` ghosts per side.

    Compiled once per process (Numba's cache keeps the machine code between runs). Its arguments are
    the output arrays, the input arrays (in the order of ``kernel.fields``), the parameters (in the
    order of ``kernel.parameters``, as scalars of the data dtype) and an int64 table of regions in
    *owned* coordinates, shape ``(n_regions, 2 * ndim)``.
    """
    definition = kernel.definition
    widths = (int(halo_width),) * definition.ndim
    source = codegen_cpu.python_source(definition, np.dtype(dtype_name), {name: widths for name in definition.fields},
                                       (widths,) * definition.n_outputs)
    return cpu_function(source, codegen_cpu.function_name(definition))


def apply_to_regions(kernel, outputs, inputs, parameters, regions, halo_width: int = 1) -> None:
    """Update ``outputs`` over ``regions`` from ``inputs`` with the layer's CPU kernel; in place, returns None.

    Parameters
    ----------
    kernel : hpcgpu.stencils.StencilKernel
        The ``@hpcgpu.stencil`` function.
    outputs, inputs : sequence of numpy.ndarray, each shape (n_0 + 2 w, ..., n_{d-1} + 2 w)
        Padded arrays (ghost width ``halo_width`` on every side), one dtype (float32 or float64),
        as many as the stencil returns and reads; no output may share memory with an input (the
        callers' argument checks, :mod:`apps.stencil.jacobi.arrays`, ensure it).
    parameters : sequence of float
        The stencil's scalar parameters in order; converted to the arrays' dtype here.
    regions : sequence of tuple of int
        Half-open bounds ``(start_0, stop_0, start_1, stop_1, ...)`` in padded indices, each inside
        ``[halo_width, shape - halo_width]``; empty regions are skipped.
    halo_width : int
        Ghost cells per side of every array.
    """
    dtype = outputs[0].dtype
    ndim = outputs[0].ndim
    table = np.array([[int(bound) - halo_width for bound in region] for region in regions
                      if all(region[2 * axis] < region[2 * axis + 1] for axis in range(ndim))],
                     dtype=np.int64).reshape(-1, 2 * ndim)
    if not len(table):
        return
    function = region_kernel(kernel, dtype.name, halo_width)
    function(*outputs, *inputs, *(dtype.type(value) for value in parameters), table)
