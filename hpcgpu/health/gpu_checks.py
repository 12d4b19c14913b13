"""Judging one GPU's readings (:mod:`hpcgpu.health.readings`) and the node's GPU count.

Each function returns :class:`~hpcgpu.health.findings.Finding` objects; a reading that is missing
gives a ``skip`` with the reason, never a failure (a driver too old to report row remapping is not a
broken GPU).
"""

from __future__ import annotations

import os

from hpcgpu.health.findings import FAIL, OK, SKIP, WARN, Finding
from hpcgpu.health.thresholds import CRITICAL_XIDS, Thresholds
from hpcgpu.observe.nvml_sample import HARMFUL_THROTTLE_REASONS

#: Clock-event reasons that are the hardware protecting itself (a failing node); the other harmful
#: reasons (power cap, driver thermal slowdown) give a warning.
HARDWARE_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def requested_gpus(environ=None) -> tuple[int | None, str]:
    """GPUs the job asked for on this node, and which variable said so.

    ``SLURM_GPUS_ON_NODE``, else ``CUDA_VISIBLE_DEVICES`` (its entries), else None (no request known).
    """
    environ = os.environ if environ is None else environ
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit():
        return int(on_node), "SLURM_GPUS_ON_NODE"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() not in ("", "-1", "NoDevFiles"):
        return len([entry for entry in visible.split(",") if entry.strip()]), "CUDA_VISIBLE_DEVICES"
    return None, "no GPU request (SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES unset)"


def gpu_count_finding(visible: int | None, how: str, requested: int | None, source: str, local_size: int,
                      host: str) -> Finding:
    """The node's usable GPU count against the job's request and the ranks on the node.

    Parameters
    ----------
    visible : int or None
        GPUs this process can use (None: cannot be counted here, ``how`` says why).
    how : str
        How they were counted (``"CuPy"``, ``"NVML"``) or why not.
    requested : int or None
        From :func:`requested_gpus` (``source`` names the variable).
    local_size : int
        Ranks on this node.
    """
    values = {"visible": visible, "requested": requested, "ranks_on_node": local_size}
    if visible is None:
        return Finding("gpu count", SKIP, f"cannot count GPUs: {how}", host, scope="gpu", values=values)
    if requested is not None and visible < requested:
        return Finding("gpu count", FAIL, f"{visible} GPU(s) usable ({how}), {requested} requested ({source})",
                       host, scope="gpu", values=values)
    if visible and local_size > visible:
        return Finding("gpu count", WARN, f"{local_size} ranks share {visible} GPU(s) ({how}): expected one rank "
                       "per GPU", host, scope="node", values=values)
    text = f"{visible} GPU(s) usable ({how})" + (f", {requested} requested ({source})" if requested is not None else "")
    return Finding("gpu count", OK, text, host, scope="gpu", values=values)


def judge_gpu(reading: dict, thresholds: Thresholds, host: str, rank: int | None, bus_id: str,
              xids: list[dict] | None = None, xid_note: str = "") -> list[Finding]:
    """Findings of one GPU from its reading (:meth:`NvmlSource.read`) and its XID events.

    Parameters
    ----------
    xids : list of dict or None
        ``[{"xid": 79, "text": ...}]`` of this GPU since boot; None when the kernel log was not readable
        (``xid_note`` says why).
    """
    def finding(check, status, detail, **values):
        return Finding(check, status, detail, host, rank, bus_id, scope="gpu", values=values)

    def missing(check, what):
        return finding(check, SKIP, f"{what} not reported by NVML on this GPU/driver")

    found = []
    # ECC: an uncorrectable error since the driver loaded means corrupted data may already have been used.
    if "ecc_volatile_uncorrected" in reading or "ecc_aggregate_uncorrected" in reading:
        volatile = reading.get("ecc_volatile_uncorrected", 0)
        aggregate = reading.get("ecc_aggregate_uncorrected", 0)
        if volatile:
            found.append(finding("ecc", FAIL, f"{volatile} uncorrectable ECC error(s) since the driver loaded",
                                 volatile=volatile, aggregate=aggregate))
        elif aggregate:
            found.append(finding("ecc", WARN, f"{aggregate} uncorrectable ECC error(s) in the GPU's life, none "
                                 "since the driver loaded", volatile=volatile, aggregate=aggregate))
        elif reading.get("ecc_enabled") is False:
            found.append(finding("ecc", WARN, "ECC is off: memory errors go unnoticed", volatile=0, aggregate=0))
        else:
            found.append(finding("ecc", OK, "no uncorrectable errors", volatile=0, aggregate=0))
    else:
        found.append(missing("ecc", "ECC counts"))
    # Row remapping (A100 and later): pending needs a GPU reset; a failure means no spare rows left.
    if "remap_pending" in reading:
        rows = reading.get("remapped_rows_uncorrectable", 0)
        if reading.get("remap_failure"):
            found.append(finding("row remap", FAIL, "a row remap failed: the GPU ran out of spare rows",
                                 rows=rows, pending=reading["remap_pending"], failure=True))
        elif reading["remap_pending"]:
            found.append(finding("row remap", FAIL, "a row remap is pending: the GPU needs a reset",
                                 rows=rows, pending=True, failure=False))
        else:
            found.append(finding("row remap", OK, f"none pending ({rows} row(s) remapped for uncorrectable "
                                 "errors)", rows=rows, pending=False, failure=False))
    else:
        found.append(missing("row remap", "row remapping"))
    # XID: the driver's error reports in the kernel log.
    if xids is None:
        found.append(finding("xid", SKIP, xid_note or "kernel log not readable"))
    else:
        codes = sorted({event["xid"] for event in xids})
        critical = [code for code in codes if code in CRITICAL_XIDS]
        if critical:
            found.append(finding("xid", FAIL, f"XID {', '.join(map(str, critical))} in the kernel log (GPU or "
                                 f"memory fault)", xids=codes))
        elif codes:
            found.append(finding("xid", WARN, f"XID {', '.join(map(str, codes))} in the kernel log (often an "
                                 "application's fault)", xids=codes))
        else:
            found.append(finding("xid", OK, "none in the kernel log", xids=[]))
    # Temperature.
    if "temperature_c" in reading:
        temperature = reading["temperature_c"]
        slowdown = reading.get("slowdown_temperature_c")
        if slowdown is not None and temperature >= slowdown - thresholds.temperature_fail_margin_c:
            found.append(finding("temperature", FAIL, f"{temperature:.0f} °C, slowdown at {slowdown:.0f} °C",
                                 temperature_c=temperature, slowdown_c=slowdown))
        elif temperature >= thresholds.temperature_warn_c:
            found.append(finding("temperature", WARN, f"{temperature:.0f} °C (warn at "
                                 f"{thresholds.temperature_warn_c:.0f} °C)", temperature_c=temperature,
                                 slowdown_c=slowdown))
        else:
            limit = f", slowdown at {slowdown:.0f} °C" if slowdown is not None else ""
            found.append(finding("temperature", OK, f"{temperature:.0f} °C{limit}", temperature_c=temperature,
                                 slowdown_c=slowdown))
    else:
        found.append(missing("temperature", "temperature"))
    # Clocks and the reasons they are held down.
    if "throttle_reasons" in reading:
        reasons = [r for r in reading["throttle_reasons"] if r in HARMFUL_THROTTLE_REASONS]
        clocks = _clock_text(reading)
        hardware = [r for r in reasons if r in HARDWARE_THROTTLE_REASONS]
        status = FAIL if hardware else WARN if reasons else OK
        text = (f"throttled: {', '.join(f'{r} ({HARMFUL_THROTTLE_REASONS[r]})' for r in reasons)}; {clocks}"
                if reasons else f"not throttled; {clocks}")
        found.append(finding("clocks", status, text, reasons=reading["throttle_reasons"],
                             sm_clock_mhz=reading.get("sm_clock_mhz"), max_sm_clock_mhz=reading.get("max_sm_clock_mhz")))
    else:
        found.append(missing("clocks", "clock-event (throttle) reasons"))
    # Power cap.
    if "power_limit_w" in reading and "default_power_limit_w" in reading:
        limit, default = reading["power_limit_w"], reading["default_power_limit_w"]
        status = WARN if default > 0 and limit < thresholds.power_cap_fraction * default else OK
        found.append(finding("power cap", status, f"{limit:.0f} W of the default {default:.0f} W",
                             limit_w=limit, default_w=default))
    else:
        found.append(missing("power cap", "power limits"))
    # PCIe: fewer lanes than the slot and GPU can do halves host transfers and GPUDirect; a lower
    # generation alone is normal at idle (links drop their speed to save power).
    if "pcie_width" in reading and "pcie_max_width" in reading:
        width, max_width = reading["pcie_width"], reading["pcie_max_width"]
        generation, max_generation = reading.get("pcie_generation"), reading.get("pcie_max_generation")
        gen_text = f", gen {generation} of {max_generation}" if generation is not None else ""
        if width < max_width:
            found.append(finding("pcie", FAIL, f"x{width} of x{max_width}{gen_text}", width=width,
                                 max_width=max_width, generation=generation, max_generation=max_generation))
        else:
            idle = " (lower at idle is normal)" if generation is not None and max_generation and generation < max_generation else ""
            found.append(finding("pcie", OK, f"x{width} of x{max_width}{gen_text}{idle}", width=width,
                                 max_width=max_width, generation=generation, max_generation=max_generation))
    else:
        found.append(missing("pcie", "PCIe link state"))
    # NVLink.
    if "nvlink_links" in reading:
        links, active = reading["nvlink_links"], reading["nvlink_active"]
        status = FAIL if active < links else OK
        found.append(finding("nvlink", status, f"{active} of {links} link(s) active", links=links, active=active))
    else:
        found.append(finding("nvlink", SKIP, "no NVLink on this GPU (or not reported)"))
    return found


def _clock_text(reading: dict) -> str:
    sm, max_sm = reading.get("sm_clock_mhz"), reading.get("max_sm_clock_mhz")
    if sm is None:
        return "SM clock not reported"
    return f"SM {sm:.0f} MHz" + (f" of {max_sm:.0f}" if max_sm else "")


def peak_memory_bandwidth(reading: dict) -> float | None:
    """Peak memory bandwidth in bytes/s from NVML: max memory clock x bus width x 2 (double data rate).

    Read + write bytes of a copy are measured against it (an H100 SXM: 2619 MHz x 5120 bit x 2 = 3.35 TB/s).
    """
    clock, width = reading.get("max_memory_clock_mhz"), reading.get("memory_bus_width_bits")
    if not clock or not width:
        return None
    return clock * 1e6 * width / 8 * 2


def judge_device_bandwidth(measured: float | None, reading: dict, thresholds: Thresholds, host: str, rank: int,
                           bus_id: str, note: str = "", expected: float | None = None) -> Finding:
    """The copy probe's bandwidth (bytes/s, read + write) against the peak (``expected`` or from NVML)."""
    def finding(status, detail, **values):
        return Finding("device bandwidth", status, detail, host, rank, bus_id, scope="gpu", values=values)

    if measured is None:
        return finding(SKIP, note or "not measured")
    ceiling = expected or peak_memory_bandwidth(reading)
    if ceiling is None:
        return finding(OK, f"{measured / 1e12:.2f} TB/s (no peak known: pass --expected-device-bandwidth)",
                       measured=measured)
    fraction = measured / ceiling
    status = FAIL if fraction < thresholds.device_bandwidth_fail else WARN if fraction < thresholds.device_bandwidth_warn else OK
    return finding(status, f"{measured / 1e12:.2f} TB/s, {100 * fraction:.0f}% of {ceiling / 1e12:.2f} TB/s",
                   measured=measured, ceiling=ceiling, fraction=fraction)
