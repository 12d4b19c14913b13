"""kill -9 at seeded moments: every earlier record of every appended file stays readable, and the
restarted job (the same command: ``--restart latest``) ends with the uninterrupted run's file.

One or two kills per app and output kind (``benchmarks/fault_campaign.py`` runs many more: see
docs/reliability.md). A kill lands either after the ranks have started (a random moment of the run)
or just after the file counted a given record (while records are being written).
"""

from __future__ import annotations

import random
import signal

import pytest

from tests.faults.scenarios import SCENARIOS, kill_and_restart, reference_contents

pytestmark = pytest.mark.slow

CASES = [  # (scenario, seed, target ranks, kill after this many records are counted: 0 = any time, signal)
    ("stencil-channel", 1, "all", 0, signal.SIGKILL),
    ("stencil-channel", 2, 0, 6, signal.SIGKILL),
    ("stencil-latlon", 3, 1, 3, signal.SIGKILL),
    ("md-h5md", 4, "all", 0, signal.SIGKILL),
    ("user-model", 5, 0, 5, signal.SIGKILL),
    ("stencil-channel", 6, "all", 4, signal.SIGTERM),   # a stop request: checkpoint, exit 75, requeue
    ("user-model", 7, "all", 3, signal.SIGUSR1),
]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def reference(name):
        if name not in cache:
            cache[name] = reference_contents(SCENARIOS[name], tmp_path_factory.mktemp(f"reference-{name}"))
        return cache[name]
    return reference


@pytest.mark.parametrize("name,seed,target,after_records,sig", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[4].name}" for c in CASES])
def test_a_killed_job_loses_no_earlier_record_and_its_restart_equals_the_uninterrupted_run(
        tmp_path, references, name, seed, target, after_records, sig):
    delay = random.Random(seed).uniform(0.0, 0.3) if after_records else random.Random(seed).uniform(0.5, 2.5)
    result = kill_and_restart(SCENARIOS[name], tmp_path, references(name), delay, target, after_records,
                              log=tmp_path / "killed.log", sig=sig)
    assert result.readable, result.detail
    assert result.prefix_equal, result.detail
    assert result.restart_equal, result.detail
