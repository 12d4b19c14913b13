"""The GPU monitor (hpcgpu.observe.monitor) with a fake NVML, its no-op paths, and the --monitor/--profile flags."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from hpcgpu.observe import monitor
from hpcgpu.errors import ConfigurationError
from hpcgpu.observe.monitor import GpuMonitor, format_monitor
from hpcgpu.observe.nvml_sample import decode_throttle_reasons
from hpcgpu.observe.profiling import handle_profile_flag, nsys_command, under_nsys

BUS_ID = "00000000:3B:00.0"
GIB = 1024**3


class NotSupported(Exception):
    """Stands in for pynvml.NVMLError_NotSupported."""


class FakeNvml:
    """Just enough of pynvml: replays a script of readings, one entry per sample.

    Each script entry is a dict with temperature (C), power (W), mask (throttle bitmask), util (%).
    The memory clock is 'not supported' on this fake device, as on some real boards.
    """

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, script):
        self.script = list(script)
        self.index = -1
        self.threads = set()
        self.initialised = self.shut_down = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.shut_down += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        assert bus_id == BUS_ID
        return "handle"

    def _now(self):
        return self.script[min(self.index, len(self.script) - 1)]

    def nvmlDeviceGetUtilizationRates(self, handle):
        # The first query of a sample advances the script.
        self.index += 1
        self.threads.add(threading.current_thread().name)
        return SimpleNamespace(gpu=self._now()["util"], memory=self._now()["util"] / 2)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=10 * GIB, total=80 * GIB)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._now()["temperature"]

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(self._now()["power"] * 1000)   # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlDeviceGetClockInfo(self, handle, clock):
        if clock == self.NVML_CLOCK_MEM:
            raise NotSupported("memory clock")
        return 1980 if self._now()["mask"] == 0 else 1500

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._now()["mask"]


def fake_comm(records_of_other_ranks=()):
    calls = []

    def allgather(value):
        calls.append(threading.current_thread() is threading.main_thread())
        return [value, *records_of_other_ranks]

    return SimpleNamespace(prefix="[rank 0/1]", rank=0, size=1 + len(records_of_other_ranks),
                           mpi=SimpleNamespace(allgather=allgather), calls=calls)


GPU_ARCH = SimpleNamespace(is_gpu=True, identity=SimpleNamespace(pci_bus_id=BUS_ID))
CPU_ARCH = SimpleNamespace(is_gpu=False)


def reading(temperature=60, power=300.0, mask=0, util=90):
    return {"temperature": temperature, "power": power, "mask": mask, "util": util}


def test_decode_throttle_reasons():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x1 | 0x20) == ["gpu_idle", "sw_thermal_slowdown"]
    assert decode_throttle_reasons(0x4 | 0x8 | 0x40 | 0x80) == [
        "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    # A bit this version does not know is kept, not dropped.
    assert decode_throttle_reasons(0x2 | 0x800) == ["applications_clocks_setting", "unknown_0x800"]


def test_sampling_statistics_and_warnings_once_per_onset():
    script = [reading(80, 250.0, 0x1, 10), reading(87, 690.0, 0x4 | 0x40, 100), reading(88, 700.0, 0x4, 100),
              reading(84, 400.0, 0x0, 50), reading(90, 500.0, 0x0, 60)]
    nvml, lines = FakeNvml(script), []
    gpu_monitor = GpuMonitor(fake_comm(), GPU_ARCH, interval=0.01, nvml=nvml, emit_fn=lines.append)
    assert gpu_monitor.active and gpu_monitor.reason is None
    for _ in script:
        gpu_monitor.sample_once()
    record = gpu_monitor.local_summary()
    assert record["n_samples"] == 5 and record["device"] == BUS_ID
    temperature = record["metrics"]["temperature_c"]
    assert (temperature["min"], temperature["max"]) == (80.0, 90.0)
    assert temperature["mean"] == pytest.approx((80 + 87 + 88 + 84 + 90) / 5)
    assert record["metrics"]["power_w"]["max"] == pytest.approx(700.0)
    assert record["metrics"]["power_limit_w"]["mean"] == pytest.approx(700.0)
    assert record["metrics"]["memory_used_gib"]["mean"] == pytest.approx(10.0)
    assert record["metrics"]["sm_clock_mhz"]["min"] == 1500.0
    assert "memory_clock_mhz" not in record["metrics"]   # unsupported: skipped, the rest of the sample kept
    assert record["throttle_reasons"] == {"gpu_idle": 0.2, "hw_thermal_slowdown": 0.2, "sw_power_cap": 0.4}
    # Hot at samples 2 and 5 (two onsets; 88 C continues the first); throttles start at sample 2 only.
    hot = [line for line in lines if "above 85" in line]
    assert len(hot) == 2 and "87 °C" in hot[0] and "90 °C" in hot[1]
    throttled = [line for line in lines if "throttled" in line]
    assert len(throttled) == 2
    assert any("hw_thermal_slowdown" in line for line in throttled)
    assert any("sw_power_cap" in line for line in throttled)
    assert all(line.startswith("[rank 0/1] warning: GPU " + BUS_ID) for line in lines)
    assert record["warnings"] == lines


def test_flapping_condition_is_printed_three_times_then_counted():
    script = [reading(90 if i % 2 == 0 else 70) for i in range(10)]   # 5 onsets of "hot"
    lines = []
    gpu_monitor = GpuMonitor(fake_comm(), GPU_ARCH, nvml=FakeNvml(script), emit_fn=lines.append)
    for _ in script:
        gpu_monitor.sample_once()
    assert len(lines) == 3 and lines[-1].endswith("(further onsets of this condition are counted, not printed)")
    assert gpu_monitor.local_summary()["onsets"] == {"hot": 5}


def test_old_throttle_reason_function_is_used_when_the_new_one_fails():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
            raise RuntimeError("NVML_ERROR_FUNCTION_NOT_FOUND")

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
            return 0x40

    sample = GpuMonitor(fake_comm(), GPU_ARCH, nvml=OldDriver([reading()]), emit_fn=lambda line: None).sample_once()
    assert sample["throttle_reasons"] == ["hw_thermal_slowdown"]


def test_summary_over_ranks_and_table():
    other = {"active": True, "reason": None, "device": "00000000:5D:00.0", "n_samples": 3, "n_errors": 0,
             "metrics": {"temperature_c": {"min": 50.0, "mean": 55.0, "max": 95.0}},
             "throttle_reasons": {"hw_slowdown": 1.0}, "warnings": ["[rank 1/2] warning: hot"]}
    comm = fake_comm([other])
    gpu_monitor = GpuMonitor(comm, GPU_ARCH, nvml=FakeNvml([reading(70), reading(72)]), emit_fn=lambda line: None)
    gpu_monitor.sample_once()
    gpu_monitor.sample_once()
    summary = gpu_monitor.summary(comm)
    assert summary["enabled"] and summary["reason"] is None
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["overall"]["temperature_c"] == {"min": 50.0, "mean": pytest.approx((71.0 + 55.0) / 2), "max": 95.0}
    assert summary["warnings"] == ["[rank 1/2] warning: hot"]
    table = format_monitor(summary)
    assert BUS_ID in table and "hw_slowdown 100%" in table and "warnings: 1" in table


def test_thread_samples_then_stops_promptly_without_mpi():
    nvml = FakeNvml([reading()])
    comm = fake_comm()
    gpu_monitor = GpuMonitor(comm, GPU_ARCH, interval=30.0, nvml=nvml, emit_fn=lambda line: None)
    with gpu_monitor:
        assert gpu_monitor.running
        deadline = time.monotonic() + 10
        while gpu_monitor.n_samples == 0 and time.monotonic() < deadline:
            time.sleep(0.01)   # the first sample is taken as soon as the thread starts
        started = time.monotonic()
    stop_seconds = time.monotonic() - started
    assert gpu_monitor.n_samples == 1
    assert stop_seconds < 5.0, "stop() must not wait for the 30 s interval"
    assert not gpu_monitor.running
    assert nvml.threads == {"hpcgpu-gpu-monitor"}   # sampled on the monitor thread ...
    assert nvml.shut_down == nvml.initialised == 1
    gpu_monitor.summary(comm)
    assert comm.calls == [True]                      # ... and MPI only from the caller's thread


def test_no_op_without_gpu_without_nvml_and_when_not_requested(monkeypatch):
    comm = fake_comm()
    cpu = GpuMonitor(comm, CPU_ARCH)
    assert not cpu.active and cpu.reason.startswith("no GPU")
    assert not cpu.start().running
    summary = cpu.summary(comm)
    assert summary["enabled"] is False and summary["reason"].startswith("no GPU")
    assert format_monitor(summary).startswith("GPU monitor off: no GPU")

    def no_pynvml():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(monitor, "_import_pynvml", no_pynvml)
    missing = GpuMonitor(comm, GPU_ARCH)
    assert not missing.active and missing.reason.startswith("NVML not available")
    assert missing.summary(comm)["reason"].startswith("NVML not available")

    class BrokenNvml(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("driver not loaded")

    broken = GpuMonitor(comm, GPU_ARCH, nvml=BrokenNvml([reading()]))
    assert not broken.active and "driver not loaded" in broken.reason

    options = SimpleNamespace(monitor=False, monitor_interval=1.0)
    unrequested = GpuMonitor.from_options(comm, GPU_ARCH, options)
    assert unrequested.finish(comm) == {} and comm.calls == [True, True]   # no collective when not asked for
    options.monitor = True
    requested = GpuMonitor.from_options(comm, CPU_ARCH, options)
    assert requested.finish(comm)["gpu_monitor"]["reason"].startswith("no GPU")


def test_monitor_flags_in_both_apps():
    from apps.md.app import build_parser as md_parser
    from apps.stencil.app import build_parser as stencil_parser
    from hpcgpu.app.cli import parse_args

    for build in (stencil_parser, md_parser):
        options = parse_args(build(), ["--monitor", "--monitor-interval", "0.5", "--profile"])
        assert options.monitor and options.monitor_interval == 0.5 and options.profile
        defaults = parse_args(build(), [])
        assert not defaults.monitor and defaults.monitor_interval == 1.0 and not defaults.profile
        with pytest.raises(ConfigurationError):
            parse_args(build(), ["--monitor-interval", "0"])


def test_nsys_commands():
    args = ["--model", "jacobi", "--nx", "64"]
    openmpi = nsys_command("apps.stencil", args, 4, "mpiexec", "openmpi")
    assert openmpi.startswith("mpiexec -n 4 nsys profile -t cuda,nvtx,mpi --mpi-impl=openmpi")
    assert "profile_%q{OMPI_COMM_WORLD_RANK}" in openmpi and openmpi.endswith("python -m apps.stencil --model jacobi --nx 64")
    assert "profile_%q{PMI_RANK}" in nsys_command("apps.md", [], 2, "mpiexec", "mpich")
    assert nsys_command("apps.md", [], 8, "srun", "mpich").startswith("srun -n 8 nsys profile")
    assert "profile_%q{SLURM_PROCID}" in nsys_command("apps.md", [], 8, "srun", "openmpi")
    assert under_nsys({"NSYS_PROFILING_SESSION_ID": "1"}) and not under_nsys({"PATH": "/bin"})


def test_profile_flag_under_nsys_runs_normally(monkeypatch, capsys):
    comm = SimpleNamespace(rank=0, size=1)
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "7")
    assert handle_profile_flag(comm, SimpleNamespace(profile=True), "apps.md", ["--profile"]) is False
    assert "running under Nsight Systems" in capsys.readouterr().out
    assert handle_profile_flag(comm, SimpleNamespace(profile=False), "apps.md", []) is False


def test_profile_flag_prints_the_command_and_exits_zero(tmp_path):
    result = subprocess.run([sys.executable, "-m", "apps.stencil", "--model", "jacobi", "--nx", "64", "--profile"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={k: v for k, v in __import__("os").environ.items() if not k.startswith("NSYS_")})
    assert result.returncode == 0, result.stderr
    commands = [line.strip() for line in result.stdout.splitlines() if "nsys profile" in line]
    assert len(commands) == 2   # mpiexec and srun
    assert all("-t cuda,nvtx,mpi" in c and c.endswith("python -m apps.stencil --model jacobi --nx 64") for c in commands)
    assert not (tmp_path / "output").exists()   # nothing ran


@pytest.mark.mpi(ranks=[2])
def test_summary_is_collective_on_the_cpu(comm, mpi_ranks):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    with GpuMonitor(comm, arch, interval=0.05) as gpu_monitor:
        pass
    summary = gpu_monitor.summary(comm)
    assert not summary["enabled"] and summary["reason"].startswith("no GPU")
    assert [r["rank"] for r in summary["ranks"]] == list(range(comm.size))


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1])
def test_real_nvml_samples_this_ranks_gpu(comm, mpi_ranks):
    pytest.importorskip("cupy")
    pytest.importorskip("pynvml")
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="cupy")
    with GpuMonitor(comm, arch, interval=0.1) as gpu_monitor:
        x = arch.xp.ones((4096, 4096), dtype="float32")
        for _ in range(20):
            x = x @ x / 4096.0
        arch.synchronize()
        time.sleep(0.35)
    summary = gpu_monitor.summary(comm)
    assert summary["enabled"], summary["reason"]
    metrics = summary["ranks"][0]["metrics"]
    assert summary["ranks"][0]["n_samples"] >= 2
    assert 0 < metrics["memory_used_gib"]["max"] <= metrics["memory_total_gib"]["max"]
    assert 0 < metrics["temperature_c"]["max"] < 120
    assert "sm_clock_mhz" in metrics


@pytest.mark.gpu
def test_stencil_app_records_the_monitor_on_a_gpu(tmp_path):
    pytest.importorskip("cupy")
    pytest.importorskip("pynvml")
    import json
    import os

    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "apps.stencil", "--model", "jacobi", "--nx", "2048", "--ny", "2048", "--steps", "300",
         "--backend", "cupy", "--monitor", "--monitor-interval", "0.05", "--output", str(tmp_path),
         "--summary", str(summary_path)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, HPCGPU_ALLOW_GPU_SHARING="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(summary_path.read_text())["gpu_monitor"]
    assert record["enabled"], record["reason"]
    assert record["ranks"][0]["n_samples"] >= 1
    assert record["overall"]["memory_total_gib"]["max"] > 1
    assert "GPU monitor (every 0.05 s" in result.stdout
