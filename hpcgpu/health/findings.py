"""One result of a health check, and the verdict and exit code of many.

A :class:`Finding` says what was checked, where (node, rank, GPU), how it came out (``ok``, ``warn``,
``fail`` or ``skip``) and why, in one line. Its ``scope`` says what a failure points at:

``gpu``
    this GPU (ECC, remapping, XID, NVLink, heat): its node is excluded from the next job;
``node``
    this node, when other nodes pass the same check (free space, clock, versions): excluded only then;
``job``
    the job as a whole (all links slow): nobody is excluded, the job is not started.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
#: Worst first: the verdict is the worst status of any finding (skips count as ok).
SEVERITY = {FAIL: 3, WARN: 2, OK: 1, SKIP: 0}

#: Exit codes of ``hpcgpu check`` (docs/health.md).
EXIT_HEALTHY = 0
EXIT_USAGE = 2
EXIT_WARNINGS = 3
EXIT_FAILED = 4


@dataclass
class Finding:
    """The result of one check on one rank, node or the whole job.

    Attributes
    ----------
    check : str
        Short name of the check (``"ecc"``, ``"pcie"``, ``"link bandwidth"``).
    status : str
        ``ok``, ``warn``, ``fail`` or ``skip``.
    detail : str
        One line: what was measured against what (``"x8 of x16"``), or why it was skipped.
    host : str or None
        The node it concerns (None: the job).
    rank : int or None
        The rank that measured it (None: a node or job result).
    gpu : str or None
        PCI bus id of the GPU it concerns.
    scope : str
        ``gpu``, ``node`` or ``job`` (see the module docstring).
    values : dict
        The numbers behind the detail, for the JSON report.
    """

    check: str
    status: str
    detail: str
    host: str | None = None
    rank: int | None = None
    gpu: str | None = None
    scope: str = "node"
    values: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def worst(statuses) -> str:
    """The worst of ``statuses`` (``ok`` for none; a skip is no worse than ok)."""
    found = [s for s in statuses if s != SKIP]
    return max(found, key=SEVERITY.__getitem__) if found else OK


def exit_code(status: str) -> int:
    """:data:`EXIT_HEALTHY`, :data:`EXIT_WARNINGS` or :data:`EXIT_FAILED` for a verdict status."""
    return {OK: EXIT_HEALTHY, SKIP: EXIT_HEALTHY, WARN: EXIT_WARNINGS, FAIL: EXIT_FAILED}[status]


def nodes_to_exclude(findings: list[Finding], all_hosts: list[str]) -> list[str]:
    """The nodes a follow-up job should avoid, from the failed findings.

    A failed ``gpu`` finding excludes its node; a failed ``node`` finding only when some other node of
    the job passed the same check (a problem every node shares -- a full shared file system, one
    version everywhere -- is no reason to avoid any of them); ``job`` findings exclude nobody.
    """
    excluded = set()
    failed_by_check: dict[str, set] = {}
    for finding in findings:
        if finding.status != FAIL or finding.host is None:
            continue
        if finding.scope == "gpu":
            excluded.add(finding.host)
        elif finding.scope == "node":
            failed_by_check.setdefault(finding.check, set()).add(finding.host)
    for hosts in failed_by_check.values():
        if hosts != set(all_hosts):
            excluded |= hosts
    return sorted(excluded)
