"""A tracer carried by a uniform wind over a doubly periodic plane: first-order upwind advection.

    dq/dt + u dq/dx + v dq/dy = 0

With Courant numbers cx = u dt/dx and cy = v dt/dy (|cx| + |cy| <= 1 for stability), the upwind
scheme takes each difference from the side the wind comes from::

    q(n+1) = q - max(cx, 0) (q - q[x-1]) - min(cx, 0) (q[x+1] - q) - (the same along y)

The tracer starts as a square of 1 in a field of 0; its total is conserved.

    python examples/advection_2d.py --n 128 --steps 400
    mpiexec -n 3 python examples/advection_2d.py --courant-x -0.3 --courant-y 0.4 --steps 1000
"""

import hpcgpu
from hpcgpu.errors import ConfigurationError


@hpcgpu.stencil
def upwind(q, cx, cy):
    along_x = max(cx, 0) * (q[0, 0] - q[0, -1]) + min(cx, 0) * (q[0, 1] - q[0, 0])
    along_y = max(cy, 0) * (q[0, 0] - q[-1, 0]) + min(cy, 0) * (q[1, 0] - q[0, 0])
    return q[0, 0] - along_x - along_y


class Advection(hpcgpu.FieldModel):
    """2D upwind advection of a tracer (periodic)."""

    name, version, default_steps = "advection_2d", "1.0", 400
    fields, stencils = ("q",), (upwind,)
    field_attributes = {"q": {"long_name": "tracer mixing ratio"}}
    options = (
        hpcgpu.Option("n", int, 128, "cells per side", minimum=1),
        hpcgpu.Option("courant_x", float, 0.5, "u dt / dx", minimum=-1, maximum=1),
        hpcgpu.Option("courant_y", float, 0.25, "v dt / dy", minimum=-1, maximum=1),
    )

    def __init__(self, comm, arch, options):
        n = options.n
        if abs(options.courant_x) + abs(options.courant_y) > 1:
            raise ConfigurationError(f"|--courant-x| + |--courant-y| must be <= 1 for a stable upwind scheme; got "
                                     f"{abs(options.courant_x) + abs(options.courant_y):g}. Reduce one of them.")
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True))
        self.current["q"].set_from_global(lambda y, x: 1.0 * ((abs(y - n // 4) < n // 8) & (abs(x - n // 4) < n // 8)))
        self.params = {"cx": options.courant_x, "cy": options.courant_y}

    def step(self, timers):
        self.advance(upwind, timers=timers)


if __name__ == "__main__":
    raise SystemExit(Advection.main())
