"""The kernel layer: write the update of one cell once, in Python; run it on CPUs, GPUs and many ranks.

::

    import hpcgpu

    @hpcgpu.stencil
    def heat(u, alpha):
        return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])

    u = hpcgpu.Field(grid, arch, halo_width=heat.halo_width)
    u_next = hpcgpu.Field(grid, arch, halo_width=heat.halo_width)
    heat.update(outputs=u_next, inputs={"u": u}, params={"alpha": 0.1})   # exchange + interior + rim

- :mod:`hpcgpu.stencil.definition`    -- reading the function (supported Python, errors)
- :mod:`hpcgpu.stencil.neighbourhood` -- halo width and corners inferred from the offsets
- :mod:`hpcgpu.stencil.codegen_cpu`   -- the Numba ``njit(parallel=True)`` kernel it prints
- :mod:`hpcgpu.stencil.codegen_cuda`  -- the CUDA C kernel it prints (NVRTC, ``--fmad=false``)
- :mod:`hpcgpu.stencil.compile`       -- compiling and caching both
- :mod:`hpcgpu.stencil.kernel`        -- :class:`StencilKernel`: ``apply`` over regions, ``update`` overlapped
- :mod:`hpcgpu.stencil.reductions`    -- sums of fields with the same bits on any number of ranks

``docs/user-guide.md`` is the tutorial.
"""

from hpcgpu.stencil.definition import StencilDefinitionError
from hpcgpu.stencil.kernel import REGIONS, StencilKernel, stencil
from hpcgpu.stencil.neighbourhood import Neighbourhood

__all__ = ["REGIONS", "Neighbourhood", "StencilDefinitionError", "StencilKernel", "stencil"]
