"""A run that cannot fit in memory is refused before it allocates: one line naming what it needs and
what the node has, exit 2, the same on every rank, and no output written (hpcgpu.app.memory and each
app's estimate). The estimates are lower bounds of what a run really takes."""

import sys
from pathlib import Path

import pytest

from hpcgpu.app.memory import MemoryEstimate, available_host_bytes, format_bytes, refuse_if_too_large
from hpcgpu.errors import ConfigurationError
from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]


def test_format_bytes_and_what_the_node_has():
    assert format_bytes(512) == "512 bytes" and format_bytes(1536) == "1.5 KiB"
    assert format_bytes(2.13 * 2**50) == "2.13 PiB"
    assert 0 < available_host_bytes() < 2**60


def test_refusal_is_one_replicated_configuration_error():
    import hpcgpu

    comm = hpcgpu.Communicator()
    refuse_if_too_large(comm, "app", MemoryEstimate(1024, "host", "tiny"), "fix it")   # fits: nothing happens
    with pytest.raises(ConfigurationError) as caught:
        refuse_if_too_large(comm, "app", MemoryEstimate(2.0**70, "host", "3 arrays"), "use a smaller grid")
    text = str(caught.value)
    assert caught.value.replicated and "\n" not in text
    assert text.startswith("app: this run needs at least 1 ZiB of host memory per rank (3 arrays), but node ")
    assert text.endswith("; use a smaller grid")


def test_estimates_are_lower_bounds_of_small_runs():
    """At an everyday size the estimates stay below what the runs take (measured peak resident memory
    over the interpreter's own, on this CPU: swe 52, latlon 88, jacobi fp32 10, heat3d 46 bytes per
    cell; md 530 bytes per atom)."""
    import argparse

    from apps.md.app import build_parser as md_parser, make_config, memory_estimate as md_estimate
    from apps.stencil.app import build_parser as stencil_parser, memory_estimate, resolve_options
    from hpcgpu.app.cli import parse_args

    measured_per_cell = {("swe", "channel"): 52, ("swe", "latlon"): 88, ("jacobi", "channel"): 10,
                         ("heat3d", "channel"): 46}
    for (model, grid), measured in measured_per_cell.items():
        config = resolve_options(parse_args(stencil_parser(0), ["--model", model, "--grid", grid, "--nx", "64",
                                                                "--ny", "32", "--nz", "8"]))
        estimate = memory_estimate(config, 1, on_gpu=False)
        cells = 64 * 32 * (8 if model == "heat3d" else 1)
        assert 0.5 * measured * cells <= estimate.bytes_per_rank <= measured * cells, (model, grid)
        assert memory_estimate(config, 4, on_gpu=True).bytes_per_rank == estimate.bytes_per_rank / 4
    options = parse_args(md_parser(0), ["--cells", "30"])
    estimate = md_estimate(options, make_config(options), 2, on_gpu=False)
    assert estimate.where == "host" and 0.5 * 530 * 54000 <= estimate.bytes_per_rank <= 530 * 54000
    assert md_estimate(argparse.Namespace(**{**vars(options), "data": "x.data"}), make_config(options), 1,
                       False) is None


@pytest.mark.parametrize("argv, needs", [
    (["apps.stencil", "--nx", "10000000", "--ny", "10000000"], "swe on 10000000 x 10000000 cells"),
    (["apps.md", "--cells", "100000"], "4e+15 atoms"),
    (["apps.train", "--model", "large-mlp", "--width", "10000000"], "large-mlp of 4e+14 hidden weights"),
])
def test_an_impossible_size_is_refused_in_one_line_with_exit_2(tmp_path, argv, needs):
    out = tmp_path / "out"
    result = run_mpi(2, [sys.executable, "-m", *argv, "--output", str(out), "--quiet"], timeout=120,
                     cwd=str(ROOT), env={"NUMBA_NUM_THREADS": "1"})
    assert result.returncode == 2, result.output[-3000:]
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output[-3000:]
    assert lines[0].startswith(f"error: {argv[0]}: this run needs at least ") and needs in lines[0]
    assert " of host memory per rank " in lines[0] and " available for its 2 ranks " in lines[0]
    assert "Traceback" not in result.output and not out.exists()
