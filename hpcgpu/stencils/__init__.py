"""The kernel layer: write the update of one cell once, in Python; run it on CPUs, GPUs and many ranks.

The decorator is :func:`hpcgpu.stencil` (defined in :mod:`hpcgpu.stencils.kernel`)::

    import hpcgpu

    @hpcgpu.stencil
    def heat(u, alpha):
        return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])

    u = hpcgpu.Field(grid, arch, halo_width=heat.halo_width)
    u_next = hpcgpu.Field(grid, arch, halo_width=heat.halo_width)
    heat.update(outputs=u_next, inputs={"u": u}, params={"alpha": 0.1})   # exchange + interior + rim

- :mod:`hpcgpu.stencils.definition`    -- reading the function (supported Python, errors)
- :mod:`hpcgpu.stencils.neighbourhood` -- halo width and corners inferred from the offsets
- :mod:`hpcgpu.stencils.codegen_cpu`   -- the Numba ``njit(parallel=True)`` kernel it prints
- :mod:`hpcgpu.stencils.codegen_cuda`  -- the CUDA C kernel it prints (NVRTC, ``--fmad=false``)
- :mod:`hpcgpu.stencils.compile`       -- compiling and caching both
- :mod:`hpcgpu.stencils.kernel`        -- :class:`StencilKernel`: ``apply`` over regions, ``update`` overlapped

Reproducible sums of fields for diagnostics are in :mod:`hpcgpu.reductions`.

``docs/user-guide.md`` is the tutorial.
"""

from hpcgpu.stencils.definition import StencilDefinitionError
from hpcgpu.stencils.kernel import REGIONS, StencilKernel, stencil
from hpcgpu.stencils.neighbourhood import Neighbourhood

__all__ = ["REGIONS", "Neighbourhood", "StencilDefinitionError", "StencilKernel", "stencil"]
