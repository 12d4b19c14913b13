"""A stand-in NVML for the health tests: the functions and constants of pynvml that
:class:`hpcgpu.health.readings.NvmlSource` calls, answering from a dict per GPU.

Used to exercise readings this machine cannot produce (ECC errors, pending row remaps, XID, NVLink,
throttling); it is passed in as an object, never patched over the real library.
"""

from __future__ import annotations

from types import SimpleNamespace


class NotSupported(Exception):
    """What pynvml raises for a query the GPU does not support."""


HEALTHY = {
    "name": "Fake H100", "uuid": "GPU-fake", "ecc_mode": 1, "ecc_volatile": 0, "ecc_aggregate": 0,
    "rows": (0, 0, 0, 0), "temperature": 45, "slowdown": 90, "sm": 1980, "max_sm": 1980, "mem": 2619,
    "max_mem": 2619, "bus_width": 5120, "power": 120_000, "limit": 700_000, "default_limit": 700_000,
    "reasons": 0x001, "gen": 5, "max_gen": 5, "width": 16, "max_width": 16, "nvlinks": [1] * 18,
}


class FakeNvml:
    """pynvml-like: ``FakeNvml({"0000:3b:00": {...}, ...})``; each GPU's dict overrides :data:`HEALTHY`."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    def __init__(self, gpus: dict[str, dict]):
        self.gpus = {bus: {**HEALTHY, **values} for bus, values in gpus.items()}
        self.order = list(self.gpus)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.order)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.order[index]

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        return bus_id

    def nvmlDeviceGetPciInfo(self, handle):
        domain, bus, device = handle.split(":")
        return SimpleNamespace(busId=f"0000{domain}:{bus.upper()}:{device}.0".encode())

    def _get(self, handle, key):
        value = self.gpus[handle][key]
        if value is None:
            raise NotSupported(key)
        return value

    def nvmlDeviceGetName(self, h): return self._get(h, "name")
    def nvmlDeviceGetUUID(self, h): return self._get(h, "uuid")
    def nvmlDeviceGetEccMode(self, h): return (self._get(h, "ecc_mode"), self._get(h, "ecc_mode"))

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        return self._get(h, "ecc_volatile" if counter == self.NVML_VOLATILE_ECC else "ecc_aggregate")

    def nvmlDeviceGetRemappedRows(self, h): return self._get(h, "rows")
    def nvmlDeviceGetTemperature(self, h, sensor): return self._get(h, "temperature")
    def nvmlDeviceGetTemperatureThreshold(self, h, kind): return self._get(h, "slowdown")

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._get(h, "sm" if clock == self.NVML_CLOCK_SM else "mem")

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._get(h, "max_sm" if clock == self.NVML_CLOCK_SM else "max_mem")

    def nvmlDeviceGetMemoryBusWidth(self, h): return self._get(h, "bus_width")
    def nvmlDeviceGetPowerUsage(self, h): return self._get(h, "power")
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._get(h, "limit")
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h): return self._get(h, "default_limit")
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self._get(h, "reasons")
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return self._get(h, "gen")
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return self._get(h, "max_gen")
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return self._get(h, "width")
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return self._get(h, "max_width")

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self._get(h, "nvlinks")
        if link >= len(links):
            raise NotSupported("no such link")
        return links[link]

    def nvmlDeviceGetUtilizationRates(self, h): raise NotSupported("utilisation")
    def nvmlDeviceGetMemoryInfo(self, h): raise NotSupported("memory")


class FakeSource:
    """An :class:`~hpcgpu.health.readings.NvmlSource` over :class:`FakeNvml` with XID events of its own
    (instead of the kernel log): ``xid_events() -> ({bus: [{"xid": 79, ...}]}, note)``."""

    def __init__(self, gpus: dict[str, dict], xids: dict[str, list[int]] | None = None):
        from hpcgpu.health.readings import NvmlSource

        self.source = NvmlSource(FakeNvml(gpus))
        self.xids = {bus: [{"xid": code, "text": "injected"} for code in codes] for bus, codes in (xids or {}).items()}

    def __getattr__(self, name):
        return getattr(self.source, name)

    def xid_events(self):
        return self.xids, "injected XID events"
