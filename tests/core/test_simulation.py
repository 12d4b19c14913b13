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
from hpcgpu.simulation import AtEnd, Model, Operation, Periodic, Simulation, nccl_channel_limit, use_graphs
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


def test_graphs_never_replay_across_a_step_an_operation_must_see(tmp_path):
    """A 2-step graph that would jump over step 25 of a NaN check every 25 steps (or step 7 of an app
    operation every 7) is not replayed there; progress, model output and checkpoints do not hold it back."""
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU()
    model = Counter(comm, arch)
    simulation = Simulation(comm, arch, model, _options(tmp_path), app="toy", output=tmp_path, final_step=100,
                            nan_check=Periodic(25), operations=[Recorder(Periodic(7))])
    blocked = []
    for step in range(0, 99):
        model.step_index = step
        if not simulation.window_is_clear(2):
            blocked.append(step + 1)
    assert blocked == [7, 14, 21, 25, 28, 35, 42, 49, 50, 56, 63, 70, 75, 77, 84, 91, 98]
