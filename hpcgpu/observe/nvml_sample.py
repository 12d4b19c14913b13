"""One NVML reading of a GPU: utilisation, memory, temperature, power, clocks and throttle reasons.

Used by :class:`hpcgpu.observe.monitor.GpuMonitor` (which samples in a thread and keeps running statistics).
``nvml`` is any pynvml-like module (``pip install nvidia-ml-py``); nothing here imports it.
"""

from __future__ import annotations

#: Bits of ``nvmlDeviceGetCurrentClocksEventReasons`` (formerly ``...ThrottleReasons``), from nvml.h.
THROTTLE_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}

#: Reasons that mean the GPU runs slower than it could because of heat or power (worth a warning).
#: Idle, application clocks, sync boost and display clocks are normal operation.
HARMFUL_THROTTLE_REASONS = {
    "sw_power_cap": "power draw at the power limit",
    "hw_slowdown": "hardware slowdown (temperature or power brake)",
    "sw_thermal_slowdown": "driver thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "external power brake",
}

#: Metric name -> unit, in table order.
METRICS = {
    "utilization_gpu_percent": "%",
    "utilization_memory_percent": "%",
    "memory_used_gib": "GiB",
    "memory_total_gib": "GiB",
    "temperature_c": "°C",
    "power_w": "W",
    "power_limit_w": "W",
    "sm_clock_mhz": "MHz",
    "memory_clock_mhz": "MHz",
}

_GIB = 1024.0**3


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks-event (throttle) reason bitmask, lowest bit first.

    Unknown bits (newer drivers) come out as ``unknown_0x...`` rather than being dropped.
    """
    mask = int(mask)
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def read_sample(nvml, handle) -> dict:
    """One reading of every metric of ``handle`` through the pynvml-like module ``nvml``.

    Each query is separate: a metric the GPU does not support (NVML raises ``NotSupported``) is left
    out instead of losing the whole sample.

    Returns
    -------
    dict
        Keys of :data:`METRICS` (floats, in their units) that could be read, and ``throttle_reasons``
        (list of names) when the reasons could be read.
    """
    sample: dict = {}

    def query(fn):
        try:
            return fn()
        except Exception:  # NVMLError_NotSupported, NoPermission, ...: skip this metric only
            return None

    rates = query(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    if rates is not None:
        sample["utilization_gpu_percent"] = float(rates.gpu)
        sample["utilization_memory_percent"] = float(rates.memory)
    memory = query(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        sample["memory_used_gib"] = memory.used / _GIB
        sample["memory_total_gib"] = memory.total / _GIB
    readings = {
        "temperature_c": (lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), 1.0),
        "power_w": (lambda: nvml.nvmlDeviceGetPowerUsage(handle), 1e-3),              # milliwatts
        "power_limit_w": (lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), 1e-3),
        "sm_clock_mhz": (lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), 1.0),
        "memory_clock_mhz": (lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM), 1.0),
    }
    for name, (fn, scale) in readings.items():
        value = query(fn)
        if value is not None:
            sample[name] = float(value) * scale
    # Renamed in CUDA 12 (clocks "event" reasons); older pynvml and drivers only know the old name.
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        reasons_fn = getattr(nvml, name, None)
        mask = query(lambda: reasons_fn(handle)) if reasons_fn is not None else None
        if mask is not None:
            sample["throttle_reasons"] = decode_throttle_reasons(mask)
            break
    return sample


__all__ = ["HARMFUL_THROTTLE_REASONS", "METRICS", "THROTTLE_REASONS", "decode_throttle_reasons", "read_sample"]
