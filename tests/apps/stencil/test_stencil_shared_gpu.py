"""Two ranks sharing one GPU over the host-staged transport (``mpi-staged``, no NCCL): the default path
steps eagerly and gives the one-rank checksum, and ``--graph`` is refused with the reason.

A CUDA graph replays stream work only. A halo exchange through ``mpi-staged`` (or ``mpi-cuda``)
synchronises the stream and calls MPI on the host: captured, its messages would not be sent on replay
(stale ghosts) or the capture fails (``cudaErrorStreamCaptureUnjoined``, what the default path hit
before the driver checked the transport). This is the path of a multi-GPU job without a usable NCCL;
one GPU shared by two ranks (``HPCGPU_ALLOW_GPU_SHARING=1``) runs it on the one-GPU machine.

Run on the GPU machine::

    python -m pytest tests/apps/stencil/test_stencil_shared_gpu.py -m gpu -q
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SHARED_STAGED = {"HPCGPU_ALLOW_GPU_SHARING": "1", "HPCGPU_TRANSPORT": "mpi-staged"}

pytestmark = pytest.mark.gpu

CASES = {
    "swe": ["--model", "swe", "--nx", "203", "--ny", "97", "--steps", "40"],
    "jacobi": ["--model", "jacobi", "--nx", "259", "--ny", "131", "--steps", "60"],
    "heat3d": ["--model", "heat3d", "--nx", "37", "--ny", "29", "--nz", "41", "--steps", "30"],
    "latlon": ["--grid", "latlon", "--nx", "144", "--ny", "72", "--steps", "200"],   # history every 4 steps: windows
}


def _run(tmp_path, tag, ranks, args):
    from hpcgpu.jobs.launch import run_mpi

    summary = tmp_path / f"{tag}.json"
    result = run_mpi(ranks, [sys.executable, "-m", "apps.stencil", *args, "--backend", "cupy", "--no-plot",
                             "--snapshot-every", "0", "--output", str(tmp_path / tag), "--summary", str(summary)],
                     timeout=300, env=SHARED_STAGED, cwd=str(ROOT))
    return result, (json.loads(summary.read_text()) if result.returncode == 0 and summary.is_file() else None)


@pytest.mark.gpus(1)
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_on_mpi_staged_step_eagerly_with_the_one_rank_checksum(tmp_path, case):
    pytest.importorskip("cupy")
    args = CASES[case]
    one_result, one = _run(tmp_path, "one", 1, args)
    assert one is not None, one_result.output[-4000:]
    assert one["graph"] is True, "one rank exchanges nothing between ranks: graphs stay on"
    two_result, two = _run(tmp_path, "two", 2, args)
    assert two is not None, two_result.output[-4000:]
    assert two["n_ranks"] == 2 and two["transport"] == "mpi-staged"
    assert two["graph"] is False
    assert "note: steps run eagerly (no CUDA graphs)" in two_result.output
    assert two["checksum"] == one["checksum"], (case, one["checksum"], two["checksum"])
    refused, _ = _run(tmp_path, "refused", 2, args + ["--graph"])
    assert refused.returncode == 2, refused.output[-3000:]
    assert "--graph does not apply" in refused.output and "mpi-staged transport" in refused.output
