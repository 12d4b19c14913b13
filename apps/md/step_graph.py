"""CUDA graphs of the sync-free parts of an MD step (one rank on one GPU).

At 32,000 atoms a step is ~40 us of GPU work but several hundred us of Python: argument checks, CuPy
launches and timer events for five kernels. Between two rebuilds the kernels and their arguments do not
change, so each step is replayed as two CUDA graphs captured once (one host call each)::

    graph "first":  md_advance_step (device step counter += 1) -> first half kick/drift + skin/2 watch
    (check steps only: the host reads the watch here and may rebuild instead of the second graph)
    graph "second": ghost gather (periodic images) -> forces (no energy) -> [Langevin] -> second half kick

Kernel arguments are baked into a graph, so the one thing that changes every step -- the step number,
read by the watch (first exceedance) and by the Langevin noise (keyed by seed, step, atom id) -- lives in
a device int64 ``counter`` that the first graph increments; the host keeps a mirror and rewrites the
counter (one small asynchronous fill) whenever an eager step or a replay from the last check moved the
host step without it. The kernels are the very kernels of the eager path, launched with the same
arguments (the step comes from the counter instead of an argument): a run with graphs is bitwise the
run without them (GPU test ``test_md_graph.py``).

A graph is keyed by everything baked into it (device pointers, sizes, scalars); a rebuild allocates new
arrays, so the next step captures again (~one eager step of host work plus an instantiation), once per
rebuild. Energy steps (thermo), Nose-Hoover (host-side thermostat scalars), several ranks (NCCL inside
the ghost refresh) and the rebuild itself run eagerly.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.arch import on_stream
from hpcgpu.particles import device_ghosts
from hpcgpu.runtime.capture import capture_graph

from . import forces, integrate, watch
from ._arrays import raw_kernel
from .forces import compute_forces
from .integrate import langevin_forces, velocity_verlet_second_half
from .watch import first_half_and_watch

_CUDA_SOURCE = r"""
extern "C" __global__ void md_advance_step(long long* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] += 1;
}
"""
_NAMES = ("md_advance_step",)

#: Graphs kept per half (a few keys: watching / not, the last list and the one before a replay).
MAX_CACHED = 4


def graphs_apply(state, config) -> bool:
    """True if the step graphs can run this state: GPU, every ghost a local image (one rank), no
    Nose-Hoover, and ``config.graph`` not False (None = automatic = on)."""
    if getattr(config, "graph", None) is False or not state.is_gpu:
        return False
    if config.thermostat not in (None, "langevin"):
        return False
    return state.ghosts is not None and bool(getattr(state.ghosts, "all_local", False))


class StepGraphs:
    """The two captured halves of a normal step, a device step counter and the capture stream.

    Attributes
    ----------
    counter : cupy.ndarray, shape (1,), int64 -- the step the kernels read (device)
    n_captures, n_launches : int -- graphs captured and replayed (summary)
    """

    def __init__(self, dtype):
        import cupy

        self.counter = cupy.zeros(1, dtype=cupy.int64)
        self._counter_step = 0
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._graphs = {}
        self._retired = []
        self.n_captures = 0
        self.n_launches = 0
        # Load every kernel the graphs hold now: no module compile/load while a stream is capturing.
        real = "float" if np.dtype(dtype) == np.float32 else "double"
        raw_kernel(_CUDA_SOURCE, _NAMES, "md_advance_step")
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real}>")
        raw_kernel(forces._CUDA_SOURCE, forces._NAMES, f"md_lj_forces<{real}>")
        for name in ("md_langevin", "md_second_half"):
            raw_kernel(integrate._CUDA_SOURCE, integrate._NAMES, f"{name}<{real}>")
        device_ghosts._kernel("particles_ghost_gather", dtype)

    def _set_counter(self, step: int) -> None:
        """Device counter := ``step`` unless the host mirror says it already is (async, no sync)."""
        if self._counter_step != step:
            self.counter.fill(step)
            self._counter_step = step

    def _launch(self, key, record) -> None:
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= MAX_CACHED:
                # Keep dropped graphs alive a while: one may still be running on the stream, and the
                # host has synchronised (rebuilds, checks) many times before they are destroyed.
                self._retired = (self._retired + list(self._graphs.values()))[-2 * MAX_CACHED:]
                self._graphs.clear()
            # Capture on a private stream (the compute stream may be the legacy default stream, which
            # cannot capture); the captured graph then runs on the current stream like any kernel.
            # Not ``with self._stream:``: on exit CuPy would make the null stream current instead of
            # the stream set with ``Stream.use()`` (the compute stream), and later work would leave it.
            with on_stream(self._stream):
                graph = capture_graph(self._stream, record)
            self._graphs[key] = graph
            self.n_captures += 1
        graph.launch()
        self.n_launches += 1

    def first_half(self, state, dt: float, watch) -> None:
        """Advance the counter to ``state.step + 1`` and run the first half + watch (graph)."""
        reference = state.neighbor_list.reference_positions
        arrays = (state.positions, state.velocities, state.forces, state.masses, reference, watch.values)
        key = ("first", float(dt), float(watch.threshold_sq), state.n_local, state.positions.shape[0],
               *(a.data.ptr for a in arrays))

        def record():
            raw_kernel(_CUDA_SOURCE, _NAMES, "md_advance_step")((1,), (32,), (self.counter,))
            first_half_and_watch(state.positions, state.velocities, state.forces, state.masses, dt, reference,
                                 watch.threshold_sq, 0, watch.values, step_counter=self.counter)

        self._set_counter(state.step)
        self._launch(key, record)
        self._counter_step = state.step + 1

    def second_half(self, state, config) -> None:
        """Ghost refresh, forces (no energy), Langevin and second half kick for step ``state.step`` (graph)."""
        ghosts, neighbor_list = state.ghosts, state.neighbor_list
        arrays = (state.positions, state.types, neighbor_list.neighbors, neighbor_list.counts, state.pair_table,
                  state.forces, state.velocities, state.masses, state.atom_ids, ghosts.gather_source,
                  ghosts.gather_shift, ghosts.receive_buffer)
        langevin = config.thermostat == "langevin"
        key = ("second", state.n_local, ghosts.n_ghost, neighbor_list.capacity, float(config.dt), langevin,
               float(config.temperature), float(config.damping), int(config.seed), *(a.data.ptr for a in arrays))

        def record():
            ghosts.forward(state.positions)
            compute_forces(state.positions, state.types, neighbor_list, state.pair_table, state.forces,
                           compute_energy=False)
            if langevin:
                langevin_forces(state.forces, state.velocities, state.masses, state.atom_ids, config.temperature,
                                config.damping, config.dt, config.seed, 0, step_counter=self.counter)
            velocity_verlet_second_half(state.velocities, state.forces, state.masses, config.dt)

        self._set_counter(state.step)
        self._launch(key, record)

    def summary(self) -> dict:
        return {"captures": self.n_captures, "launches": self.n_launches}
