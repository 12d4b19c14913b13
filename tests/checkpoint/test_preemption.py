"""Preemption flags and wall-time limits (one process; the multi-rank path is in test_restart_mpi)."""

import os
import signal
import time

import pytest

from hpcgpu.checkpoint import EXIT_REQUEUE, Preemption
from hpcgpu.checkpoint.preemption import parse_slurm_duration


def test_a_signal_only_sets_a_flag_until_the_next_step_boundary(serial_comm):
    with Preemption(serial_comm, wall_time_limit=None) as pre:
        assert not pre.should_stop(1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert pre.received_signal == signal.SIGUSR1
        assert pre.should_stop(2) and "signal" in pre.reason and "step 2" in pre.reason
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL or signal.getsignal(signal.SIGUSR1) != pre._on_signal


def test_the_wall_time_limit_stops_before_the_deadline(serial_comm):
    pre = Preemption(serial_comm, wall_time_limit=0.3, margin_seconds=0.1, signals=())
    assert not pre.should_stop(0)
    time.sleep(0.25)
    assert pre.should_stop(1) and "wall-time limit" in pre.reason
    assert pre.seconds_left() < 0.1


def test_the_automatic_margin_covers_a_step_and_the_final_checkpoint(serial_comm):
    pre = Preemption(serial_comm, wall_time_limit=100.0, signals=())
    pre.should_stop(0)
    time.sleep(0.05)
    pre.should_stop(1)
    pre.record_checkpoint_seconds(3.0)
    assert 6.1 <= pre.margin < 7.0


def test_slurm_durations_and_the_exit_code():
    assert EXIT_REQUEUE == 75
    assert parse_slurm_duration("1-02:03:04") == 86400 + 7384
    assert parse_slurm_duration("05:00") == 300
    assert parse_slurm_duration("UNLIMITED") is None


def test_slurm_end_time_sets_the_limit(serial_comm, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 600))
    pre = Preemption(serial_comm, signals=())
    assert pre.wall_time_limit == pytest.approx(600, abs=2)
    assert pre.margin == pytest.approx(30.0)  # the Slurm safety margin before any step was timed
