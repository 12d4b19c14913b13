"""Halo messages in host memory through MPI (the CPU path)."""

from __future__ import annotations


class _MpiHandle:
    def __init__(self, requests, exchange):
        self.requests, self.exchange = requests, exchange

    def wait(self) -> None:
        from mpi4py import MPI

        MPI.Request.Waitall(self.requests)
        self.exchange.unpack()


class MpiHostTransport:
    """Isend/Irecv of NumPy buffers; ``wait()`` completes the requests and unpacks."""

    name = "mpi"

    def __init__(self, comm):
        self.comm = comm

    def start(self, exchange):
        mpi = self.comm.mpi
        exchange.pack()
        requests = [mpi.Irecv(m.buffer, source=m.peer, tag=m.tag) for m in exchange.recvs]
        requests += [mpi.Isend(m.buffer, dest=m.peer, tag=m.tag) for m in exchange.sends]
        return _MpiHandle(requests, exchange)
