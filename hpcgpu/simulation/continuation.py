"""Which records of an output file a restarted run keeps: :func:`records_kept`.

A run continued from a checkpoint at step R appends to the output file of the job before it. That
file may hold records an uninterrupted run would not have at this point::

    record at step s      kept?   why
    s < R                 yes     written before the checkpoint; this run does not compute them again
    s == R, trigger fires yes     an uninterrupted run writes it too (this run does not: it starts after R)
    s == R, trigger quiet no      the extra record of a job that ended at R (its last step, a stop request)
    s > R                 no      written after the checkpoint; this run computes and writes them again
    R == 0                none    (``--restart latest`` before any checkpoint) the run writes step 0 again

so that the finished file equals the uninterrupted run's, record for record. ``trigger`` is asked as
``trigger(R, final_step)`` with the final step of the *continuing* run: a record that an earlier job
wrote at its own last step (``AtEnd``) is dropped when the continuing run ends later. Every writer of
appendable output (:class:`hpcgpu.simulation.netcdf_output.NetCDFOutput`, the shallow-water snapshot files of
:mod:`apps.stencil.snapshots`) cuts its file at :func:`records_kept`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcgpu.simulation.triggers import Trigger


def records_kept(steps: Sequence[int], first_step: int, final_step: int, trigger: Trigger) -> int:
    """How many leading records a run restarted at ``first_step`` keeps (the rest are dropped).

    Parameters
    ----------
    steps : sequence of int, shape (n_records,)
        The model step of each record in the file, in file order (increasing).
    first_step : int
        The step the run continues from (the checkpoint's step; 0 when no checkpoint was found).
    final_step : int
        The step the continuing run ends at.
    trigger : Trigger
        When the output writes a record (``trigger(step, final_step)``), as in the continuing run.

    Returns
    -------
    int
        The number of records to keep, ``0 <= n <= len(steps)``: the file is truncated to it.
    """
    for index, step in enumerate(steps):
        step = int(step)
        if step > first_step or (step == first_step and (step == 0 or not trigger(step, final_step))):
            return index
    return len(steps)
