"""The halo and collective checks on CuPy arrays, through every GPU transport (NCCL, host-staged MPI).

Run on a GPU machine (1 and 2 GPUs)::

    python -m pytest tests -m gpu
"""

import numpy as np
import pytest

from tests.core.halo_reference import expected_padded
from tests.core.test_halo import CASES

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

    import hpcgpu

    arch = _gpu_arch_or_skip(comm, "nccl")
    n = comm.size
    values = cupy.arange(6, dtype=cupy.float32) * (comm.rank + 1)
    assert cupy.array_equal(comm.allreduce(values, "sum"), cupy.arange(6, dtype=cupy.float32) * n * (n + 1) / 2)
    assert cupy.array_equal(comm.allreduce(values, "max"), cupy.arange(6, dtype=cupy.float32) * n)
    assert cupy.array_equal(comm.allreduce(values, "min"), cupy.arange(6, dtype=cupy.float32))
    buffer = cupy.full(4, comm.rank, dtype=cupy.float64)
    assert cupy.all(comm.broadcast(buffer, root=n - 1) == n - 1)
    assert arch.is_gpu and arch.xp is cupy
