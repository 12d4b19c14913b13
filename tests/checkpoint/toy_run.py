"""A small distributed simulation with checkpoints, run under mpiexec by the checkpoint tests.

State: a 2D field diffused with a 5-point stencil (halo exchange through hpcgpu), particles that
drift and get a random kick from a replicated NumPy Generator, and the model time. Every cell and
particle is updated by the same arithmetic on any rank count, so the final checksum is bitwise
the same for any decomposition and any sequence of restarts.

    mpiexec -n 4 python tests/checkpoint/toy_run.py --dir D --steps 20 --every 10 --result out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import hpcgpu  # noqa: E402
from hpcgpu.app.checksum import fields_checksum, hash_arrays  # noqa: E402
from hpcgpu.checkpoint import EXIT_REQUEUE, CheckpointManager, Preemption  # noqa: E402
from hpcgpu.checkpoint.filesystem import FAULT_VARIABLE  # noqa: E402

SHAPE = (24, 18)
N_PARTICLES = 50
DT = 0.1


def initial_state(grid, field):
    field.set_from_global(lambda y, x: np.sin(0.3 * y) * np.cos(0.2 * x) + 0.01 * y * x)
    rng = np.random.default_rng(1234)
    ids = np.arange(N_PARTICLES, dtype=np.int64)
    position = rng.uniform(0, SHAPE[0], size=(N_PARTICLES, 2))
    velocity = rng.standard_normal((N_PARTICLES, 2))
    return {"ids": ids, "position": position, "velocity": velocity}


def owned_mask(grid, position):
    """Particles whose row (y) lies in this rank's block of rows: exactly one owner each."""
    row = np.floor(position[:, 0]).astype(np.int64)
    columns = np.floor(position[:, 1] * SHAPE[1] / SHAPE[0]).astype(np.int64)
    inside_y = (row >= grid.local_start[0]) & (row < grid.local_stop[0])
    inside_x = (columns >= grid.local_start[1]) & (columns < grid.local_stop[1])
    return inside_y & inside_x


def migrate(comm, grid, particles):
    """Toy migration: everyone sees all particles (ordered by id) and keeps its own."""
    gathered = comm.mpi.allgather(particles)
    merged = {k: np.concatenate([g[k] for g in gathered]) for k in particles}
    order = np.argsort(merged["ids"], kind="stable")
    merged = {k: v[order] for k, v in merged.items()}
    keep = owned_mask(grid, merged["position"])
    return {k: v[keep] for k, v in merged.items()}


def step(field, particles, rng):
    field.exchange_halos()
    d = field.data
    field.interior[...] = d[1:-1, 1:-1] + 0.1 * (d[:-2, 1:-1] + d[2:, 1:-1] + d[1:-1, :-2] + d[1:-1, 2:]
                                                  - 4 * d[1:-1, 1:-1])
    kick = rng.standard_normal(2)  # replicated generator: the same draw on every rank
    particles["velocity"] = particles["velocity"] + 0.05 * kick
    particles["position"] = np.mod(particles["position"] + DT * particles["velocity"], SHAPE[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, default=0)
    parser.add_argument("--restart", default=None)
    parser.add_argument("--result", default=None)
    parser.add_argument("--asynchronous", action="store_true")
    parser.add_argument("--fault-at-step", type=int, default=None)
    parser.add_argument("--fault", default="mid-rank-file:1")
    parser.add_argument("--signal-rank", type=int, default=None)
    parser.add_argument("--signal-step", type=int, default=None)
    parser.add_argument("--wall-time-limit", type=float, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    options = parser.parse_args()

    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        arch = hpcgpu.arch.auto(comm, backend="numpy")
        grid = hpcgpu.Decomposition(comm, SHAPE, periodic=(True, True))
        field = hpcgpu.Field(grid, arch, halo_width=1, name="u")
        ckpt = CheckpointManager(comm, options.dir, app="tests.toy", keep=2, asynchronous=options.asynchronous)
        pre = Preemption(comm, wall_time_limit=options.wall_time_limit, margin_seconds=0.2 if options.wall_time_limit else None)
        rng = np.random.default_rng(99)
        if options.restart:
            state = ckpt.load(options.restart, fields={"u": field}, particles=True,
                              particle_select_fn=lambda rows: owned_mask(grid, rows["position"]))
            step_index = state.step
            rng.bit_generator.state = state.replicated["rng_state"]
            model_time = state.replicated["time"]
            particles = state.particles
            assert state.replicated["config"] == {"shape": list(SHAPE), "dt": DT}
        else:
            step_index, model_time = 0, 0.0
            particles = initial_state(grid, field)
            particles = {k: v[owned_mask(grid, particles["position"])] for k, v in particles.items()}

        def save():
            if options.fault_at_step == step_index:
                ckpt.wait()  # an earlier asynchronous write must not meet the fault (it reads the variable late)
                os.environ[FAULT_VARIABLE] = options.fault
            ckpt.save(step_index, fields={"u": field}, particles=particles,
                      replicated={"time": model_time, "rng_state": rng.bit_generator.state,
                                  "config": {"shape": list(SHAPE), "dt": DT}},
                      metadata={"n_ranks": comm.size, "dims": list(grid.dims)})

        exit_code = 0
        while step_index < options.steps:
            step(field, particles, rng)
            particles = migrate(comm, grid, particles)
            step_index += 1
            model_time += DT
            time.sleep(options.sleep)
            ckpt.poll()
            if options.signal_rank == comm.rank and options.signal_step == step_index:
                os.kill(os.getpid(), signal.SIGUSR1)
            if pre.should_stop(step_index):
                save()
                ckpt.wait()
                if comm.rank == 0:
                    print(f"stopping: {pre.reason}", flush=True)
                exit_code = EXIT_REQUEUE
                break
            if options.every and step_index % options.every == 0:
                save()
        ckpt.close()
        gathered = comm.mpi.gather(particles, root=0)
        checksum = fields_checksum(comm, [field])
        if comm.rank == 0 and options.result:
            merged = {k: np.concatenate([g[k] for g in gathered]) for k in particles}
            order = np.argsort(merged["ids"])
            particle_sum = hash_arrays([(k, merged[k][order]) for k in sorted(merged)])
            Path(options.result).write_text(json.dumps({
                "step": step_index, "time": model_time, "field": checksum, "particles": particle_sum,
                "n_particles": int(order.size), "rng": int(rng.integers(1 << 62))}))
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
