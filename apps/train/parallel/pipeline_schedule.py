"""Pipeline schedules: the order of forward and backward micro-batch operations on each stage.

An operation is ``("F", m)`` (forward of micro-batch ``m``) or ``("B", m)`` (its backward). GPipe runs
all forwards, then all backwards; 1F1B runs ``min(P - s - 1, M)`` warm-up forwards on stage ``s``,
then one forward and one backward in turn, then the remaining backwards (see :mod:`apps.train.parallel.pipeline`
for the engine that executes them). Also here: the bubble formula, a replay of a schedule with fixed
operation times (deadlock check and bubble), and the split of the layers into stages.
"""

import numpy as np

from hpcgpu.errors import ConfigurationError


SCHEDULES = ("1f1b", "gpipe")


def gpipe_schedule(n_stages, n_micro, stage):
    """GPipe: ``[("F", 0) ... ("F", M-1), ("B", 0) ... ("B", M-1)]`` for every stage."""
    return [("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]


def one_f_one_b_schedule(n_stages, n_micro, stage):
    """1F1B for ``stage`` of ``n_stages``: warm-up forwards, one-forward-one-backward, drain."""
    warmup = min(n_stages - stage - 1, n_micro)
    operations = [("F", m) for m in range(warmup)]
    for index in range(n_micro - warmup):
        operations += [("F", warmup + index), ("B", index)]
    operations += [("B", m) for m in range(n_micro - warmup, n_micro)]
    return operations


def schedule_for(name, n_stages, n_micro, stage):
    """The operation list of ``stage`` under schedule ``name`` (``"1f1b"`` or ``"gpipe"``)."""
    if name not in SCHEDULES:
        raise ConfigurationError(f"pipeline schedule: expected one of {SCHEDULES}, found {name!r}")
    if n_micro < 1 or n_stages < 1 or not 0 <= stage < n_stages:
        raise ConfigurationError(
            f"pipeline schedule: expected micro-batches >= 1 and 0 <= stage < stages, found "
            f"{n_micro} micro-batches, stage {stage} of {n_stages}")
    make = one_f_one_b_schedule if name == "1f1b" else gpipe_schedule
    return make(n_stages, n_micro, stage)


def bubble_fraction(n_stages, n_micro):
    """Idle fraction of each stage with equal stage times: (P - 1) / (M + P - 1)."""
    return (n_stages - 1) / (n_micro + n_stages - 1)


def simulate_schedule(name, n_stages, n_micro, forward_seconds=1.0, backward_seconds=2.0):
    """Replay a schedule with fixed per-operation times and free communication.

    An operation starts when its stage is free and its input exists: ``F(s, m)`` after
    ``F(s-1, m)``, ``B(s, m)`` after ``B(s+1, m)`` (and after ``F(s, m)``, earlier on the stage).

    Returns
    -------
    dict
        ``makespan`` (seconds), ``idle_fraction`` (list over stages), ``peak_in_flight``
        (most micro-batches whose forward ran and backward did not, per stage).

    Raises
    ------
    RuntimeError
        When the schedule deadlocks (no stage can make progress).
    """
    operations = [schedule_for(name, n_stages, n_micro, stage) for stage in range(n_stages)]
    done, position = {}, [0] * n_stages
    free_at = [0.0] * n_stages
    in_flight, peak = [0] * n_stages, [0] * n_stages
    while any(position[s] < len(operations[s]) for s in range(n_stages)):
        progressed = False
        for stage in range(n_stages):
            if position[stage] == len(operations[stage]):
                continue
            kind, micro = operations[stage][position[stage]]
            needed = ((kind, stage - 1, micro) if kind == "F" and stage > 0 else
                      (kind, stage + 1, micro) if kind == "B" and stage < n_stages - 1 else None)
            if needed is not None and needed not in done:
                continue
            start = max(free_at[stage], done.get(needed, 0.0))
            free_at[stage] = start + (forward_seconds if kind == "F" else backward_seconds)
            done[(kind, stage, micro)] = free_at[stage]
            in_flight[stage] += 1 if kind == "F" else -1
            peak[stage] = max(peak[stage], in_flight[stage])
            position[stage] += 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name!r} deadlocks at positions {position}")
    makespan = max(free_at)
    busy = n_micro * (forward_seconds + backward_seconds)
    return {"makespan": makespan, "idle_fraction": [1.0 - busy / makespan] * n_stages,
            "peak_in_flight": peak}


def partition_stages(param_counts, n_stages, boundaries=None):
    """Cut ``len(param_counts)`` layers into ``n_stages`` contiguous, non-empty stages.

    Parameters
    ----------
    param_counts : list of int
        Parameters of each top-level layer.
    n_stages : int
    boundaries : list of int, optional
        The first layer of stages 1 .. P-1 (increasing). Default: the cut that minimises the
        largest stage's parameter count (ties: the earliest cut).

    Returns
    -------
    list of (int, int)
        ``(start, stop)`` layer ranges of the stages.
    """
    n_layers = len(param_counts)
    if not 1 <= n_stages <= n_layers:
        raise ConfigurationError(
            f"pipeline: {n_stages} stages need between 1 and {n_layers} (the number of layers); "
            "lower --pipeline-parallel or deepen the model")
    if boundaries is not None:
        cuts = [0] + [int(b) for b in boundaries] + [n_layers]
        if len(cuts) != n_stages + 1 or any(b >= c for b, c in zip(cuts, cuts[1:])):
            raise ConfigurationError(
                f"pipeline: stage boundaries {list(boundaries)} must be {n_stages - 1} increasing "
                f"layer indices in 1 .. {n_layers - 1}")
        return list(zip(cuts, cuts[1:]))
    prefix = np.concatenate([[0], np.cumsum(param_counts)])
    # best[s][i]: smallest possible largest stage when layers [0, i) form s stages
    best = np.full((n_stages + 1, n_layers + 1), np.inf)
    cut = np.zeros((n_stages + 1, n_layers + 1), dtype=int)
    best[0][0] = 0
    for stages in range(1, n_stages + 1):
        for stop in range(stages, n_layers + 1):
            for start in range(stages - 1, stop):
                value = max(best[stages - 1][start], prefix[stop] - prefix[start])
                if value < best[stages][stop]:
                    best[stages][stop], cut[stages][stop] = value, start
    ranges, stop = [], n_layers
    for stages in range(n_stages, 0, -1):
        ranges.append((int(cut[stages][stop]), stop))
        stop = int(cut[stages][stop])
    return ranges[::-1]
