"""Halo-exchange latency and bandwidth per transport and message size.

Each rank owns a block of a 2D field decomposed along one axis (non-periodic, so with 2 ranks each
rank sends exactly one message each way). Two layouts:

- ``rows``: the field is cut along y with ghost width (1, 0); a face is one contiguous row of
  ``N`` values, sent straight from the field (no packing);
- ``columns``: cut along x with ghost width (0, 1); a face is a strided column, packed into a buffer.

NCCL is measured twice: eager (Python enqueues pack, the NCCL group and unpack each time) and
``nccl+graph`` (the same captured once as a CUDA graph and replayed). For each message size the exchange (start + wait, synchronised) is repeated for about
``--seconds`` and the time per exchange is the maximum over ranks of the mean. Bandwidth is the
bytes one rank sends to one neighbour divided by that time (each way).

Only an exchange with another rank measures a link. On one rank there is no neighbour (non-periodic:
nothing moves) or the rank is its own neighbour (``--periodic``: a local copy); those rows are labelled
``no neighbour`` / ``local copy`` and carry no bandwidth. The benchmark also measures the memory copy
rate of the device (or host) and never reports a bandwidth above it: such a number is timer noise or a
copy that never left the device, not a link.

Example (2 GPUs)::

    mpiexec -n 2 python -m hpcgpu.bench halo --transports nccl,mpi-staged --json halo.json

``--simulate-nodes K`` places the blocks as if the ranks were on K nodes (``HPCGPU_SIMULATE_NODES``,
:mod:`hpcgpu.decomposition.comm`) and prints the halo bytes inside and between those nodes; with the
NCCL settings of docs/multinode.md the exchange between "nodes" then takes NCCL's network path.
"""

from __future__ import annotations

import json
import time

import numpy as np


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=("auto", "cupy", "numpy"), default="auto")
    parser.add_argument("--transports", default="auto", help="comma list of mpi,nccl,mpi-cuda,mpi-staged (default: all usable)")
    parser.add_argument("--sizes", default="1,16,256,4096,16384,65536,262144,1048576,4194304",
                        help="values per message (default up to 4Mi = 16 MiB of fp32)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layouts", default="rows,columns")
    parser.add_argument("--seconds", type=float, default=0.3, help="time budget per measurement")
    parser.add_argument("--local-rows", type=int, default=2, help="rows layout: owned rows per rank [2]")
    parser.add_argument("--periodic", action="store_true", help="periodic along the cut axis (2 ranks: one peer on both sides)")
    parser.add_argument("--side-halo", type=int, default=0, help="ghost width along the uncut axis [0]")
    parser.add_argument("--simulate-nodes", default=None, metavar="K[:cyclic]",
                        help="place the blocks as if the ranks were on K nodes (HPCGPU_SIMULATE_NODES; the "
                             "transports are unchanged: docs/multinode.md forces NCCL onto its network path)")
    parser.add_argument("--json", default=None, help="write results to this JSON file")


def _usable_transports(arch, requested: str) -> list[str]:
    if requested != "auto":
        return requested.split(",")
    if not arch.is_gpu:
        return ["mpi"]
    from hpcgpu.transport.mpi_device import mpi_is_cuda_aware
    from hpcgpu.transport.nccl import nccl_available

    names = ["nccl"] if nccl_available() else []
    if mpi_is_cuda_aware():
        names.append("mpi-cuda")
    return names + ["mpi-staged"]


def peer_kind(n_ranks: int, periodic: bool) -> str:
    """What one exchange along the cut axis moves: ``remote`` (another rank), ``local copy`` (a rank that
    is its own periodic neighbour) or ``no neighbour`` (one rank, non-periodic)."""
    if n_ranks > 1:
        return "remote"
    return "local copy" if periodic else "no neighbour"


def copy_rate(arch, nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes per second of a large device (or host) memory copy, the best of ``repeats``.

    No halo exchange can move bytes faster than this; the bench uses it as a ceiling.
    """
    xp = arch.xp
    source = xp.ones(nbytes // 8, dtype=np.float64)
    target = xp.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        arch.synchronize()
        started = time.perf_counter()
        target[...] = source
        arch.synchronize()
        best = min(best, time.perf_counter() - started)
    return source.nbytes / best if best > 0 else float("inf")


def bandwidth(nbytes: int, seconds: float, kind: str, ceiling: float) -> tuple[float | None, str]:
    """(GB/s each way or None, note) of one measurement; None unless it measured a link believably."""
    if kind != "remote":
        return None, kind
    rate = nbytes / seconds if seconds > 0 else float("inf")
    if rate > ceiling:
        return None, "above memory copy rate"
    return rate / 1e9, ""


def measure(comm, arch, transport, layout: str, n_values: int, dtype: str, seconds: float, graph: bool = False,
            local_rows: int = 2, periodic: bool = False, side_halo: int = 0) -> float:
    """Seconds per exchange (max over ranks of the mean)."""
    import hpcgpu

    if layout == "rows":
        grid = hpcgpu.Decomposition(comm, (local_rows * comm.size, n_values), dims=(comm.size, 1), periodic=(periodic, False))
        halo_width = (1, side_halo)
    else:
        grid = hpcgpu.Decomposition(comm, (n_values, local_rows * comm.size), dims=(1, comm.size), periodic=(False, periodic))
        halo_width = (side_halo, 1)
    field = hpcgpu.Field(grid, arch, halo_width=halo_width, dtype=dtype)
    field.interior[...] = comm.rank
    exchange = hpcgpu.HaloExchange([field], corners=False, transport=transport, graph=graph)
    for _ in range(5):
        exchange.run()
    arch.synchronize()
    # Calibrate the repetition count on rank 0's timing so every rank runs the same number.
    started = time.perf_counter()
    for _ in range(10):
        exchange.run()
    arch.synchronize()
    per_exchange = (time.perf_counter() - started) / 10
    repeats = comm.broadcast(int(max(10, min(100000, seconds / max(per_exchange, 1e-7)))))
    comm.barrier()
    started = time.perf_counter()
    for _ in range(repeats):
        exchange.run()
    arch.synchronize()
    elapsed = (time.perf_counter() - started) / repeats
    return comm.allreduce(elapsed, "max")


def main(args) -> int:
    import os

    import hpcgpu
    from hpcgpu.decomposition.comm import SIMULATE_NODES_ENV
    from hpcgpu.decomposition.nodes import header_line
    from hpcgpu.transport import make_transport

    if args.simulate_nodes:
        os.environ[SIMULATE_NODES_ENV] = args.simulate_nodes   # every rank parses the same arguments
    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        arch = hpcgpu.arch.auto(comm, backend=args.backend)
        sizes = [int(s) for s in args.sizes.split(",")]
        itemsize = np.dtype(args.dtype).itemsize
        results = []
        kind = peer_kind(comm.size, args.periodic)
        ceiling = comm.allreduce(copy_rate(arch), "min")
        if comm.rank == 0:
            print(f"halo exchange benchmark: {comm.size} ranks, backend {arch.name} ({arch.reason}); "
                  f"memory copy rate {ceiling / 1e9:,.1f} GB/s (no bandwidth above it is reported)", flush=True)
            if kind != "remote":
                print(f"note: on one rank there is no other rank to exchange with ({kind}); the times are "
                      "reported, but no bandwidth: run on 2 or more ranks to measure a link", flush=True)
        nodes_grid = hpcgpu.Decomposition(comm, (args.local_rows * comm.size, sizes[-1]), dims=(comm.size, 1),
                                          periodic=(args.periodic, False))
        nodes_line = header_line(nodes_grid, halo_width=(1, 0), itemsize=itemsize, corners=False)
        if comm.rank == 0 and nodes_line:
            print(f"nodes (rows layout, {sizes[-1]} values per message): {nodes_line}", flush=True)
        variants = [(name, False) for name in _usable_transports(arch, args.transports)]
        if "nccl" in [name for name, _ in variants]:
            variants.insert(1, ("nccl", True))
        for name, graph in variants:
            transport = make_transport(name, comm, arch)
            label = name + ("+graph" if graph else "")
            for layout in args.layouts.split(","):
                for n_values in sizes:
                    seconds = measure(comm, arch, transport, layout, n_values, args.dtype, args.seconds, graph,
                                      args.local_rows, args.periodic, args.side_halo)
                    nbytes = n_values * itemsize
                    rate, note = bandwidth(nbytes, seconds, kind, ceiling)
                    results.append({
                        "transport": label, "layout": layout, "values": n_values, "bytes": nbytes,
                        "microseconds": seconds * 1e6, "gigabytes_per_second": rate, "peer": kind, "note": note,
                    })
        if comm.rank == 0:
            print(f"\n{'transport':<12} {'layout':<8} {'values':>9} {'bytes':>10} {'us/exchange':>12} {'GB/s each way':>14}")
            for r in results:
                rate = "-" if r["gigabytes_per_second"] is None else f"{r['gigabytes_per_second']:.2f}"
                print(f"{r['transport']:<12} {r['layout']:<8} {r['values']:>9} {r['bytes']:>10} "
                      f"{r['microseconds']:>12.1f} {rate:>14}" + (f"  ({r['note']})" if r["note"] else ""))
            if args.json:
                meta = {"n_ranks": comm.size, "backend": arch.name, "dtype": args.dtype, "peer": kind,
                        "nodes": nodes_line,
                        "memory_copy_gigabytes_per_second": ceiling / 1e9,
                        "device": arch.describe(), "hpcgpu": hpcgpu.__version__}
                with open(args.json, "w") as out:
                    json.dump({"meta": meta, "results": results}, out, indent=2)
    return 0
