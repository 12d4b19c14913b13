"""The transport's collectives and paired messages give what a serial computation gives.

Host buffers run here on 1-4 ranks (transport ``mpi``); the device transports (``nccl``, ``mpi-staged``,
``mpi-cuda`` where the MPI library is CUDA-aware) run the same cases on GPUs and must give the host
transport's results: bitwise for data movement, and for reductions of integers and of values whose
sums are exact.
"""

import numpy as np
import pytest

from hpcgpu.errors import BackendError, ConfigurationError
from hpcgpu.transport import Message, collectives
from hpcgpu.transport.messages import message_tags


def rank_values(rank, n, dtype=np.float64):
    """A rank's data: distinct per rank and element, exactly representable, sums exact."""
    return (np.arange(n, dtype=np.float64) * 3 + 1000 * rank).astype(dtype)


def counts_of(size):
    """Uneven element counts per rank, one rank empty when there are several."""
    return [(2 * r + 1) % 5 for r in range(size)]


def check_every_operation(movers, rank, size, xp, dtype=np.float64):
    n = 6
    local = xp.asarray(rank_values(rank, n, dtype))
    everyone = np.stack([rank_values(r, n, dtype) for r in range(size)])

    out = movers.allreduce(local)
    assert np.array_equal(_host(out), everyone.sum(axis=0))
    in_place = local.copy()
    assert movers.allreduce(in_place, out=in_place, op="max") is in_place
    assert np.array_equal(_host(in_place), everyone.max(axis=0))
    assert np.array_equal(_host(movers.allreduce(local, op="min")), everyone.min(axis=0))

    blocks = xp.asarray(np.concatenate([rank_values(rank, 3, dtype) + 7 * k for k in range(size)]))
    block = xp.zeros(3, dtype=dtype)
    movers.reduce_scatter(blocks, block)
    expected = sum(rank_values(r, 3, dtype) + 7 * rank for r in range(size))
    assert np.array_equal(_host(block), expected)

    gathered = xp.zeros(n * size, dtype=dtype)
    movers.allgather(local, gathered)
    assert np.array_equal(_host(gathered), everyone.reshape(-1))

    counts = counts_of(size)
    mine = xp.asarray(rank_values(rank, counts[rank], dtype))
    expected_v = np.concatenate([rank_values(r, counts[r], dtype) for r in range(size)])
    gathered_v = xp.zeros(sum(counts), dtype=dtype)
    movers.allgatherv(mine, gathered_v, counts)
    assert np.array_equal(_host(gathered_v), expected_v)

    root = size - 1
    rooted = xp.zeros(sum(counts), dtype=dtype)
    result = movers.gatherv(mine, rooted, counts, root=root)
    if rank == root:
        assert np.array_equal(_host(result), expected_v)
    else:
        assert result is None

    received = xp.zeros(counts[rank], dtype=dtype)
    source = xp.asarray(expected_v) if rank == root else xp.zeros(sum(counts), dtype=dtype)
    movers.scatterv(source, received, counts, root=root)
    assert np.array_equal(_host(received), rank_values(rank, counts[rank], dtype))

    shared = xp.asarray(rank_values(rank, n, dtype))
    movers.broadcast(shared, root=root)
    assert np.array_equal(_host(shared), rank_values(root, n, dtype))

    # alltoallv: rank r sends (r + d + 1) elements valued 100 r + d to rank d
    send_counts = [rank + d + 1 for d in range(size)]
    receive_counts = [s + rank + 1 for s in range(size)]
    send = xp.asarray(np.concatenate([np.full(c, 100 * rank + d, dtype) for d, c in enumerate(send_counts)]))
    out = xp.zeros(sum(receive_counts), dtype=dtype)
    movers.alltoallv(send, send_counts, out, receive_counts)
    assert np.array_equal(_host(out), np.concatenate([np.full(c, 100 * s + rank, dtype)
                                                      for s, c in enumerate(receive_counts)]))

    # paired messages on a ring, two to each neighbour in a fixed order (one neighbour on both sides
    # when there are two ranks, itself on one rank): the k-th message to a peer meets its k-th receive
    right, left = (rank + 1) % size, (rank - 1) % size
    sends = [Message(xp.asarray(np.full(4, 10 * rank + 1, dtype)), right),
             Message(xp.asarray(np.full(2, 10 * rank + 2, dtype)), left),
             Message(xp.asarray(np.full(3, 10 * rank + 3, dtype)), right)]
    receives = [Message(xp.zeros(4, dtype), left), Message(xp.zeros(2, dtype), right), Message(xp.zeros(3, dtype), left)]
    movers.exchange(sends, receives, tag=5).wait()
    assert np.array_equal(_host(receives[0].array), np.full(4, 10 * left + 1))
    assert np.array_equal(_host(receives[1].array), np.full(2, 10 * right + 2))
    assert np.array_equal(_host(receives[2].array), np.full(3, 10 * left + 3))


def _host(array):
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else np.asarray(array)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_host_collectives_equal_the_serial_result(comm):
    movers = collectives(comm, on_device=False)
    assert movers.name == "mpi" and not movers.capturable
    for dtype in (np.float64, np.float32, np.int32, np.int64):
        check_every_operation(movers, comm.rank, comm.size, np, dtype)
    assert collectives(comm, on_device=False) is movers


@pytest.mark.mpi(ranks=[2, 3])
def test_a_split_communicator_moves_data_with_its_parents_choice(comm):
    from hpcgpu.transport import select_transport
    from hpcgpu.arch import CPU

    select_transport(comm, CPU(), "mpi")
    half = comm.split(comm.rank % 2)
    assert half.parent is comm and half.job_transport is None   # nothing built until used
    movers = collectives(half, on_device=False)
    assert half.job_transport.choices["cpu"].name == "mpi" and half.job_transport.requested == "mpi"
    check_every_operation(movers, half.rank, half.size, np)


@pytest.mark.mpi(ranks=[2])
def test_bytes_of_types_mpi_cannot_reduce_still_move(comm):
    import ml_dtypes

    movers = collectives(comm, on_device=False)
    values = np.arange(5, dtype=np.float32).astype(ml_dtypes.bfloat16) + comm.rank
    gathered = np.zeros(10, dtype=ml_dtypes.bfloat16)
    movers.allgather(values, gathered)
    assert np.array_equal(gathered.astype(np.float32), np.concatenate([np.arange(5) + r for r in range(2)]))
    with pytest.raises(BackendError, match="MPI cannot reduce dtype bfloat16"):
        movers.allreduce(values)


@pytest.mark.mpi(ranks=[2])
def test_mismatched_buffers_are_one_clear_error(comm):
    movers = collectives(comm, on_device=False)
    with pytest.raises(ConfigurationError, match=r"allgather: out holds 3 elements, expected size x send = 4"):
        movers.allgather(np.zeros(2), np.zeros(3))
    with pytest.raises(ConfigurationError, match="reduction operator must be one of sum, max, min"):
        movers.allreduce(np.zeros(2), op="mean")
    with pytest.raises(BackendError, match="C-contiguous"):
        movers.broadcast(np.zeros((4, 4))[:, 1])


def test_message_tags_count_per_peer():
    messages = [Message(None, 1), Message(None, 2), Message(None, 1), Message(None, 1)]
    assert message_tags(messages, tag=10) == [10, 10, 11, 12]
    with pytest.raises(ConfigurationError, match="exceeds 32767"):
        message_tags(messages, tag=32766)


def test_the_communicator_refuses_device_arrays_and_names_the_transport():
    """The Communicator moves small host values; device arrays go through the transport (checked on a
    stand-in whose type lives in a ``cupy`` module, which is what marks a device array)."""
    import hpcgpu
    from hpcgpu.arch import is_device_array

    device_like = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert is_device_array(device_like)
    comm = hpcgpu.Communicator()
    for operation in ("allreduce", "broadcast"):
        with pytest.raises(ConfigurationError, match=rf"hpcgpu.transport.collectives\(comm, arch\).{operation}"):
            getattr(comm, operation)(device_like)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2])
def test_device_collectives_equal_the_host_results(comm, monkeypatch):
    import cupy

    import hpcgpu

    for transport in ("nccl", "mpi-staged"):
        monkeypatch.setenv("HPCGPU_TRANSPORT", transport)
        job = hpcgpu.Communicator(comm.mpi)
        movers = collectives(job, on_device=True)
        assert movers.name == transport and movers.capturable == (transport == "nccl")
        for dtype in (np.float64, np.float32, np.int32):
            check_every_operation(movers, job.rank, job.size, cupy, dtype)
        cupy.cuda.get_current_stream().synchronize()


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2])
def test_nccl_reduces_bfloat16_bit_patterns(comm, monkeypatch):
    import cupy
    import ml_dtypes

    import hpcgpu

    monkeypatch.setenv("HPCGPU_TRANSPORT", "nccl")
    movers = collectives(hpcgpu.Communicator(comm.mpi), on_device=True)
    values = (np.arange(8, dtype=np.float32) + comm.rank).astype(ml_dtypes.bfloat16)
    bits = cupy.asarray(values.view(np.uint16))
    total = movers.allreduce(bits, element_type="bfloat16")
    expected = sum((np.arange(8, dtype=np.float32) + r) for r in range(comm.size)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(total.get(), expected.view(np.uint16))
