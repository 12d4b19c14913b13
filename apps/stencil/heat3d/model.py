"""3D heat diffusion of one Fourier mode, checked against its exact discrete solution."""

from __future__ import annotations

import numpy as np

import hpcgpu
from apps.stencil.checkpointing import StencilModel
from hpcgpu.errors import ConfigurationError, NumericalError
from apps.stencil.heat3d.problem import amplification_factor, check_stability, exact_solution, initial_condition
from apps.stencil.heat3d.step import heat3d_step
from apps.stencil.pingpong import PingPongStencil


class Heat3DModel(StencilModel):
    """u_{n+1} = u_n + r (sum of 6 neighbours - 6 u_n) on a periodic nz x ny x nx box.

    Parameters
    ----------
    options : argparse.Namespace
        Uses ``nx``, ``ny``, ``nz``, ``precision``, ``dims``, ``diffusion_number``, ``modes``.
    """

    name = "heat3d"
    unit = "cell-updates/s"
    default_shape = {"nx": 128, "ny": 128, "nz": 128}
    #: Full-size arrays of the model's precision it certainly holds per cell (T, its update, mode factors):
    #: a lower bound of its memory, checked before the state is built (apps.stencil.app.memory_estimate).
    arrays_per_cell = 5
    default_steps = 100

    def __init__(self, comm, arch, options):
        self.comm, self.arch = comm, arch
        self.global_shape = (options.nz, options.ny, options.nx)
        self.dtype = "float32" if options.precision == "fp32" else "float64"
        try:
            self.r = check_stability(options.diffusion_number)
        except NumericalError as exc:  # user input, the same on every rank
            raise ConfigurationError(f"--diffusion-number: {exc}") from None
        self.modes = tuple(options.modes)
        self.grid = hpcgpu.Decomposition(comm, self.global_shape, dims=options.dims, periodic=True)
        self.stencil = PingPongStencil(self.grid, arch, self.dtype, "u", self._sweep, overlap=options.overlap,
                                       self_filling_sweep=True)
        self.stencil.current.set_from_global(
            lambda z, y, x: initial_condition(z, y, x, self.global_shape, self.modes, self.dtype)
        )
        self.stencil.exchange_current()
        self.step_index = 0
        self.updates_per_step = int(np.prod(self.global_shape))
        # A step reads the old value and writes the new one (hpcgpu.app.plausibility).
        self.min_bytes_per_update = 2 * np.dtype(self.dtype).itemsize

    def _sweep(self, out, inp, region, residual, periodic_ghosts=False):
        heat3d_step(out, inp, region, self.r, periodic_ghosts=periodic_ghosts)

    @property
    def fields(self):
        return [self.stencil.current]

    def step(self, timers) -> None:
        self.step_index += 1
        self.stencil.step(timers)

    def graph_key(self) -> int:
        return self.stencil.parity   # the two buffers swap every step

    def capturable(self, n_steps: int = 1) -> bool:
        return True

    def progress_note(self) -> str:
        return ""

    def diagnostics(self) -> dict:
        """Collective: relative max error against the exact discrete solution."""
        grid = self.grid
        index = np.ix_(*[np.arange(s, e) for s, e in zip(grid.local_start, grid.local_stop)])
        exact = exact_solution(*index, self.global_shape, self.modes, self.r, self.step_index, "float64")
        state = self.arch.to_host(self.stencil.current.interior).astype(np.float64)
        error = self.comm.allreduce(float(np.max(np.abs(state - exact))), "max")
        scale = self.comm.allreduce(float(np.max(np.abs(exact))), "max")
        return {
            "relative_max_error": error / scale if scale > 0 else float("nan"),
            "amplification_factor": amplification_factor(self.global_shape, self.modes, self.r),
            "diffusion_number": self.r,
        }


    # ------------------------------------------------------------------ checkpoint / restart (StencilModel)
    @property
    def time(self) -> float:
        return float(self.step_index)

    def _extra_state(self) -> dict:
        return {"diffusion_number": self.r, "modes": list(self.modes)}

    def _restore_extra(self, replicated: dict) -> None:
        if float(replicated["diffusion_number"]) != self.r or list(replicated["modes"]) != list(self.modes):
            raise ConfigurationError("the checkpoint was written with another --diffusion-number or --modes")

    def after_restore(self) -> None:
        self.stencil.exchange_current()

    def describe(self) -> str:
        nz, ny, nx = self.global_shape
        return f"heat3d {nz} x {ny} x {nx} {self.dtype}, r = {self.r}, mode {self.modes}"
