"""Checkpoints of CuPy fields: synchronous and asynchronous (pinned buffers) round trips."""

import numpy as np
import pytest

from tests.checkpoint.serial import BoxGrid


class DeviceField:
    """A Field-like object holding a CuPy array with one ghost layer (the interior is a strided view)."""

    def __init__(self, arch, grid):
        self.decomposition, self.arch, self.name = grid, arch, "h"
        self.data = arch.zeros(tuple(n + 2 for n in grid.local_shape), dtype="float64")
        self.interior = self.data[1:-1, 1:-1]

    @property
    def dtype(self):
        return self.data.dtype


@pytest.mark.gpu
@pytest.mark.parametrize("asynchronous", [False, True])
def test_device_fields_round_trip(tmp_path, serial_comm, asynchronous):
    cupy = pytest.importorskip("cupy")
    import hpcgpu.arch
    from hpcgpu.checkpoint import CheckpointManager

    arch = hpcgpu.arch.GPU(0)
    grid = BoxGrid((64, 48))
    field = DeviceField(arch, grid)
    expected = np.random.default_rng(0).standard_normal((64, 48))
    field.interior[...] = cupy.asarray(expected)
    particles = {"ids": cupy.arange(10), "position": cupy.asarray(np.random.default_rng(1).random((10, 3)))}
    expected_position = cupy.asnumpy(particles["position"])
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.gpu", asynchronous=asynchronous)
    manager.save(3, fields={"h": field}, particles=particles, replicated={"scale": cupy.asarray([2.0])})
    field.interior[...] = -1.0  # the next step overwrites the state while the writer may still run
    particles["position"][...] = -1.0  # contiguous: the side-stream copy must read a private device copy
    manager.close()
    restored = DeviceField(arch, BoxGrid((64, 48), start=(10, 5), shape=(30, 20)))
    state = manager.load("latest", fields={"h": restored}, particles=True)
    assert np.array_equal(cupy.asnumpy(restored.interior), expected[10:40, 5:25])
    assert np.all(cupy.asnumpy(restored.data[0]) == 0), "ghost cells are not touched"
    assert np.array_equal(state.particles["position"], expected_position)
    assert np.array_equal(state.replicated["scale"], [2.0])
