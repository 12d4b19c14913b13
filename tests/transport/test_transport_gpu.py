"""The shared device-data building blocks on GPUs: NCCL grouped send/recv, the job's transport as read by
particle ghosts, and peer-memory windows with their flag kernels.

Run on a GPU machine with 2 GPUs::

    python -m pytest tests/transport/test_transport_gpu.py -m gpu
"""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _gpu_job(comm, requested=None):
    """The GPU architecture and a fresh Communicator (a job) whose GPU transport is ``requested``."""
    import hpcgpu
    from hpcgpu.transport import select_transport

    arch = hpcgpu.arch.auto(comm, backend="cupy")
    job = hpcgpu.Communicator(comm.mpi)
    select_transport(job, arch, requested=requested)
    return arch, job


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_grouped_send_receive_moves_every_dtype_around_a_ring(comm):
    import cupy

    from hpcgpu.transport.nccl import grouped_send_receive, nccl_communicator, nccl_message

    arch, job = _gpu_job(comm, "nccl")
    nccl_comm = nccl_communicator(job)
    up, down = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    dtypes = ["float16", "float32", "float64", "int32", "int64", "uint8", "bool", "complex64"]

    def values(rank, dtype):
        base = np.arange(15).reshape(5, 3) + 100 * rank
        return (base % 2 == 1) if dtype == "bool" else (base + 1j * base if dtype == "complex64" else base)

    sends = [cupy.asarray(values(comm.rank, dtype).astype(dtype)) for dtype in dtypes]
    receives = [cupy.zeros((5, 3), dtype=dtype) for dtype in dtypes]
    empty_send, empty_receive = cupy.zeros(0, cupy.float32), cupy.zeros(0, cupy.float32)   # skipped alike
    with arch.on_stream(arch.comm_stream):
        grouped_send_receive(nccl_comm, [(a, up) for a in sends] + [(empty_send, up)],
                             [(a, down) for a in receives] + [(empty_receive, down)], arch.comm_stream)
    arch.synchronize()
    for dtype, received in zip(dtypes, receives):
        assert np.array_equal(cupy.asnumpy(received), values(down, dtype).astype(dtype)), dtype
    # Resolved messages (the hot-path form) move the same bytes; slices travel from their offset.
    big = cupy.arange(40, dtype=cupy.float64) + 1000 * comm.rank
    into = cupy.zeros(20, dtype=cupy.float64)
    grouped_send_receive(nccl_comm, [nccl_message(big[10:30], up)], [nccl_message(into, down)],
                         cupy.cuda.get_current_stream())
    arch.synchronize()
    assert np.array_equal(cupy.asnumpy(into), np.arange(10, 30) + 1000.0 * down)


@pytest.mark.mpi(ranks=[2], timeout=180)
def test_particle_ghosts_by_nccl_are_those_of_host_staged_mpi(comm):
    """The job's transport decides how ghost rows of CuPy arrays travel; both give the same bits."""
    import cupy

    from hpcgpu.particles import GhostExchange, ParticleDomain

    box, width = np.array([6.0, 7.0, 5.7]), 2.8
    rng = np.random.default_rng(5)
    everything = rng.uniform(0.0, 1.0, (400, 3)) * box
    ids = np.arange(1, 401, dtype=np.int64)
    results = {}
    for requested in ("nccl", "mpi-staged"):
        _, job = _gpu_job(comm, requested)
        domain = ParticleDomain(job, box, width)
        mine = domain.owner_ranks(everything) == comm.rank
        positions = cupy.asarray(everything[mine])
        exchange = GhostExchange(domain, positions, width, carried={"ids": cupy.asarray(ids[mine])})
        assert exchange.movers.name == requested
        moved = cupy.concatenate([positions + 0.01, exchange.positions])
        exchange.forward(moved)
        cupy.cuda.get_current_stream().synchronize()
        results[requested] = (cupy.asnumpy(exchange.positions), cupy.asnumpy(exchange.carried["ids"]),
                              cupy.asnumpy(moved))
    for built_by_nccl, built_by_mpi in zip(results["nccl"], results["mpi-staged"]):
        assert np.array_equal(built_by_nccl, built_by_mpi)


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_peer_memory_window_signal_and_wait(comm):
    """Each rank stores into its peer's buffer through a mapped window, signals, and waits for the peer's
    signal: afterwards each holds exactly what the peer stored."""
    import cupy

    from hpcgpu.transport.peer_memory import (close_peer_mappings, export_addresses, on_every_rank,
                                              open_addresses, ready_for_peer_stores, signal_flag, wait_flags)

    arch, _ = _gpu_job(comm)
    if comm.n_nodes != 1:
        pytest.skip("CUDA IPC maps GPUs of one node only")
    other = 1 - comm.rank
    buffer = cupy.zeros(1000, dtype=cupy.float64)
    flags = cupy.zeros(2, dtype=cupy.uint64)
    everyone = comm.mpi.allgather(export_addresses({"buffer": buffer.data.ptr, "flags": flags.data.ptr}))
    peer = on_every_rank(comm, lambda: open_addresses(everyone[other]))[comm.rank]
    ready_for_peer_stores(comm)
    for epoch in (1, 2, 3):
        with arch.on_stream(arch.comm_stream):   # everything on one stream: the copy reads a finished array
            mine = cupy.arange(1000, dtype=cupy.float64) * (comm.rank + 1) + epoch
            cupy.cuda.runtime.memcpyAsync(peer["buffer"], mine.data.ptr, mine.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToDevice, arch.comm_stream.ptr)
            signal_flag(peer["flags"] + 8 * (epoch % 2), epoch)
            wait_flags(flags.data.ptr + 8 * (epoch % 2), 1, epoch)
            received = buffer.copy()
        arch.synchronize()
        assert np.array_equal(cupy.asnumpy(received), np.arange(1000) * (other + 1.0) + epoch)
        comm.barrier()   # the peer has read its buffer before the next epoch overwrites it
    assert close_peer_mappings() >= 1
    comm.barrier()
