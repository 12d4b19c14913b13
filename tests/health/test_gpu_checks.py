"""GPU health readings this machine cannot produce (ECC, row remaps, XID, NVLink, throttling, PCIe width),
through a fake NVML passed to :class:`hpcgpu.health.readings.NvmlSource`, judged by
:func:`hpcgpu.health.gpu_checks.judge_gpu`."""

import pytest

from hpcgpu.health import gpu_checks
from hpcgpu.health.findings import FAIL, OK, SKIP, WARN, Finding, nodes_to_exclude, worst
from hpcgpu.health.readings import NvmlSource, normalise_bus_id, parse_xid_lines
from hpcgpu.health.thresholds import Thresholds, parse_size
from tests.health.fake_nvml import FakeNvml

BUS = "0000:3b:00"


def judged(xids=None, **values):
    source = NvmlSource(FakeNvml({BUS: values}))
    reading = source.read(BUS)
    return {f.check: f for f in gpu_checks.judge_gpu(reading, Thresholds(), "node7", 3, BUS, xids)}, reading


def test_a_healthy_gpu_passes_every_check():
    found, reading = judged(xids=[])
    assert {check: f.status for check, f in found.items()} == {
        "ecc": OK, "row remap": OK, "xid": OK, "temperature": OK, "clocks": OK, "power cap": OK, "pcie": OK,
        "nvlink": OK}
    assert found["nvlink"].detail == "18 of 18 link(s) active"
    assert gpu_checks.peak_memory_bandwidth(reading) == pytest.approx(3.352e12, rel=1e-3)   # H100 SXM


@pytest.mark.parametrize("values, check, status, words", [
    ({"ecc_volatile": 2, "ecc_aggregate": 2}, "ecc", FAIL, "2 uncorrectable"),
    ({"ecc_aggregate": 1}, "ecc", WARN, "in the GPU's life"),
    ({"ecc_mode": 0}, "ecc", WARN, "ECC is off"),
    ({"rows": (0, 1, 1, 0)}, "row remap", FAIL, "pending"),
    ({"rows": (0, 8, 0, 1)}, "row remap", FAIL, "ran out of spare rows"),
    ({"nvlinks": [1] * 16 + [0, 0]}, "nvlink", FAIL, "16 of 18"),
    ({"width": 8}, "pcie", FAIL, "x8 of x16"),
    ({"gen": 1}, "pcie", OK, "lower at idle is normal"),
    ({"reasons": 0x040, "sm": 1200}, "clocks", FAIL, "hw_thermal_slowdown"),
    ({"reasons": 0x004}, "clocks", WARN, "sw_power_cap"),
    ({"temperature": 88}, "temperature", FAIL, "slowdown at 90"),
    ({"temperature": 86, "slowdown": None}, "temperature", WARN, "86 °C"),
    ({"limit": 400_000}, "power cap", WARN, "400 W of the default 700 W"),
])
def test_each_fault_is_named_with_its_status(values, check, status, words):
    found, _ = judged(xids=[], **values)
    assert found[check].status == status and words in found[check].detail, found[check]
    assert found[check].host == "node7" and found[check].rank == 3 and found[check].gpu == BUS


def test_readings_the_gpu_does_not_report_are_skipped_not_failed():
    found, _ = judged(xids=None, rows=None, ecc_volatile=None, ecc_aggregate=None, nvlinks=[])
    assert found["row remap"].status == SKIP and found["ecc"].status == SKIP and found["nvlink"].status == SKIP
    assert found["xid"].status == SKIP


def test_xid_events_from_the_kernel_log_are_matched_to_the_gpu():
    lines = ["[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=123, GPU has fallen off the bus.",
             "6,1234,5678,-;NVRM: Xid (PCI:0000:5e:00): 13, Graphics Exception",
             "unrelated line"]
    events = parse_xid_lines(lines)
    assert [e["xid"] for e in events[BUS]] == [79] and [e["xid"] for e in events["0000:5e:00"]] == [13]
    assert judged(xids=events[BUS])[0]["xid"].status == FAIL
    assert judged(xids=events["0000:5e:00"])[0]["xid"].status == WARN
    assert normalise_bus_id("00000000:3B:00.0") == normalise_bus_id("PCI:0000:3b:00") == BUS


def test_gpu_count_against_the_request():
    assert gpu_checks.requested_gpus({"SLURM_GPUS_ON_NODE": "4"}) == (4, "SLURM_GPUS_ON_NODE")
    assert gpu_checks.requested_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"})[0] == 3
    assert gpu_checks.requested_gpus({})[0] is None
    assert gpu_checks.gpu_count_finding(3, "NVML", 4, "SLURM_GPUS_ON_NODE", 4, "n").status == FAIL
    assert gpu_checks.gpu_count_finding(4, "NVML", 4, "SLURM_GPUS_ON_NODE", 8, "n").status == WARN
    assert gpu_checks.gpu_count_finding(None, "no NVML", 4, "x", 4, "n").status == SKIP


def test_device_bandwidth_against_the_peak():
    reading = {"max_memory_clock_mhz": 2619, "memory_bus_width_bits": 5120}
    judge = lambda measured: gpu_checks.judge_device_bandwidth(measured, reading, Thresholds(), "n", 0, BUS)  # noqa
    assert judge(2.9e12).status == OK and judge(2.0e12).status == WARN and judge(1.0e12).status == FAIL
    assert judge(None).status == SKIP


def test_failing_gpus_exclude_their_node_and_shared_problems_exclude_none():
    findings = [Finding("ecc", FAIL, "", "a", scope="gpu"), Finding("free space", FAIL, "", "b", scope="node"),
                Finding("free space", OK, "", "c", scope="node"), Finding("allreduce", FAIL, "", None, scope="job")]
    assert nodes_to_exclude(findings, ["a", "b", "c"]) == ["a", "b"]
    everywhere = [Finding("free space", FAIL, "", host, scope="node") for host in "abc"]
    assert nodes_to_exclude(everywhere, ["a", "b", "c"]) == []
    assert worst([OK, SKIP, WARN]) == WARN and worst([SKIP]) == OK


def test_sizes():
    assert parse_size("20G") == 20 * 10**9 and parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size("4096") == 4096
    with pytest.raises(ValueError, match="expected a size"):
        parse_size("lots")
