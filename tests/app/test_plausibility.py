"""The throughput guard: a rate that would need more memory traffic than the GPU can copy is an error."""

import pytest

import hpcgpu
from hpcgpu.app.plausibility import ImplausibleResultError, check_throughput, copy_bandwidth


def test_no_bound_and_cpu_runs_are_not_checked():
    comm = hpcgpu.Communicator()
    cpu = hpcgpu.arch.CPU()
    assert copy_bandwidth(cpu) is None
    assert check_throughput(comm, cpu, 1e30, "cell-updates/s", 48) == {}


@pytest.mark.gpu
def test_gpu_copy_bandwidth_is_measured_and_bounds_the_throughput(cupy, monkeypatch):
    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend="cupy")
    ceiling = copy_bandwidth(arch)
    assert 1e11 < ceiling < 2e13   # bytes/s: from a laptop GPU to well above an H200's 4.2 TB/s
    # The broken shallow-water --graph path reported 1.1e11 cell-updates/s at 3600 x 1800 fp64.
    with pytest.raises(ImplausibleResultError, match="TB/s per GPU"):
        check_throughput(comm, arch, 1.1e11, "cell-updates/s", 48)
    report = check_throughput(comm, arch, 0.5 * ceiling / 48, "cell-updates/s", 48)
    assert report["implied_bytes_per_second_per_gpu"] < report["copy_bandwidth_bytes_per_second"]
    monkeypatch.setenv("HPCGPU_COPY_BANDWIDTH", "1e9")
    with pytest.raises(ImplausibleResultError):
        check_throughput(comm, arch, 1e8, "cell-updates/s", 48)
