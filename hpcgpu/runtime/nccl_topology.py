"""NCCL's own view of this node's topology: the XML it writes with ``NCCL_TOPO_DUMP_FILE``, summarised.

:mod:`hpcgpu.runtime.topology` reads sysfs; this module asks NCCL (in a child process, with a GPU
and CuPy's NCCL), which is what ``python -m hpcgpu info --nccl-topology`` prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

from hpcgpu.runtime.topology import read_text

NCCL_HINT = ("NCCL's own view: NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET) prints the NICs, GPUDirect "
             "decision and rings it picks; NCCL_TOPO_DUMP_FILE=topo.xml writes the topology it detected")

_NCCL_INIT = """
from cupy.cuda import nccl
comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
comm.destroy()
"""


def nccl_topology_dump(timeout: float = 120.0) -> tuple[str | None, str]:
    """Start a one-rank NCCL communicator with ``NCCL_TOPO_DUMP_FILE`` set and return the XML it wrote.

    Runs in a child process: NCCL reads the variable at initialisation, and the parent's NCCL (if
    any) is left alone. Needs a GPU and CuPy's NCCL.

    Returns
    -------
    xml : str or None
        The dump, None when it could not be made.
    message : str
        One line: where it came from, or why there is none.
    """
    with tempfile.TemporaryDirectory(prefix="hpcgpu-nccl-topo-") as directory:
        path = os.path.join(directory, "topo.xml")
        env = dict(os.environ, NCCL_TOPO_DUMP_FILE=path)
        try:
            result = subprocess.run([sys.executable, "-c", _NCCL_INIT], env=env, capture_output=True,
                                    text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"NCCL topology dump failed: {error}"
        xml = read_text(path)
        if xml is None:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"NCCL wrote no topology dump (exit {result.returncode}: {last})"
        return xml, "NCCL topology (one-rank init with NCCL_TOPO_DUMP_FILE)"


def summarise_nccl_topology(xml: str) -> list[str]:
    """A few lines from NCCL's topology XML: CPUs (NUMA), GPUs, NICs with speed and GPUDirect flag."""
    try:
        system = ElementTree.fromstring(xml)
    except ElementTree.ParseError as error:
        return [f"could not parse NCCL's topology dump: {error}"]
    lines = []
    for cpu in system.iter("cpu"):
        gpus, nics = [], []
        for gpu in cpu.iter("gpu"):
            n_nvlinks = sum(int(link.get("count", "1")) for link in gpu.iter("nvlink"))
            gpus.append(f"GPU{gpu.get('dev', '?')}" + (f" ({n_nvlinks} NVLinks)" if n_nvlinks else ""))
        for net in cpu.iter("net"):
            gdr = {"1": "GDR", "0": "no GDR"}.get(net.get("gdr", ""), "")
            nics.append(f"{net.get('name', '?')} {net.get('speed', '?')} Mb/s {gdr}".strip())
        lines.append(f"NUMA {cpu.get('numaid', '?')}: GPUs {', '.join(gpus) or '-'}; NICs {', '.join(nics) or '-'}")
    return lines or ["NCCL's topology dump lists no CPUs"]


__all__ = ["NCCL_HINT", "nccl_topology_dump", "summarise_nccl_topology"]
