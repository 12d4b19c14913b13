"""Chunks of device-resident steps run as CUDA graphs: the host side shared by the resident MD drivers.

:class:`ChunkedGraphSteps` queues steps, launches a full chunk as one captured graph and reads the
chunk's control words when the next chunk is launched, so the host queues steps while the GPU runs.
The one-GPU driver (:class:`apps.md.resident.ResidentSteps`) and the slab driver
(:class:`apps.md.resident_slab.SlabResidentSteps`) subclass it; :data:`GRAPH_CONDITIONALS` and
:func:`rebuild_skip` decide whether the [flag] kernels of a capture sit in CUDA graph IF nodes.

The simulation driver calls the model's step once per step (:class:`hpcgpu.simulation.Simulation`); these
chunks are how MD launches its steps, not the driver's graph windows (:func:`hpcgpu.simulation.driver.graph_window`,
:class:`hpcgpu.app.graph.StepGraph`): a chunk's replay is checked one chunk later and run again after a capacity
overflow, a growth drops every graph, and a graph's contents depend on where the chunk ends (energies on a thermo
step). ``docs/architecture.md`` ("MD's chunked graphs") says what the driver would need to hold them.
"""

from __future__ import annotations

import contextlib
import os

from hpcgpu.arch import on_stream
from hpcgpu.runtime.capture import capture_graph
from hpcgpu.runtime import graph_conditional
from hpcgpu.runtime.graph_conditional import SkipUnless

from .watch import NOT_EXCEEDED

#: Steps per graph (and per host check) when ``MDConfig.check_interval`` is None.
DEFAULT_CHUNK = 25
#: Graphs kept (keys: chunk length, energy on the last step).
MAX_GRAPHS = 6
#: In a captured chunk the [flag] kernels sit in CUDA graph IF nodes, skipped on steps without a rebuild
#: (:mod:`hpcgpu.runtime.graph_conditional`; each empty kernel costs a graph node launch), where the driver
#: has them. False (or the environment's HPCGPU_GRAPH_CONDITIONALS=0): plain flagged kernels (the tests
#: compare both: the same results bit for bit).
GRAPH_CONDITIONALS = os.environ.get("HPCGPU_GRAPH_CONDITIONALS", "1") != "0"


def rebuild_skip(stream, watch):
    """What a chunk captured on ``stream`` wraps its [flag] kernels in: IF nodes that run only when the
    rebuild flag ``watch[0]`` is raised, or plain launches (``stream`` None: outside a capture, or
    conditionals off). See :class:`hpcgpu.runtime.graph_conditional.SkipUnless`."""
    return SkipUnless(stream, watch, NOT_EXCEEDED)


def graph_conditionals_here() -> bool:
    """Whether captures put [flag] kernels into IF nodes: asked for and working on this GPU (call it before
    a capture: the first call launches a small test graph)."""
    import cupy

    return bool(GRAPH_CONDITIONALS) and graph_conditional.works(cupy.cuda.Device().id)


class ChunkedGraphSteps:
    """The host side of a device-resident driver: steps are queued and run as *chunks*, each one CUDA graph,
    and a chunk's control words are read (waiting for it) when the next chunk is launched, so the host
    queues steps while the GPU runs. Subclasses provide ``_launch(state, n_steps, energy_last)`` (run the
    steps as one graph), ``_verify(state, timers)`` (read the words of ``_unverified`` = (first step, steps,
    energy on the last, step after the chunk); after an overflow grow and run the chunk again) and may
    override ``_chunk_launched``. With several ranks, flush and settle are collective."""

    chunk: int
    pending: int = 0
    n_chunks: int = 0
    _unverified = None

    def step(self, state, compute_energy: bool, timers) -> None:
        """Queue one step; launch the queued chunk when it is full or this step needs its energy."""
        state.step += 1
        self.pending += 1
        if compute_energy or self.pending >= self.chunk:
            self.flush(state, timers, energy_last=compute_energy)

    def flush(self, state, timers=None, energy_last: bool = False) -> None:
        """Verify the chunk launched before (waits for it), then launch the queued steps as one graph."""
        self._verify(state, timers)
        n_steps = self.pending
        if n_steps == 0:
            return
        with _phase(timers, "compute"):
            self._launch(state, n_steps, energy_last)
        self._unverified = (state.step - n_steps, n_steps, energy_last, state.step)
        self.pending = 0
        self.n_chunks += 1
        self._chunk_launched(state, energy_last)

    def settle(self, state, timers=None) -> None:
        """Run and verify every queued step: the state is then exact and current (one synchronisation)."""
        self.flush(state, timers)
        self._verify(state, timers)

    def _chunk_launched(self, state, energy_last: bool) -> None:
        """After a chunk's launch (nothing by default)."""

    def _launch(self, state, n_steps: int, energy_last: bool) -> None:
        """Run ``n_steps`` steps (energy on the last one if asked) as one graph."""
        self._graph(n_steps, energy_last).launch()

    def _graph(self, n_steps: int, energy_last: bool):
        """The graph of ``n_steps`` steps (energy on the last one if asked), captured on first use from the
        subclass's ``_record_save()`` and ``_record_step(energy)`` on its private stream ``_stream``, the
        [flag] kernels in IF nodes where they work (collective with several ranks: NCCL calls are captured
        on every rank in the same order)."""
        key = (n_steps, bool(energy_last))
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= MAX_GRAPHS:
                self._graphs.clear()   # the host synchronised after every launch: none is running
            conditionals = graph_conditionals_here()

            def record():
                self._skip = rebuild_skip(self._stream if conditionals else None, self.watch)
                try:
                    self._record_save()
                    for number in range(n_steps):
                        self._record_step(energy_last and number == n_steps - 1)
                finally:
                    self._skip = rebuild_skip(None, self.watch)

            # Capture on the private stream; ``on_stream`` keeps the compute stream current afterwards.
            with on_stream(self._stream):
                graph = capture_graph(self._stream, record)
            upload = getattr(graph, "upload", None)
            if upload is not None:
                upload()   # device-side setup now, not inside the first launch
            self._graphs[key] = graph
            self.n_captures += 1
        return graph


def _phase(timers, name):
    return contextlib.nullcontext() if timers is None else timers.phase(name)
