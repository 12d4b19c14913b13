"""The kernel layer on the GPU (run on the GPU machine): the CUDA kernel gives the CPU kernel's bits at
a realistic and an odd size, a CUDA graph replay equals the eager steps, repeated runs are equal, and
two ranks (one GPU each) equal the serial reference.

One command: ``python -m pytest tests/stencil/test_stencil_gpu.py -q`` (skipped without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.stencils import kernels

pytestmark = pytest.mark.gpu

GRAY_SCOTT = dict(feed=0.037, kill=0.06, diffusion_u=0.2, diffusion_v=0.1, dt=0.9)
CASES = [
    # kernel, params, global shape (realistic, odd), halo
    (kernels.gray_scott, GRAY_SCOTT, (1024, 1024), 1),
    (kernels.gray_scott, GRAY_SCOTT, (257, 131), 1),
    (kernels.diffusion_3d, dict(k=0.15), (128, 128, 128), 1),
    (kernels.diffusion_3d, dict(k=0.15), (37, 41, 29), 1),
    (kernels.box_blur_wide, dict(w=0.3), (515, 259), (1, 2)),
    (kernels.smooth_sqrt, {}, (300, 301), (1, 0)),
]
IDS = [f"{k.__name__}-{'x'.join(map(str, s))}" for k, _, s, _ in CASES]


class PingPong:
    """Two sets of fields of one model; ``step()`` updates the other set and swaps (even steps: back)."""

    def __init__(self, kernel, params, shape, halo, dtype, backend, comm, initial):
        import hpcgpu

        self.arch = hpcgpu.arch.auto(comm, backend=backend)
        grid = hpcgpu.Decomposition(comm, shape, periodic=True)
        self.kernel, self.params = kernel, params
        self.current, self.next = (
            [hpcgpu.Field(grid, self.arch, halo_width=halo, dtype=dtype, name=f"{n}{k}") for n in kernel.fields]
            for k in range(2))
        self.n_outputs = kernel.n_outputs
        for field, values in zip(self.current, initial):
            field.scatter(values if comm.rank == 0 else None)

    def step(self) -> None:
        outputs = self.next[:self.n_outputs]
        self.kernel.update(outputs=outputs, inputs=dict(zip(self.kernel.fields, self.current)), params=self.params)
        self.current, self.next = self.next, self.current

    def result(self):
        return [f.gather() for f in self.current[:self.n_outputs]]


def _initial(kernel, shape, dtype, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.random(shape).astype(dtype) for _ in kernel.fields]


def _run(model, n_steps):
    for _ in range(n_steps):
        model.step()
    model.arch.synchronize()
    return model.result()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_gpu_equals_cpu_bitwise(case, dtype):
    import hpcgpu

    if CASES[case][0].n_outputs != len(CASES[case][0].fields):
        pytest.skip("ping-pong needs one output per input field")
    kernel, params, shape, halo = CASES[case]
    comm = hpcgpu.Communicator()
    initial = _initial(kernel, shape, dtype)
    gpu = _run(PingPong(kernel, params, shape, halo, dtype, "cupy", comm, initial), 6)
    cpu = _run(PingPong(kernel, params, shape, halo, dtype, "numpy", comm, initial), 6)
    for k, (a, b) in enumerate(zip(gpu, cpu)):
        np.testing.assert_array_equal(a, b, err_msg=f"output {k}")


@pytest.mark.parametrize("case", [0, 1, 3], ids=[IDS[0], IDS[1], IDS[3]])
def test_graph_replay_equals_eager_and_repeats_are_equal(case):
    import hpcgpu
    from hpcgpu.runtime.capture import capture_graph

    kernel, params, shape, halo = CASES[case]
    comm = hpcgpu.Communicator()
    initial = _initial(kernel, shape, "float64")
    eager = _run(PingPong(kernel, params, shape, halo, "float64", "cupy", comm, initial), 10)
    again = _run(PingPong(kernel, params, shape, halo, "float64", "cupy", comm, initial), 10)
    for a, b in zip(eager, again):
        np.testing.assert_array_equal(a, b, err_msg="two eager runs differ")
    model = PingPong(kernel, params, shape, halo, "float64", "cupy", comm, initial)
    model.step()
    model.step()   # both bindings compiled and both exchanges planned before the capture
    model.arch.check_compute_stream("the test's capture")

    def record():
        for _ in range(4):
            model.step()

    graph = capture_graph(model.arch.compute_stream, record)
    graph.launch(model.arch.compute_stream)
    graph.launch(model.arch.compute_stream)
    model.arch.synchronize()
    for a, b in zip(model.result(), eager):
        np.testing.assert_array_equal(a, b, err_msg="2 eager + 2 x 4 replayed steps differ from 10 eager steps")


@pytest.mark.mpi(ranks=[2])
def test_two_gpus_equal_the_serial_reference(comm):
    kernel, params, shape = kernels.gray_scott, GRAY_SCOTT, (257, 131)
    initial = _initial(kernel, shape, "float64")
    model = PingPong(kernel, params, shape, 1, "float64", "cupy", comm, initial)
    result = _run(model, 3)
    expected = initial
    for _ in range(3):
        expected = kernels.gray_scott_reference(*expected, **params)
    if comm.rank == 0:
        for a, b in zip(result, expected):
            np.testing.assert_array_equal(a, b)
