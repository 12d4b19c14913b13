"""What NVML says about one GPU, as one plain dict: the input of :mod:`hpcgpu.health.gpu_checks`.

:class:`NvmlSource` reads through any pynvml-like module (``pip install nvidia-ml-py``; tests pass a
fake one with the same functions), one query at a time: a reading the GPU or driver does not support
is left out of the dict, never fatal. The dict's keys (absent when unknown):

=============================== =========================================================================
``name``, ``uuid``              the GPU's name and UUID
``ecc_enabled``                 bool: ECC mode currently on
``ecc_volatile_uncorrected``    uncorrectable ECC errors since the driver loaded
``ecc_aggregate_uncorrected``   uncorrectable ECC errors over the GPU's life
``remap_pending``               bool: a row remap waits for a GPU reset
``remap_failure``               bool: a row remap failed (no spare rows left)
``remapped_rows_uncorrectable`` rows remapped because of uncorrectable errors
``temperature_c``               current temperature; ``slowdown_temperature_c`` where clocks drop
``sm_clock_mhz``                current SM clock; ``max_sm_clock_mhz`` its maximum
``memory_clock_mhz``            current memory clock; ``max_memory_clock_mhz``, ``memory_bus_width_bits``
``throttle_reasons``            names of the clocks-event reasons set (:mod:`hpcgpu.observe.nvml_sample`)
``power_limit_w``               enforced power limit; ``default_power_limit_w`` the board's default
``pcie_generation``             current PCIe generation; ``pcie_max_generation`` the most both ends allow
``pcie_width``                  current lanes; ``pcie_max_width``
``nvlink_links``                NVLinks the GPU has; ``nvlink_active`` of those, active
=============================== =========================================================================

XID errors are not kept by NVML; :func:`kernel_log_xids` reads them from the kernel log where this
process may (``/dev/kmsg``: root, or ``kernel.dmesg_restrict=0``).
"""

from __future__ import annotations

import os
import re

from hpcgpu.observe.nvml_sample import read_sample


def _import_pynvml():
    import pynvml

    return pynvml


def normalise_bus_id(bus_id: str) -> str:
    """``0000:3b:00`` for any spelling of a PCI address (NVML's ``00000000:3B:00.0``, the kernel's
    ``PCI:0000:3b:00``, CuPy's ``0000:3B:00.0``): domain in 4 digits, lower case, no function."""
    text = bus_id.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    domain, bus, device = parts[0], parts[1], parts[2].split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


class NvmlSource:
    """GPU readings through NVML.

    Parameters
    ----------
    nvml : module-like, optional
        pynvml or an object with the same functions and constants (tests); default ``import pynvml``.

    Attributes
    ----------
    available : bool
        NVML initialised; when False, ``reason`` says why (not installed, no driver).
    """

    def __init__(self, nvml=None):
        self.available, self.reason, self.nvml = False, None, None
        try:
            nvml = nvml if nvml is not None else _import_pynvml()
        except Exception as exc:
            self.reason = f"NVML not available ({type(exc).__name__}: {exc}; pip install nvidia-ml-py)"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.reason = f"NVML did not initialise ({type(exc).__name__}: {exc}): no NVIDIA driver on this node?"
            return
        self.nvml, self.available = nvml, True

    def close(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False

    def device_count(self) -> int:
        """GPUs on the node as NVML sees them (all of them: NVML ignores ``CUDA_VISIBLE_DEVICES``)."""
        return int(self.nvml.nvmlDeviceGetCount())

    def bus_ids(self) -> list[str]:
        """Normalised PCI addresses of the node's GPUs, in NVML's order."""
        ids = []
        for index in range(self.device_count()):
            info = self.nvml.nvmlDeviceGetPciInfo(self.nvml.nvmlDeviceGetHandleByIndex(index))
            bus = info.busId.decode() if isinstance(info.busId, bytes) else info.busId
            ids.append(normalise_bus_id(bus))
        return ids

    def read(self, bus_id: str) -> dict:
        """Every reading of the GPU at ``bus_id`` that NVML gives (see the module docstring)."""
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        reading: dict = {}

        def query(key, fn, convert=lambda value: value):
            try:
                value = fn()
            except Exception:   # NotSupported, NoPermission, an old driver: leave this one out
                return None
            reading[key] = convert(value)
            return value

        text = lambda value: value.decode() if isinstance(value, bytes) else str(value)   # noqa: E731
        query("name", lambda: nvml.nvmlDeviceGetName(handle), text)
        query("uuid", lambda: nvml.nvmlDeviceGetUUID(handle), text)
        query("ecc_enabled", lambda: nvml.nvmlDeviceGetEccMode(handle)[0], lambda v: bool(v))
        uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        query("ecc_volatile_uncorrected", lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", 0)), int)
        query("ecc_aggregate_uncorrected", lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, uncorrected, getattr(nvml, "NVML_AGGREGATE_ECC", 1)), int)
        rows = query("_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        reading.pop("_rows", None)
        if rows is not None:   # (correctable rows, uncorrectable rows, pending, failure)
            reading["remapped_rows_uncorrectable"] = int(rows[1])
            reading["remap_pending"] = bool(rows[2])
            reading["remap_failure"] = bool(rows[3])
        query("slowdown_temperature_c", lambda: nvml.nvmlDeviceGetTemperatureThreshold(
            handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), float)
        query("max_sm_clock_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM), float)
        query("max_memory_clock_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM), float)
        query("memory_bus_width_bits", lambda: nvml.nvmlDeviceGetMemoryBusWidth(handle), int)
        query("default_power_limit_w", lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle),
              lambda v: v * 1e-3)
        query("pcie_generation", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle), int)
        query("pcie_max_generation", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle), int)
        query("pcie_width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle), int)
        query("pcie_max_width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle), int)
        links = active = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except Exception:   # this link does not exist (or the GPU has no NVLink)
                continue
            links += 1
            active += int(state == getattr(nvml, "NVML_FEATURE_ENABLED", 1))
        if links:
            reading["nvlink_links"], reading["nvlink_active"] = links, active
        # Temperature, clocks, power and the throttle reasons, as the GPU monitor reads them.
        sample = read_sample(nvml, handle)
        for key in ("temperature_c", "sm_clock_mhz", "memory_clock_mhz", "power_limit_w", "power_w",
                    "throttle_reasons"):
            if key in sample:
                reading[key] = sample[key]
        return reading


#: A line of the NVIDIA driver in the kernel log: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen
#: off the bus.``
XID_LINE = re.compile(r"NVRM: Xid \((PCI:[0-9a-fA-F:.]+)\): (\d+),?\s*(.*)")


def parse_xid_lines(lines) -> dict[str, list[dict]]:
    """XID events in kernel log lines, by normalised PCI address: ``[{"xid": 79, "text": ...}, ...]``."""
    events: dict[str, list[dict]] = {}
    for line in lines:
        match = XID_LINE.search(line)
        if match:
            events.setdefault(normalise_bus_id(match.group(1)), []).append(
                {"xid": int(match.group(2)), "text": match.group(3).strip()[:160]})
    return events


def kernel_log_xids(path: str = "/dev/kmsg") -> tuple[dict[str, list[dict]] | None, str]:
    """XID events of the kernel log since boot, read without blocking, and where they came from.

    Returns
    -------
    (events, note)
        ``events`` by normalised PCI address (:func:`parse_xid_lines`), or None when the log cannot be
        read here; ``note`` says which (``"kernel log not readable: ..."``).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"kernel log not readable ({path}: {exc.strerror}; needs root or kernel.dmesg_restrict=0)"
    lines = []
    try:
        while len(lines) < 200_000:
            try:
                record = os.read(descriptor, 8192)
            except BlockingIOError:
                break   # the end of the buffer
            except OSError as exc:
                if exc.errno == 32:   # EPIPE: a record was overwritten while reading; go on
                    continue
                return None, f"kernel log not readable ({path}: {exc.strerror})"
            if not record:
                break
            lines.append(record.decode(errors="replace"))
    finally:
        os.close(descriptor)
    return parse_xid_lines(lines), f"kernel log ({path}, {len(lines)} records)"
