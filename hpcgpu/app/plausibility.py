"""A throughput that beats the memory system is a bug, not a result.

Every time step of a stencil or particle model must at least read and write its state once, so a
reported rate implies a memory traffic per GPU of at least::

    rate (updates/s) * minimum bytes per update / number of GPUs

If that exceeds what the GPU can copy (its measured device-to-device copy bandwidth, bytes read plus
written per second), the step did not do the work it claims: a kernel on a stream that a CUDA graph
did not capture, a loop that skipped its body, a timer around nothing. :func:`check_throughput`
names the result an error instead of letting it into a summary or a benchmark table.

The minimum bytes per update are a lower bound for any implementation (fused stages, temporal
blocking), not our kernels' traffic: a model declares ``min_bytes_per_update`` (the state it must
read and write once per step per cell or atom). The ceiling is measured once per process (a 256 MiB
copy, best of five) or taken from ``HPCGPU_COPY_BANDWIDTH`` (bytes/s). On CPUs the check is skipped:
the node's memory bandwidth is shared by its ranks and not known from one copy.
"""

from __future__ import annotations

import functools
import os

from hpcgpu.errors import HpcgpuError

COPY_BANDWIDTH_VARIABLE = "HPCGPU_COPY_BANDWIDTH"
_COPY_BYTES = 256 * 2**20


class ImplausibleResultError(HpcgpuError):
    """A measured throughput implies more memory traffic than the hardware can move."""

    replicated = True   # decided from allreduced numbers: every rank raises the same text


@functools.lru_cache(maxsize=None)
def measured_copy_bandwidth(device_id: int) -> float:
    """Measured device-to-device copy bandwidth of GPU ``device_id`` in bytes/s (read + write), the best
    of five copies; once per process and device."""
    import cupy

    with cupy.cuda.Device(device_id):
        source = cupy.ones(_COPY_BYTES // 4, dtype=cupy.float32)
        target = cupy.empty_like(source)
        stream = cupy.cuda.get_current_stream()
        best = float("inf")
        cupy.copyto(target, source)   # warm-up (kernel load, first touch)
        for _ in range(5):            # the best of five copies counts
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            cupy.copyto(target, source)
            stop.record(stream)
            stop.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        del source, target
    return 2 * _COPY_BYTES / best


def copy_bandwidth(arch) -> float | None:
    """Device-to-device copy bandwidth of this rank's GPU in bytes/s (read + write); None on a CPU.

    ``HPCGPU_COPY_BANDWIDTH`` (bytes/s) replaces the measurement.
    """
    if not arch.is_gpu:
        return None
    override = os.environ.get(COPY_BANDWIDTH_VARIABLE)
    if override:
        return float(override)
    return measured_copy_bandwidth(arch.device_id)


def check_throughput(comm, arch, throughput: float, unit: str, min_bytes_per_update: float | None) -> dict:
    """Collective: raise :class:`ImplausibleResultError` if ``throughput`` beats the copy bandwidth.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    throughput : float
        Updates per second of the whole job (``unit``: cell-updates/s, atom-steps/s, ...).
    unit : str
        The unit of ``throughput``, for the message.
    min_bytes_per_update : float or None
        Bytes each update must at least read and write; None: the model declares no bound (no check).

    Returns
    -------
    dict
        ``{"implied_bytes_per_second_per_gpu", "copy_bandwidth_bytes_per_second"}`` for the summary
        (empty on CPUs or without a bound).
    """
    if min_bytes_per_update is None or not arch.is_gpu or not throughput > 0:
        return {}
    ceiling = comm.allreduce(float(copy_bandwidth(arch)), "min")
    implied = throughput * float(min_bytes_per_update) / comm.size
    if implied > ceiling:
        raise ImplausibleResultError(
            f"the measured throughput {throughput:.4g} {unit} on {comm.size} GPU(s) would move at least "
            f"{implied / 1e12:.2f} TB/s per GPU ({min_bytes_per_update:g} bytes per update), more than the "
            f"{ceiling / 1e12:.2f} TB/s this GPU can copy: the steps did not do the work they report. This is a "
            "bug in hpcgpu (a kernel missing from a CUDA graph, a skipped loop, a timer around nothing); please "
            "report it with this run's command. No result was recorded."
        )
    return {"implied_bytes_per_second_per_gpu": implied, "copy_bandwidth_bytes_per_second": ceiling}
