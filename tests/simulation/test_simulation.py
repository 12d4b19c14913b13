"""The simulation driver (hpcgpu.simulation): triggers, operations, the run loop on 1 and 2 ranks,
the NaN check and the CUDA-graph decision."""

import os
import tempfile
import types

import numpy as np
import pytest

import hpcgpu
from hpcgpu.app.checksum import hash_arrays
from hpcgpu.app.cli import FrozenOptions, common_parser, parse_args
from hpcgpu.errors import ConfigurationError, NumericalError
from hpcgpu.simulation import AtEnd, Model, Operation, Periodic, Simulation, Trigger, nccl_channel_limit, use_graphs
from hpcgpu.simulation.driver import graph_blocker
from hpcgpu.simulation import driver
from hpcgpu.simulation.driver import graph_window
from hpcgpu.simulation.triggers import Always


class Counter(Model):
    """A toy model: ``n_cells`` values split over the ranks, each step adds 1 to every value.

    ``nan_at``: the last rank writes a NaN into its first value at that step (the NaN check's test).
    """

    name = "counter"
    unit = "cell-updates/s"
    default_steps = 10

    def __init__(self, comm, arch, n_cells=13, nan_at=None):
        self.comm, self.arch, self.n_cells, self.nan_at = comm, arch, n_cells, nan_at
        bounds = np.linspace(0, n_cells, comm.size + 1).astype(int)
        self.values = np.arange(bounds[comm.rank], bounds[comm.rank + 1], dtype=np.float64)
        self.step_index = 0
        self.updates_per_step = n_cells
        self.events = []

    def step(self, timers):
        with timers.phase("compute"):
            self.values += 1.0
        self.step_index += 1
        if self.nan_at == self.step_index and self.comm.rank == self.comm.size - 1:
            self.values[0] = np.nan

    def describe(self):
        return f"counter of {self.n_cells} cells"

    def decomposition(self):
        return {"cells": self.n_cells}

    def checkpoint_state(self):
        return {"replicated": {"step": self.step_index}}

    def checksum(self):
        everything = np.concatenate(self.comm.mpi.allgather(self.values))
        return hash_arrays([("values", everything)])

    def finite_arrays(self):
        return [self.values]

    def prepare(self):
        self.events.append("prepare")

    def close(self):
        self.events.append("close")


class Recorder(Operation):
    """Records the steps at which it acted (and its begin/end calls)."""

    def __init__(self, trigger):
        super().__init__(trigger)
        self.calls = []

    def begin(self, simulation):
        self.calls.append("begin")

    def act(self, simulation):
        self.calls.append(simulation.model.step_index)

    def end(self, simulation):
        self.calls.append("end")


def _options(directory, *extra):
    return parse_args(common_parser("toy", "a toy app"), ["--output", str(directory), "--quiet", *extra])


def _shared_directory(comm):
    return comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcgpu-simulation-") if comm.rank == 0 else None, root=0)


# ---------------------------------------------------------------------------------------------- triggers
def test_triggers_fire_at_the_right_steps():
    fired = lambda trigger, final=10: [s for s in range(1, final + 1) if trigger(s, final)]  # noqa: E731
    assert fired(Periodic(3)) == [3, 6, 9]
    assert fired(Periodic(0)) == []                       # --*-every 0: never
    assert fired(AtEnd()) == [10]
    assert fired(Periodic(4) | AtEnd()) == [4, 8, 10]     # thermo lines: every 4 steps and the last
    assert fired(Periodic(5) & ~AtEnd()) == [5]           # evaluations: not at the last step
    assert fired(Always()) == list(range(1, 11))
    with pytest.raises(ValueError):
        Periodic(-1)


def test_operations_act_when_their_trigger_fires_in_order(tmp_path):
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    model = Counter(comm, arch)
    every_third, at_end = Recorder(Periodic(3)), Recorder(AtEnd())
    simulation = Simulation(comm, arch, model, _options(tmp_path), app="toy", output=tmp_path, final_step=10,
                            operations=[every_third, at_end])
    summary = simulation.run()
    assert every_third.calls == ["begin", 3, 6, 9, "end"]
    assert at_end.calls == ["begin", 10, "end"]
    assert model.events == ["prepare", "close"]
    assert summary["steps"] == 10 and summary["first_step"] == 0 and summary["final_step"] == 10
    assert summary["throughput"] == pytest.approx(13 * 10 / summary["wall_seconds"])
    assert set(summary["timers"]) >= {"compute", "host overhead"}


# ---------------------------------------------------------------------------------------------- the run loop
@pytest.mark.mpi(ranks=[1, 2], timeout=120)
def test_a_toy_model_runs_through_the_driver_on_any_rank_count(comm):
    directory = _shared_directory(comm)
    arch = hpcgpu.arch.CPU()
    model = Counter(comm, arch)
    summary = Simulation(comm, arch, model, _options(directory, "--summary", f"{directory}/summary.json"),
                         app="toy", output=directory).run()   # default_steps: 10
    expected = hash_arrays([("values", np.arange(13, dtype=np.float64) + 10)])
    assert summary["checksum"] == expected                   # the same on 1 and 2 ranks
    assert summary["n_ranks"] == comm.size and summary["steps"] == 10 and summary["decomposition"] == {"cells": 13}
    assert "graph" not in summary                           # the toy adds no keys of its own
    comm.barrier()
    assert os.path.exists(f"{directory}/summary.json")


@pytest.mark.mpi(ranks=[1, 2], timeout=120)
def test_nan_check_raises_the_same_error_on_every_rank(comm):
    directory = _shared_directory(comm)
    arch = hpcgpu.arch.CPU()
    model = Counter(comm, arch, nan_at=3)
    simulation = Simulation(comm, arch, model, _options(directory), app="toy", output=directory, final_step=10,
                            nan_check=Periodic(2))
    with pytest.raises(NumericalError) as caught:
        simulation.run()
    # Checked at step 4 (every 2 steps), found on the last rank only, raised on every rank with one text.
    assert model.step_index == 4
    assert f"at step 4 (ranks [{comm.size - 1}])" in str(caught.value)
    assert caught.value.replicated   # every rank raises it: exit code 2, one message
    assert comm.mpi.allgather(str(caught.value)) == [str(caught.value)] * comm.size
    assert model.events == ["prepare", "close"]


def test_the_final_state_is_checked_even_without_a_periodic_check(tmp_path):
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    model = Counter(comm, arch, nan_at=7)
    with pytest.raises(NumericalError, match="at step 10"):
        Simulation(comm, arch, model, _options(tmp_path), app="toy", output=tmp_path, final_step=10).run()


# ---------------------------------------------------------------------------------------------- CUDA graphs
def test_graph_decision():
    cpu, gpu = hpcgpu.arch.CPU(), types.SimpleNamespace(is_gpu=True)
    capturable = types.SimpleNamespace(name="swe", graph_unsupported=None)
    never = types.SimpleNamespace(name="latlon", graph_unsupported="the polar filter gathers on the host")
    for model in (capturable, never):
        for graph in (None, True, False):
            assert use_graphs(graph, cpu, model) is False        # the CPU has no graphs: no effect
    assert use_graphs(None, gpu, capturable) is True              # default on the GPU: graphs
    assert use_graphs(None, gpu, never) is False                  # ... where the model can be captured
    assert use_graphs(True, gpu, capturable) is True              # --graph
    assert use_graphs(False, gpu, capturable) is False            # --no-graph
    with pytest.raises(ConfigurationError, match="--graph does not apply to latlon: the polar filter"):
        use_graphs(True, gpu, never)


def test_graphs_need_a_capturable_transport_between_ranks():
    """A CUDA graph replays stream work only: halo messages that MPI sends from the host (mpi-staged,
    mpi-cuda) would be skipped on replay, so several ranks exchanging through them step eagerly, and
    --graph is refused with the reason; NCCL, one rank, or a model whose steps do not use the job's
    transport (Jacobi's --peer-halo) keep graphs."""
    gpu = types.SimpleNamespace(is_gpu=True)
    swe = types.SimpleNamespace(name="swe", graph_unsupported=None, steps_use_job_transport=True)
    peer = types.SimpleNamespace(name="jacobi", graph_unsupported=None, steps_use_job_transport=False)
    for transport in ("mpi-staged", "mpi-cuda"):
        assert use_graphs(None, gpu, swe, transport, n_ranks=2) is False
        assert use_graphs(None, gpu, swe, transport, n_ranks=1) is True     # one rank: local copies only
        assert use_graphs(None, gpu, peer, transport, n_ranks=2) is True
        assert use_graphs(False, gpu, swe, transport, n_ranks=2) is False
        with pytest.raises(ConfigurationError, match=f"--graph does not apply to swe: .*the {transport} transport"):
            use_graphs(True, gpu, swe, transport, n_ranks=2)
        assert transport in graph_blocker(gpu, swe, transport, 2)
    assert use_graphs(None, gpu, swe, "nccl", n_ranks=2) is True
    assert use_graphs(True, gpu, swe, "nccl", n_ranks=8) is True
    assert graph_blocker(gpu, swe, "nccl", 2) is None and graph_blocker(hpcgpu.arch.CPU(), swe, "mpi", 2) is None


def test_graph_flag_is_recorded_false_on_the_cpu(tmp_path, capsys):
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    options = parse_args(common_parser("toy", "a toy app"), ["--output", str(tmp_path)])
    simulation = Simulation(comm, arch, Counter(comm, arch), options, app="toy", output=tmp_path, graph=True)
    simulation.run()
    assert simulation.graph_used is False
    assert "note: --graph has no effect on the CPU" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- configuration
def test_nccl_channel_limit_is_set_for_the_block_only(monkeypatch):
    monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    with nccl_channel_limit(2):
        assert os.environ["NCCL_MAX_NCHANNELS"] == "2"
    assert "NCCL_MAX_NCHANNELS" not in os.environ
    with nccl_channel_limit(0):
        assert "NCCL_MAX_NCHANNELS" not in os.environ
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "8")   # the user's value wins and stays
    with nccl_channel_limit(2):
        assert os.environ["NCCL_MAX_NCHANNELS"] == "8"
    assert os.environ["NCCL_MAX_NCHANNELS"] == "8"


def test_frozen_options_resolve_without_changing_the_parsed_options(tmp_path):
    parsed = _options(tmp_path)
    frozen = FrozenOptions(parsed, steps=5, extra="x")
    assert frozen.steps == 5 and frozen.extra == "x" and parsed.steps is None
    assert frozen.as_dict()["output"] == str(tmp_path)
    with pytest.raises(AttributeError, match="read-only"):
        frozen.steps = 6
    with pytest.raises(AttributeError):
        frozen.no_such_option


class CapturableCounter(Counter):
    """The toy model as a capturable one; its own output (every ``output_every`` steps, 0: none) must
    see its steps, so no window may hold one before its last step."""

    def __init__(self, comm, arch, output_every=0, **kwargs):
        super().__init__(comm, arch, **kwargs)
        self.output_every = output_every
        self.windows = []   # (first step, steps) of each replay

    def capturable(self, n_steps):
        every = self.output_every
        return not every or not any((self.step_index + k) % every == 0 for k in range(1, n_steps))


class FakeGraph:
    """Stands in for StepGraph on the CPU: records each replay and runs its steps eagerly."""

    captured = []

    def __init__(self, arch, model, n_steps):
        self.model, self.n_steps = model, n_steps
        FakeGraph.captured.append(n_steps)

    def launch(self, timers):
        self.model.windows.append((self.model.step_index, self.n_steps))
        for _ in range(self.n_steps):
            self.model.step(timers)


class LateRecorder(Recorder):
    """A recorder that any later step serves (like the progress line)."""

    exact_steps = False


def _run_windows(directory, monkeypatch, graphs, final_step, nan_every, operations=(), output_every=0, extra=()):
    """Run the capturable toy with (``graphs``) or without fake CUDA graphs on the CPU."""
    monkeypatch.setattr(driver, "use_graphs", lambda graph, arch, model, *transport: graphs)
    monkeypatch.setattr(FakeGraph, "captured", [])
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    model = CapturableCounter(comm, arch, output_every=output_every)
    simulation = Simulation(comm, arch, model, _options(directory, *extra), app="toy", output=directory,
                            final_step=final_step, nan_check=Periodic(nan_every), operations=operations)
    simulation.graph_class = FakeGraph
    return simulation, model, simulation.run()


def _crosses(windows, every):
    """The windows that hold a multiple of ``every`` before their last step."""
    return [(s, n) for s, n in windows if any((s + k) % every == 0 for k in range(1, n))]


class ParityCounter(CapturableCounter):
    """A capturable toy whose arrays swap every step, as two ping-pong buffers do."""

    def graph_key(self):
        return self.step_index % 2


class KeyedFakeGraph(FakeGraph):
    """A fake graph that knows the model's graph_key at capture and fails a replay under another one
    (a real graph would compute from the buffers it captured, silently wrong)."""

    def __init__(self, arch, model, n_steps):
        super().__init__(arch, model, n_steps)
        self.key = model.graph_key()

    def launch(self, timers):
        assert self.model.graph_key() == self.key, (self.model.step_index, self.n_steps, self.key)
        super().launch(timers)


def test_a_graph_replays_only_under_the_graph_key_it_was_captured_with(tmp_path, monkeypatch):
    """NaN check every 25: the eager steps at odd steps swap a ping-pong model's buffers; the driver keeps
    one graph per (length, graph_key) and never replays a graph on the swapped buffers."""
    monkeypatch.setattr(driver, "use_graphs", lambda graph, arch, model, *transport: True)
    monkeypatch.setattr(FakeGraph, "captured", [])
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    model = ParityCounter(comm, arch)
    simulation = Simulation(comm, arch, model, _options(tmp_path), app="toy", output=tmp_path, final_step=203,
                            nan_check=Periodic(25))
    simulation.graph_class = KeyedFakeGraph
    summary = simulation.run()
    assert model.step_index == 203
    assert {key for _, key in simulation.graphs} == {0, 1}         # both parities were replayed
    assert summary["checksum"] == hash_arrays([("values", np.arange(13, dtype=np.float64) + 203)])


def test_graph_windows_are_the_longest_that_end_by_the_next_event(tmp_path, monkeypatch):
    """NaN check every 25, checkpoints every 100, final step 1000: steps 1 and 2 eager, then the longest
    power-of-two windows (2 ... 32) that end no later than the next event, an eager step where an odd
    number of steps is left."""
    simulation, model, summary = _run_windows(tmp_path, monkeypatch, True, 1000, 25,
                                              extra=("--checkpoint-every", "100"))
    assert model.windows[:12] == [(2, 16), (18, 4), (22, 2),        # eager 25
                                  (25, 16), (41, 8),                # eager 50
                                  (50, 16), (66, 8),                # eager 75
                                  (75, 16), (91, 8),                # eager 100
                                  (100, 16), (116, 8),              # eager 125
                                  (125, 16)]
    assert _crosses(model.windows, 25) == [] and model.step_index == 1000
    assert sorted(FakeGraph.captured) == [2, 4, 8, 16]                 # each length captured once, when first used
    assert simulation.graph_used
    assert simulation.control.last_saved_step == 1000
    assert summary["checksum"] == hash_arrays([("values", np.arange(13, dtype=np.float64) + 1000)])


def test_graph_windows_grow_to_the_longest_graph(tmp_path, monkeypatch):
    """A NaN check every 100 steps: 98 = 3 x 32 + 2 steps to the first, 3 x 32 + 4 to each next; the
    final step 1030 ends the last ones. A model whose own output comes every 40 steps refuses windows
    across those steps (Model.capturable)."""
    _, model, _ = _run_windows(tmp_path, monkeypatch, True, 1030, 100)
    assert model.windows[:8] == [(2, 32), (34, 32), (66, 32), (98, 2), (100, 32), (132, 32), (164, 32), (196, 4)]
    assert sorted(FakeGraph.captured) == [2, 4, 8, 16, 32]
    assert model.windows[-4:] == [(1000, 16), (1016, 8), (1024, 4), (1028, 2)]   # up to the final step
    _, model, _ = _run_windows(tmp_path / "output", monkeypatch, True, 1030, 100, output_every=40)
    assert _crosses(model.windows, 40) == [] and _crosses(model.windows, 100) == []
    assert model.windows[:4] == [(2, 32), (34, 4), (38, 2), (40, 32)]


def test_graph_windows_give_the_operations_the_steps_of_the_eager_loop(tmp_path, monkeypatch):
    """Operations that must see their steps (NaN check, an app operation every 7 steps but not at the end)
    act at the same steps with and without graphs; one that any later step serves acts once per
    firing, at the end of the window that passed it."""
    calls = {}
    for graphs in (False, True):
        exact, late = Recorder(Periodic(7) & ~AtEnd()), LateRecorder(Periodic(10))
        _, model, summary = _run_windows(tmp_path / str(graphs), monkeypatch, graphs, 300, 25,
                                         operations=[exact, late], output_every=30)
        calls[graphs] = exact.calls, late.calls, summary["checksum"], model.windows
    exact_eager, late_eager, checksum_eager, windows_eager = calls[False]
    exact_graph, late_graph, checksum_graph, windows = calls[True]
    assert windows_eager == [] and windows and _crosses(windows, 7) == []
    assert exact_graph == exact_eager == ["begin", *range(7, 300, 7), "end"]
    assert checksum_graph == checksum_eager
    assert late_eager == ["begin", *range(10, 301, 10), "end"]
    inside = {s + k for s, n in windows for k in range(1, n)}       # steps the loop never sees
    reached = [step for step in range(1, 301) if step not in inside]
    expected = [next(step for step in reached if step >= due) for due in range(10, 301, 10)]
    assert late_graph[1:-1] == sorted(set(expected)) and late_graph[1:-1] != late_eager[1:-1]


def test_graph_window_function():
    """graph_window: the longest allowed power of two that fits, 0 when not even 2 steps fit."""
    always = lambda n_steps: True   # noqa: E731
    assert graph_window(2, 100, always) == 32                       # MAX_GRAPH_STEPS
    assert graph_window(2, 100, always, longest=64) == 64
    assert graph_window(66, 100, always, longest=64) == 32
    assert graph_window(98, 100, always) == 2
    assert graph_window(99, 100, always) == 0
    assert graph_window(0, 1000, always, longest=128) == 128
    assert graph_window(0, 1000, always, longest=48) == 32           # powers of two only: even
    assert graph_window(0, 1000, lambda n_steps: n_steps <= 8) == 8  # the model allows 8 at most


def test_next_step_agrees_with_asking_every_step():
    """Trigger.next_step (arithmetic) finds the step that asking trigger(step, final) step by step finds."""
    leaves = [Periodic(0), Periodic(1), Periodic(2), Periodic(3), Periodic(7), Periodic(25), Periodic(100),
              AtEnd(), Always()]
    combined = [a | b for a in leaves for b in leaves] + [a & b for a in leaves for b in leaves] + \
        [~a for a in leaves] + [a & ~b for a in leaves for b in leaves] + [~(a | b) for a in leaves for b in leaves] + \
        [(a | b) & ~c for a in leaves[3:6] for b in leaves for c in leaves]

    def probe(trigger, after, final):
        return next((step for step in range(after + 1, final + 1) if trigger(step, final)), None)

    for trigger in leaves + combined:
        for final in (0, 1, 7, 60, 101):
            for after in range(0, final + 2, 3 if final > 7 else 1):
                assert trigger.next_step(after, final) == probe(trigger, after, final), (trigger, after, final)
    assert Trigger.next_step(Periodic(4), 5, 10) == 8               # the base class asks step by step


class PingPong(Model):
    """A capturable toy on the device: two buffers, each step writes ``1.0001 * a + 1`` into the other."""

    name = "pingpong"
    unit = "cell-updates/s"
    updates_per_step = 1000

    def __init__(self, arch):
        self.arch = arch
        self.buffers = [arch.xp.linspace(0.0, 1.0, 1000), arch.xp.zeros(1000)]
        self.step_index = 0

    def step(self, timers):
        a, b = self.buffers
        with timers.phase("compute"):
            self.arch.xp.multiply(a, 1.0001, out=b)
            b += 1.0
        self.buffers = [b, a]
        self.step_index += 1

    def capturable(self, n_steps):
        return True

    def graph_key(self):
        return id(self.buffers[0])   # an odd number of eager steps swaps the buffers a graph baked in

    def describe(self):
        return "ping-pong"

    def decomposition(self):
        return {}

    def checkpoint_state(self):
        return {}

    def finite_arrays(self):
        return [self.buffers[0]]

    def checksum(self):
        return hash_arrays([("values", self.arch.to_host(self.buffers[0]))])


@pytest.mark.gpu
def test_graph_windows_on_a_gpu_give_the_eager_checksum(cupy, tmp_path):
    """Real CUDA graphs of 2 ... 16 steps (a NaN check every 25 steps, an odd final step) replay the
    eager steps bitwise (the buffers swap at every step: even lengths only); an operation every 50
    steps sees the same steps."""
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="cupy")
    results = {}
    for graph in (False, True):
        recorder = Recorder(Periodic(50))
        simulation = Simulation(comm, arch, PingPong(arch), _options(tmp_path / str(graph)), app="toy",
                                output=tmp_path / str(graph), final_step=203, nan_check=Periodic(25),
                                operations=[recorder], graph=graph)
        summary = simulation.run()
        results[graph] = summary["checksum"], recorder.calls, sorted({n for n, _ in simulation.graphs})
    assert results[True][:2] == results[False][:2]
    assert results[False][2] == [] and results[True][2] == [2, 4, 8, 16]   # 23 = 16 + 4 + 2 + 1 eager ...
