"""Replay several time steps as one CUDA graph (for small grids, where launch overhead dominates).

The steps are captured once on the compute stream; kernels, halo packing and NCCL transfers on the
communication stream (which joins the capture through events) all become graph nodes. Replaying
costs one launch instead of dozens. Only steps that never synchronise with the host can be
captured: the driver asks the model (``capturable(n)``) before each replay. The simulation driver keeps
one graph per length it replays (2, 4, ..., 32 steps: :func:`hpcgpu.simulation.driver.graph_window`).
"""

from __future__ import annotations

import contextlib

from hpcgpu.runtime.capture import capture_graph


class NullTimers:
    """Timers that record nothing (events cannot be timed inside a graph capture)."""

    def phase(self, name, stream=None):
        return contextlib.nullcontext()


class StepGraph:
    """``n_steps`` calls of ``model.step`` captured as one CUDA graph.

    The model's Python state (its step counter, ping-pong buffer order) must be the same before and
    after the ``n_steps`` steps, apart from the step counter, which is restored after capture and
    advanced by :meth:`launch`. Use an even number of steps for two-buffer schemes.
    """

    def __init__(self, arch, model, n_steps: int = 2):
        self.arch, self.model, self.n_steps = arch, model, n_steps
        stream = arch.compute_stream
        # A capture records only work queued on the capturing stream: kernels on any other stream
        # would run once, now, and the graph would replay without them.
        arch.check_compute_stream("capturing steps as a CUDA graph")
        step_index = model.step_index

        def record():
            for _ in range(n_steps):
                model.step(NullTimers())

        try:
            self.graph = capture_graph(stream, record)
        finally:
            model.step_index = step_index

    def launch(self, timers) -> None:
        """Run the captured steps once (on the compute stream) and advance the model's counter."""
        with timers.phase("compute"):
            self.graph.launch(self.arch.compute_stream)
        self.model.step_index += self.n_steps
