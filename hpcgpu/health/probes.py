"""Measured bandwidths: a device copy on each GPU, and the job transport's links between ranks.

* :func:`device_copy_bandwidth` -- one CuPy device-to-device copy, timed with CUDA events; bytes read
  plus written per second, to compare with the memory's peak.
* :func:`neighbour_pairs` / :func:`link_bandwidths` -- the ring of ranks (0-1, 1-2, ..., n-1 to 0),
  each pair exchanging a message both ways at once, in rounds of disjoint pairs so that no link is
  shared within a round; the time of each pair is the slower of its two ends.
* :func:`allreduce_bandwidth` -- the job transport's allreduce, as NCCL's tests report it: bus
  bandwidth = bytes x 2 (n - 1) / n / time.

On the CPU the transport is ``mpi`` with NumPy buffers; on GPUs the job's transport moves CuPy arrays
(NCCL grouped send/receive and allreduce, or MPI on device pointers or through pinned host memory).
All functions here are collective over ``comm`` except :func:`device_copy_bandwidth`.
"""

from __future__ import annotations

import time

import numpy as np

#: Timed repetitions after one untimed warm-up; the best is kept (noise only ever slows a transfer).
REPEATS = 5


def device_copy_bandwidth(n_bytes: int = 1 << 30, repeats: int = REPEATS) -> float:
    """Bytes read + written per second by a device-to-device copy on the current GPU (best of ``repeats``)."""
    import cupy

    n_elements = n_bytes // 4
    source = cupy.ones(n_elements, dtype=cupy.float32)
    target = cupy.empty_like(source)
    target[...] = source   # warm-up: allocation, kernel load
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    best = float("inf")
    for _ in range(repeats):
        start.record()
        target[...] = source
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    del source, target
    return 2 * n_elements * 4 / best


def neighbour_pairs(n_ranks: int) -> list[tuple[int, int, int]]:
    """The ring's pairs ``(round, low end, high end)``: rank i with i + 1 (and n - 1 with 0).

    Pairs of one round share no rank: even-numbered edges in round 0, odd ones in round 1, and for an
    odd ring its closing edge alone in round 2. One pair for 2 ranks, none for 1.
    """
    if n_ranks < 2:
        return []
    if n_ranks == 2:
        return [(0, 0, 1)]
    pairs = []
    for index in range(n_ranks):
        partner = (index + 1) % n_ranks
        round_ = 2 if n_ranks % 2 and index == n_ranks - 1 else index % 2
        pairs.append((round_, min(index, partner), max(index, partner)))
    return pairs


class TransportBuffers:
    """Send and receive buffers of ``n_bytes`` moved by the job's collectives
    (:func:`hpcgpu.transport.collectives`): NumPy arrays for ``mpi``, CuPy arrays for the GPU transports
    (``nccl`` on the stream, ``mpi-cuda`` on device pointers, ``mpi-staged`` through pinned host memory),
    so a probe times the path the job's data takes. Every call returns once the data has arrived.
    """

    def __init__(self, comm, transport: str, n_bytes: int):
        from hpcgpu.transport import collectives

        self.on_device = transport != "mpi"
        if self.on_device:
            import cupy as xp
        else:
            xp = np
        self.xp = xp
        self.movers = collectives(comm, on_device=self.on_device)   # collective on first use
        self.send = xp.ones(max(1, n_bytes // 8), dtype=xp.float64)
        self.receive = xp.empty_like(self.send)

    def exchange(self, peer: int) -> None:
        self.movers.send_receive(sends=[(self.send, peer)], receives=[(self.receive, peer)])
        self.synchronize()

    def allreduce(self) -> None:
        self.movers.allreduce(self.send, self.receive, "sum")
        self.synchronize()

    def synchronize(self) -> None:
        if self.on_device:
            self.xp.cuda.get_current_stream().synchronize()


def transport_buffers(comm, transport: str, n_bytes: int) -> TransportBuffers:
    """Buffers of ``n_bytes`` that move the way ``transport`` (the job's) moves them (collective on first use)."""
    return TransportBuffers(comm, transport, n_bytes)


def link_bandwidths(comm, buffers, n_bytes: int, repeats: int = REPEATS) -> list[dict]:
    """Collective: each ring pair's bandwidth, each way, in bytes/s (best of ``repeats``).

    Returns
    -------
    list of dict
        On every rank, one per pair: ``ranks`` (low, high), ``seconds``, ``bytes_per_second``.
    """
    pairs = neighbour_pairs(comm.size)
    mine = {}
    for round_ in sorted({p[0] for p in pairs}):
        comm.mpi.Barrier()   # rounds do not overlap: a pair's link is not shared with the next round's
        partners = [(low, high) for r, low, high in pairs if r == round_ and comm.rank in (low, high)]
        for low, high in partners:
            peer = high if comm.rank == low else low
            buffers.exchange(peer)   # warm-up: connection set-up
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                buffers.exchange(peer)
                best = min(best, time.perf_counter() - started)
            mine[(low, high)] = best
    everyone = comm.mpi.allgather(mine)
    result = []
    for _, low, high in pairs:
        seconds = max(times[(low, high)] for times in everyone if (low, high) in times)
        result.append({"ranks": (low, high), "seconds": seconds, "bytes_per_second": n_bytes / seconds})
    return result


def allreduce_bandwidth(comm, buffers, n_bytes: int, repeats: int = REPEATS) -> dict:
    """Collective: the transport's allreduce of ``n_bytes``: ``seconds`` (best, slowest rank) and
    ``bus_bytes_per_second`` (bytes x 2 (n - 1) / n / seconds, NCCL tests' bus bandwidth)."""
    buffers.allreduce()   # warm-up
    best = float("inf")
    for _ in range(repeats):
        comm.mpi.Barrier()
        started = time.perf_counter()
        buffers.allreduce()
        best = min(best, time.perf_counter() - started)
    seconds = comm.mpi.allreduce(best, op=_mpi_max())
    factor = 2 * (comm.size - 1) / comm.size
    return {"seconds": seconds, "bus_bytes_per_second": n_bytes * factor / seconds if comm.size > 1 else None}


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX
