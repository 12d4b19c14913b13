"""Only hpcgpu/transport moves data between ranks (docs/architecture.md, the transport layer).

Checked on the source (AST) of ``hpcgpu``, ``apps`` and ``examples``: outside ``hpcgpu/transport`` no code imports
NCCL (``cupy.cuda.nccl`` or ``hpcgpu.transport.nccl``'s communicator and messages), calls an MPI
buffer operation (point-to-point, collectives and one-sided calls on buffers: ``Isend``,
``Allreduce``, ``Gatherv``, ...), an NCCL collective, or a pickled point-to-point call on an MPI
communicator. What stays allowed: the files of :data:`ALLOWED_FILES`, pickled collectives of small
values through ``comm.mpi`` (``allgather``, ``bcast``, ``allreduce`` of Python objects), barriers and
communicator management.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: MPI calls that move buffers (mpi4py's upper-case API).
MPI_BUFFER_CALLS = {
    "Send", "Recv", "Isend", "Irecv", "Ssend", "Bsend", "Rsend", "Issend", "Sendrecv", "Sendrecv_replace",
    "Isendrecv", "Allreduce", "Iallreduce", "Reduce", "Ireduce", "Allgather", "Allgatherv", "Iallgather",
    "Iallgatherv", "Gather", "Gatherv", "Igather", "Igatherv", "Scatter", "Scatterv", "Iscatter", "Iscatterv",
    "Bcast", "Ibcast", "Alltoall", "Alltoallv", "Alltoallw", "Ialltoall", "Ialltoallv", "Reduce_scatter",
    "Reduce_scatter_block", "Ireduce_scatter", "Ireduce_scatter_block", "Scan", "Exscan", "Put", "Get",
    "Accumulate", "Get_accumulate",
}
#: NCCL calls (cupy.cuda.nccl's communicator methods and group calls).
NCCL_CALLS = {"allReduce", "reduceScatter", "allGather", "groupStart", "groupEnd", "grouped_send_receive",
              "nccl_communicator"}
#: Pickled point-to-point calls: forbidden on anything whose expression names MPI.
PICKLED_POINT_TO_POINT = {"send", "recv", "isend", "irecv", "sendrecv", "ssend", "issend"}
#: What may still be imported from hpcgpu.transport.nccl outside the package: information only.
NCCL_INFORMATION = {"nccl_available", "nccl_version"}
#: Files that may call MPI themselves, and why (docs/architecture.md says the same).
ALLOWED_FILES = {
    # the Communicator's own collectives of small host values (comm.allreduce(x), comm.broadcast(obj))
    "hpcgpu/runtime/communicator.py",
    # the hang watchdog's private control channel: heartbeats, hang reports and the verdict between a
    # background thread on each rank and rank 0 (probes, cancellation); no data of the computation
    "hpcgpu/health/watchdog.py",
}


def python_files():
    for top in ("hpcgpu", "apps", "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("hpcgpu/transport/") or relative in ALLOWED_FILES:
                continue
            yield relative, path


def violations_in(relative: str, source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{relative}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {alias.name for alias in node.names}
            if node.module == "cupy.cuda" and "nccl" in names or node.module == "cupy.cuda.nccl":
                found.append(f"{where}: imports NCCL")
            if node.module == "hpcgpu.transport.nccl" and names - NCCL_INFORMATION:
                found.append(f"{where}: imports {sorted(names - NCCL_INFORMATION)} from hpcgpu.transport.nccl")
        elif isinstance(node, ast.Import):
            if any(alias.name.startswith("cupy.cuda.nccl") for alias in node.names):
                found.append(f"{where}: imports NCCL")
        elif isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in MPI_BUFFER_CALLS and isinstance(function, ast.Attribute):
                found.append(f"{where}: MPI buffer call .{name}()")
            elif name in NCCL_CALLS:
                found.append(f"{where}: NCCL call {name}()")
            elif name == "bcast" and node.args and "ptr" in ast.unparse(node.args[0]):
                found.append(f"{where}: NCCL call bcast()")   # a device pointer: NCCL's, not mpi4py's pickled bcast
            elif name in PICKLED_POINT_TO_POINT and isinstance(function, ast.Attribute) \
                    and "mpi" in ast.unparse(function.value).lower():
                found.append(f"{where}: MPI point-to-point .{name}()")
    return found


def test_only_the_transport_moves_data_between_ranks():
    found = []
    for relative, path in python_files():
        found += violations_in(relative, path.read_text())
    assert not found, ("data moved between ranks outside hpcgpu/transport (use hpcgpu.transport.collectives):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("line, expected", [
    ("comm.mpi.Allreduce(a, b)", "MPI buffer call .Allreduce()"),
    ("self.nccl_comm.allReduce(1, 2, 3, 4, 5, 6)", "NCCL call allReduce()"),
    ("movers.nccl_comm.bcast(array.data.ptr, n, t, 0, s)", "NCCL call bcast()"),
    ("hpcgpu.transport.nccl.nccl_communicator(comm)", "NCCL call nccl_communicator()"),
    ("comm.mpi.send(x, dest=1)", "MPI point-to-point .send()"),
    ("from cupy.cuda import nccl", "imports NCCL"),
    ("from hpcgpu.transport.nccl import grouped_send_receive", "from hpcgpu.transport.nccl"),
    ("connection.send(x)", None),
    ("comm.mpi.allgather(x); comm.mpi.bcast(y)", None),
    ("from hpcgpu.transport.nccl import nccl_version", None),
])
def test_the_check_sees_each_kind_of_call(line, expected):
    found = violations_in("x.py", line)
    assert (expected is None and not found) or (expected is not None and expected in found[0])
