"""The Jacobi benchmark as an ``apps.stencil`` model (see :mod:`apps.stencil.jacobi.problem`)."""

from __future__ import annotations

import math

import hpcgpu
from hpcgpu.transport import collectives
from apps.stencil.checkpointing import StencilModel
from apps.stencil.jacobi.problem import check_global_shape, fill_initial_state, fixed_local_columns
from apps.stencil.jacobi.sweep import jacobi_sweep
from apps.stencil.pingpong import PingPongStencil


class JacobiModel(StencilModel):
    """2D Laplace, 5-point Jacobi, periodic in y, Dirichlet columns at x = 0 and nx - 1.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : argparse.Namespace
        Uses ``nx``, ``ny``, ``precision``, ``dims``, ``norm_every``.
    """

    name = "jacobi"
    unit = "cell-updates/s"
    default_shape = {"nx": 4096, "ny": 4096}
    #: Full-size arrays of the model's precision it certainly holds per cell (the two grids swept between):
    #: a lower bound of its memory, checked before the state is built (apps.stencil.app.memory_estimate).
    arrays_per_cell = 2
    default_steps = 1000

    def __init__(self, comm, arch, options):
        self.comm, self.arch = comm, arch
        ny, nx = check_global_shape((options.ny, options.nx))
        self.global_shape = (ny, nx)
        self.dtype = "float32" if options.precision == "fp32" else "float64"
        peer_halo = getattr(options, "peer_halo", False)
        dims = options.dims if options.dims is not None or not peer_halo else (comm.size, 1)   # bands of rows
        self.grid = hpcgpu.Decomposition(comm, self.global_shape, dims=dims, periodic=(True, False))
        self.norm_every = options.norm_every
        self.fixed_columns = fixed_local_columns(self.grid.local_start[1], self.grid.local_shape[1], nx)
        self.stencil = PingPongStencil(self.grid, arch, self.dtype, "a", self._sweep, overlap=options.overlap,
                                       peer_halo=peer_halo)
        self.steps_use_job_transport = not peer_halo   # --peer-halo: boundary rows stored into the neighbours
        for field in (self.stencil.current, self.stencil.next):
            padded_start = tuple(s for s in self.grid.local_start)
            fill_initial_state(field.data, padded_start, self.global_shape)
        self.stencil.exchange_current()
        self.residual = arch.zeros(1, dtype="float64")
        self.step_index = 0
        self.norm = float("nan")
        # Cells updated per sweep (the Dirichlet columns are not).
        self.updates_per_step = ny * (nx - 2)
        # A sweep reads the old value and writes the new one (hpcgpu.app.plausibility).
        self.min_bytes_per_update = 2 * (4 if self.dtype == "float32" else 8)

    def _sweep(self, out, inp, region, residual):
        # A thin rim slab (a row or two) gets one row per thread: more blocks, no wasted row loads.
        thin = region[1] - region[0] < 8
        jacobi_sweep(out, inp, region, self.fixed_columns, residual, rows_per_thread=1 if thin and self.arch.is_gpu else None)

    def prepare(self) -> None:
        """Compile and load every kernel the steps will launch (GPU), so the timed loop does not pay for it.

        Sweeps a scratch pair of rows as wide as the local arrays, thin and thick, with and without the
        residual: the kernel instantiations of the rim, the interior and the whole block.
        """
        if not self.arch.is_gpu:
            return
        width = self.stencil.current.data.shape[1]
        scratch_in = self.arch.zeros((10, width), dtype=self.dtype)
        scratch_out = self.arch.zeros((10, width), dtype=self.dtype)
        residual = self.arch.zeros(1, dtype="float64")
        for rows in ((1, 2), (1, 9)):
            for accumulate in (None, residual):
                self._sweep(scratch_out, scratch_in, (*rows, 1, width - 1), accumulate)
        self.arch.synchronize()

    @property
    def fields(self):
        return [self.stencil.current]

    def step(self, timers) -> None:
        self.step_index += 1
        want_norm = self.norm_every > 0 and self.step_index % self.norm_every == 0
        if want_norm:
            self.residual[...] = 0
        self.stencil.step(timers, self.residual if want_norm else None)
        if want_norm:
            with timers.phase("communication"):
                total = collectives(self.comm, self.arch).allreduce(self.residual)
            self.norm = math.sqrt(float(self.arch.to_host(total)[0]))

    def graph_key(self) -> int:
        return self.stencil.parity   # the two buffers swap every step

    def capturable(self, n_steps: int = 1) -> bool:
        """True if the next ``n_steps`` steps do no host synchronisation (they can be a CUDA graph)."""
        return not any(
            self.norm_every > 0 and (self.step_index + k) % self.norm_every == 0 for k in range(1, n_steps + 1)
        )

    def progress_note(self) -> str:
        return f"residual {self.norm:.6e}" if self.norm == self.norm else ""

    def diagnostics(self) -> dict:
        return {"residual_l2": self.norm, "norm_every": self.norm_every}


    # ------------------------------------------------------------------ checkpoint / restart (StencilModel)
    @property
    def time(self) -> float:
        return float(self.step_index)

    def _extra_state(self) -> dict:
        return {"residual_l2": self.norm}

    def _restore_extra(self, replicated: dict) -> None:
        self.norm = float(replicated["residual_l2"])

    def after_restore(self) -> None:
        self.stencil.exchange_current()

    def describe(self) -> str:
        return f"Jacobi 2D Laplace {self.global_shape[0]} x {self.global_shape[1]} {self.dtype}, norm every {self.norm_every} steps"
