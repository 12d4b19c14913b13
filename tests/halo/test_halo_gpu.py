"""The halo and collective checks on CuPy arrays, through every GPU transport (NCCL, host-staged MPI).

Run on a GPU machine (1 and 2 GPUs)::

    python -m pytest tests -m gpu
"""

import numpy as np
import pytest

from tests.halo.halo_reference import expected_padded
from tests.halo.test_halo import CASES

pytestmark = pytest.mark.gpu

GPU_TRANSPORTS = ["nccl", "nccl-graph", "mpi-staged"]


def _gpu_arch_or_skip(comm, transport_name):
    import cupy

    import hpcgpu

    n_gpus = cupy.cuda.runtime.getDeviceCount()
    if transport_name == "nccl" and comm.size > n_gpus:
        pytest.skip(f"NCCL needs one GPU per rank: {comm.size} ranks, {n_gpus} GPU(s)")
    return hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=comm.size > n_gpus)


@pytest.mark.mpi(ranks=[1, 2])
@pytest.mark.parametrize("transport_name", GPU_TRANSPORTS)
def test_gpu_rank_ids_and_random_fields(comm, transport_name):
    import cupy

    import hpcgpu
    from hpcgpu.halo.regions import directions, region_slices
    from hpcgpu.transport import make_transport

    arch = _gpu_arch_or_skip(comm, transport_name.replace("-graph", ""))
    graph = transport_name.endswith("-graph")
    transport = make_transport(transport_name.replace("-graph", ""), comm, arch)
    for shape, periodic in [((12,), (True,)), ((9, 10), (False, True)), ((6, 7, 8), (True, False, True))]:
        grid = hpcgpu.Decomposition(comm, shape, periodic=periodic)
        field = hpcgpu.Field(grid, arch, halo_width=2, dtype="int64")
        field.data[...] = -1
        field.interior[...] = comm.rank
        hpcgpu.exchange_halos([field], transport=transport, graph=graph)
        data = cupy.asnumpy(field.data)
        for d in directions(grid.ndim):
            neighbour = grid.neighbor(d)
            ghosts = data[region_slices("recv", d, grid.local_shape, field.halo_width)]
            assert np.all(ghosts == (-1 if neighbour is None else neighbour)), (shape, d)
    for case_index, (shape, periodic, halo, dims) in enumerate(CASES):
        grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=periodic)
        global_array = np.random.default_rng(case_index).standard_normal(shape)
        fields = [hpcgpu.Field(grid, arch, halo_width=halo, dtype="float64") for _ in range(2)]
        for i, f in enumerate(fields):
            f.data[...] = cupy.nan
            f.scatter(global_array * (i + 1) if comm.rank == 0 else None)
        pending = hpcgpu.exchange_halos(fields, wait=False, transport=transport, graph=graph)
        pending.wait()
        arch.synchronize()
        for i, f in enumerate(fields):
            expected, mask = expected_padded(global_array * (i + 1), grid, f.halo_width)
            data = cupy.asnumpy(f.data)
            assert np.array_equal(data[mask], expected[mask]), (transport_name, case_index, str(grid))
            assert np.all(np.isnan(data[~mask]))


@pytest.mark.mpi(ranks=[1, 2])
def test_gpu_collectives(comm):
    import cupy

    from hpcgpu.transport import collectives

    arch = _gpu_arch_or_skip(comm, "nccl")
    movers = collectives(comm, arch)   # device buffers move through the job's transport, not the Communicator
    n = comm.size
    values = cupy.arange(6, dtype=cupy.float32) * (comm.rank + 1)
    expected = {"sum": cupy.arange(6, dtype=cupy.float32) * n * (n + 1) / 2,
                "max": cupy.arange(6, dtype=cupy.float32) * n, "min": cupy.arange(6, dtype=cupy.float32)}
    for op, result in expected.items():
        assert cupy.array_equal(movers.allreduce(values, op=op), result), op
    buffer = cupy.full(4, comm.rank, dtype=cupy.float64)
    movers.broadcast(buffer, root=n - 1)
    assert cupy.all(buffer == n - 1)
    assert movers.on_device and arch.is_gpu and arch.xp is cupy


_SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_gpu_exchanges_in_flight_never_race(comm):
    """Many exchanges queued without any host synchronisation, one rank's GPU delayed at random: every
    ghost value read on the compute stream right after ``wait()`` is the neighbour's value of that very
    exchange (a transport that overwrote ghosts early or let them be read late would show it)."""
    import cupy

    import hpcgpu
    from hpcgpu.transport import make_transport

    arch = _gpu_arch_or_skip(comm, "nccl")
    transport = make_transport("nccl", comm, arch)
    spin = cupy.RawKernel(_SPIN_SOURCE, "spin")
    grid = hpcgpu.Decomposition(comm, (64, 256), dims=(2, 1), periodic=(True, False))
    fields = [hpcgpu.Field(grid, arch, halo_width=1, dtype="float64") for _ in range(2)]
    n_exchanges = 400
    history = cupy.zeros((n_exchanges, 2, 256), dtype=cupy.float64)
    delays = np.random.default_rng(7 + comm.rank).integers(0, 3, n_exchanges)
    with arch.on_stream(arch.compute_stream):
        for i in range(n_exchanges):
            target = fields[i % 2]   # ping-pong, as a two-buffer stencil
            if delays[i] == 2:
                spin((1,), (1,), (np.int64(200_000),))   # ~0.1 ms on this rank only
            target.interior[...] = 1000.0 * i + comm.rank
            pending = hpcgpu.exchange_halos([target], wait=False, corners=False, transport=transport)
            pending.wait()
            history[i, 0] = target.data[0, 1:-1]
            history[i, 1] = target.data[-1, 1:-1]
    arch.synchronize()
    other = 1 - comm.rank
    expected = (1000.0 * np.arange(n_exchanges) + other)[:, None, None] * np.ones((1, 2, 256))
    assert np.array_equal(cupy.asnumpy(history), expected)
