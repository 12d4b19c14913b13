"""records_kept: the records a restarted run keeps are exactly those an uninterrupted run holds at its restart step."""

import pytest

from hpcgpu.simulation.continuation import records_kept
from hpcgpu.simulation.triggers import AtEnd, Periodic


def written(trigger, first, last, final):
    """The steps at which ``trigger`` writes in a job running first..last of a run ending at ``final``
    (step ``first`` itself only for a fresh job, as the initial record)."""
    return [step for step in range(first if first == 0 else first + 1, last + 1) if trigger(step, final)]


@pytest.mark.parametrize("trigger", [Periodic(2) | AtEnd(), Periodic(3), Periodic(1), AtEnd()], ids=repr)
@pytest.mark.parametrize("stop", range(0, 9))
def test_a_job_chain_ends_with_the_records_of_the_uninterrupted_run(trigger, stop):
    final = 8
    uninterrupted = written(trigger, 0, final, final)
    # The first job ends at ``stop`` (its own final step: an AtEnd record there), the second continues.
    file = written(trigger, 0, stop, stop)
    file = file[:records_kept(file, stop, final, trigger)] + written(trigger, stop, final, final)
    assert file == uninterrupted


def test_records_after_the_restart_step_are_dropped_and_those_before_kept():
    steps = [0, 5, 10, 15]
    assert records_kept(steps, 10, 20, Periodic(5)) == 3   # 0, 5, 10 (a record at 10 is on the schedule)
    assert records_kept(steps, 12, 20, Periodic(5)) == 3   # 15: written after the checkpoint of step 12
    assert records_kept(steps, 15, 20, Periodic(10)) == 3  # 15: not a record of the continuing run
    assert records_kept(steps, 0, 20, Periodic(5)) == 0    # a restart from step 0 writes step 0 again
    assert records_kept([], 10, 20, Periodic(5)) == 0
