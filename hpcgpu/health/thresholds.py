"""The limits ``hpcgpu check`` judges readings against, with their defaults (``docs/health.md``).

Each is a flag of ``hpcgpu check`` (``--temperature-warn 80``); the defaults are written to be
quiet on a healthy node and loud on the faults that cost jobs: an uncorrectable ECC error, a pending
row remap, a link trained narrower than it can, a GPU held down by heat or power.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

#: XID codes that mean the GPU or its memory is damaged or lost (NVIDIA's XID catalogue): a failing
#: node. Others (13, 31, 43: usually an application's fault) give a warning.
CRITICAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)


@dataclass
class Thresholds:
    """Limits of the checks. Fractions are of the GPU's (or the median link's) own value.

    Attributes
    ----------
    temperature_warn_c : float
        Warn at or above this GPU temperature (°C) [85].
    temperature_fail_margin_c : float
        Fail within this many °C of the GPU's slowdown temperature (NVML) [3].
    power_cap_fraction : float
        Warn when the enforced power limit is below this fraction of the default limit [0.9].
    device_bandwidth_warn : float
        Warn when the copy probe reaches less than this fraction of the memory's peak bandwidth [0.7].
    device_bandwidth_fail : float
        Fail below this fraction [0.4].
    link_warn_fraction : float
        Warn when a neighbour pair's bandwidth is below this fraction of the median pair of its kind
        (same node / across nodes) [0.5]. Never fails by itself: timings on shared nodes are noisy.
    min_link_gbps : float or None
        Fail when a pair is below this many GB/s (off by default: expected values depend on the site).
    min_allreduce_gbps : float or None
        Fail when the allreduce bus bandwidth is below this (off by default).
    clock_skew_warn_s : float
        Warn when a node's clock differs from rank 0's by more than this [0.5 s].
    clock_skew_fail_s : float
        Fail above this [60 s; munge, Slurm's authentication, refuses credentials at 300 s].
    free_space_bytes : int
        Bytes that must be free where checkpoints go (``--need``) [0: only that it is writable].
    """

    temperature_warn_c: float = 85.0
    temperature_fail_margin_c: float = 3.0
    power_cap_fraction: float = 0.9
    device_bandwidth_warn: float = 0.7
    device_bandwidth_fail: float = 0.4
    link_warn_fraction: float = 0.5
    min_link_gbps: float | None = None
    min_allreduce_gbps: float | None = None
    clock_skew_warn_s: float = 0.5
    clock_skew_fail_s: float = 60.0
    free_space_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_options(cls, options) -> Thresholds:
        """The thresholds of parsed ``hpcgpu check`` options (attributes of the same names)."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)})


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """Bytes of a size written ``500M``, ``20G``, ``1.5TiB``, ``4096`` (decimal k/M/G/T, binary Ki/Mi/Gi/Ti).

    Raises
    ------
    ValueError
        With the expected form, for anything else.
    """
    cleaned = text.strip().lower().removesuffix("b")
    number = cleaned.rstrip("kmgti")
    unit = cleaned[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not value >= 0:
        raise ValueError(f"expected a size such as 500M, 20G or 1.5TiB, got {text!r}")
    return int(value * _UNITS[unit])


def format_bytes(n_bytes: float) -> str:
    """``12.3 GB`` (decimal units, as disks are sold and ``df -H`` prints)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"
