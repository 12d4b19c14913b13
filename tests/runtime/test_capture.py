"""Graph captures in progress, and work held back until they end (hpcgpu.runtime.capture).

A device synchronisation inside a capture breaks it, and the garbage collector may run a finaliser that
needs one (the MD slab driver's) in the middle of another driver's capture. CPU (CI): with a stream that
records the calls, the capture count, deferral (nested captures, a failing capture, failing deferred
work) and the slab driver's finaliser during a capture. The GPU side is in
tests/apps/md/test_md_resident_slab.py (a driver collected during the next one's capture).
"""

import gc

import pytest

from hpcgpu.runtime import capture


class RecordingStream:
    """Stands in for a cupy.cuda.Stream: records begin / end of captures into ``log``."""

    def __init__(self, log):
        self.log = log

    def begin_capture(self):
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        return "graph"


def test_capture_returns_the_graph_and_counts_itself():
    log = []

    def record():
        log.append(("record", capture.in_progress()))

    assert not capture.in_progress()
    assert capture.capture_graph(RecordingStream(log), record) == "graph"
    assert log == ["begin", ("record", True), "end"]
    assert not capture.in_progress()


def test_work_waits_for_the_outermost_capture():
    log = []
    stream = RecordingStream(log)
    capture.when_not_capturing(lambda: log.append("at once"))

    def inner():
        capture.when_not_capturing(lambda: log.append("deferred"))
        log.append("recorded")

    capture.capture_graph(stream, lambda: capture.capture_graph(stream, inner))
    assert log == ["at once", "begin", "begin", "recorded", "end", "end", "deferred"]


def test_a_failing_capture_is_ended_and_its_deferred_work_still_runs():
    log = []

    def record():
        capture.when_not_capturing(lambda: log.append("deferred"))
        raise ValueError("kernel argument")

    with pytest.raises(ValueError, match="kernel argument"):
        capture.capture_graph(RecordingStream(log), record)
    assert log == ["begin", "end", "deferred"] and not capture.in_progress()


def test_failing_deferred_work_is_a_warning_not_an_error_of_the_capture():
    def record():
        capture.when_not_capturing(lambda: 1 / 0)

    with pytest.warns(RuntimeWarning, match="ZeroDivisionError"):
        assert capture.capture_graph(RecordingStream([]), record) == "graph"


def test_slab_driver_collected_during_a_capture_drops_its_graphs_after_it(monkeypatch):
    """The MD slab driver's finaliser synchronises the device before dropping its graphs (they hold NCCL
    operations); run by the garbage collector inside another capture it must wait for that capture's end."""
    from apps.md import resident_slab

    log = []
    monkeypatch.setattr(resident_slab, "_drop_after_device", lambda graphs, stream: log.append(("drop", sorted(graphs), stream)))
    driver = resident_slab.SlabResidentSteps.__new__(resident_slab.SlabResidentSteps)
    driver._graphs = {(25, False): "graph a", (25, True): "graph b"}
    driver._stream = "its stream"
    driver.cycle = driver   # garbage only the collector finds, as a driver and its state are
    del driver

    def record():
        gc.collect()
        log.append("recorded")

    capture.capture_graph(RecordingStream(log), record)
    assert log == ["begin", "recorded", "end", ("drop", [(25, False), (25, True)], "its stream")]


def test_slab_driver_closed_outside_a_capture_drops_its_graphs_at_once(monkeypatch):
    from apps.md import resident_slab

    log = []
    monkeypatch.setattr(resident_slab, "_drop_after_device", lambda graphs, stream: log.append(len(graphs)))
    driver = resident_slab.SlabResidentSteps.__new__(resident_slab.SlabResidentSteps)
    driver._graphs = {(25, False): "graph"}
    driver.close()
    driver.close()   # nothing left: no second drop
    assert log == [1] and driver._graphs == {}


def test_every_capture_of_the_package_and_apps_goes_through_capture_graph():
    """A capture begun elsewhere would not be counted, and a finaliser could synchronise inside it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    counted = root / "hpcgpu" / "runtime" / "capture.py"
    elsewhere = [str(path.relative_to(root)) for folder in ("hpcgpu", "apps") for path in (root / folder).rglob("*.py")
                 if path != counted and ".begin_capture(" in path.read_text()]
    assert elsewhere == []
