"""Fixtures of the checkpoint tests: a one-process writer/reader (no MPI launch needed)."""

import numpy as np
import pytest

from tests.checkpoint.serial import BoxGrid, HostField, SerialComm

GLOBAL_SHAPE = (37, 23)


def make_state(seed=0):
    """A field, particles and replicated state with awkward types."""
    rng = np.random.default_rng(seed)
    field = HostField(BoxGrid(GLOBAL_SHAPE), name="h")
    field.data[...] = rng.standard_normal(GLOBAL_SHAPE)
    particles = {"ids": np.arange(40, dtype=np.int64), "position": rng.uniform(0, 37, (40, 3))}
    generator = np.random.default_rng(seed + 1)
    replicated = {"time": 0.1 * seed, "rng_state": generator.bit_generator.state,
                  "config": {"name": "test", "dims": [2, 2], "nested/key": None},
                  "optimizer": {"m": rng.standard_normal(5).astype(np.float32), "step": np.int64(seed)},
                  "scale": np.float32(65536.0), "blob": b"\x00\x01binary"}
    return field, particles, replicated


@pytest.fixture
def serial_comm():
    return SerialComm()


@pytest.fixture
def saved(tmp_path, serial_comm):
    """A checkpoint directory with steps 10 and 20 (the state of step s made with seed s)."""
    from hpcgpu.checkpoint import CheckpointManager

    manager = CheckpointManager(serial_comm, tmp_path / "ckpt", app="tests.app", keep=3)
    states = {}
    for step in (10, 20):
        field, particles, replicated = make_state(step)
        manager.save(step, fields={"h": field}, particles=particles, replicated=replicated, metadata={"step": step})
        states[step] = (field.data.copy(), particles, replicated)
    return manager, states
