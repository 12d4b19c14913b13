"""The report of ``hpcgpu check``: a table per node, the job's own rows, one verdict line, JSON."""

from __future__ import annotations

import json

from hpcgpu.health.findings import FAIL, SKIP, WARN, Finding, exit_code, nodes_to_exclude, worst

_STATUS_TEXT = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
_VERDICT = {"ok": "HEALTHY", "warn": "WARNINGS", "fail": "FAILED"}


def build_report(findings: list[Finding], hosts_by_rank: list[str], context: dict) -> dict:
    """The JSON-ready report: context (ranks, nodes, transport ...), findings, verdict, exit code and
    the nodes a follow-up job should exclude (:func:`~hpcgpu.health.findings.nodes_to_exclude`)."""
    hosts = list(dict.fromkeys(hosts_by_rank))
    status = worst(f.status for f in findings)
    failed = [f for f in findings if f.status == FAIL]
    warned = [f for f in findings if f.status == WARN]
    return {
        **context,
        "n_ranks": len(hosts_by_rank),
        "nodes": {host: [rank for rank, h in enumerate(hosts_by_rank) if h == host] for host in hosts},
        "verdict": status,
        "exit_code": exit_code(status),
        "n_failed": len(failed),
        "n_warnings": len(warned),
        "n_skipped": sum(f.status == SKIP for f in findings),
        "exclude_nodes": nodes_to_exclude(findings, hosts),
        "findings": [f.as_dict() for f in findings],
    }


def _rows(findings: list[dict]) -> list[str]:
    lines = []
    for f in findings:
        where = "" if f["rank"] is None else str(f["rank"])
        gpu = f["gpu"] or ""
        lines.append(f"  {f['check']:<17} {_STATUS_TEXT[f['status']]:<5} {where:>4} {gpu[-12:]:<12} {f['detail']}")
    return lines


def verdict_line(report: dict) -> str:
    """``hpcgpu check: FAILED (2 failed, 1 warning; ...) exit 4``: one line, for logs and grep."""
    text = (f"hpcgpu check: {_VERDICT[report['verdict']]}: {report['n_failed']} failed, {report['n_warnings']} "
            f"warning(s), {report['n_skipped']} skipped, on {report['n_ranks']} rank(s) / {len(report['nodes'])} node(s)")
    problems = [f for f in report["findings"] if f["status"] in (FAIL, WARN)]
    problems.sort(key=lambda f: f["status"] != FAIL)
    if problems:
        shown = "; ".join(f"{f['host'] or 'job'}: {f['check']} {f['detail']}" for f in problems[:3])
        text += f" -- {shown}" + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    if report["exclude_nodes"]:
        text += f" -- exclude: {','.join(report['exclude_nodes'])}"
    return text + f" (exit {report['exit_code']})"


def format_report(report: dict) -> str:
    """The text report: a header, one table per node, the job-wide rows, the verdict line."""
    lines = [f"hpcgpu check: {report['n_ranks']} rank(s) on {len(report['nodes'])} node(s); backend "
             f"{report.get('backend')}, transport {report.get('transport')}"]
    header = f"  {'check':<17} {'':<5} {'rank':>4} {'GPU':<12} detail"
    for host, ranks in report["nodes"].items():
        rows = [f for f in report["findings"] if f["host"] == host]
        status = worst(f["status"] for f in rows)
        lines += ["", f"node {host} (ranks {_ranges(ranks)}): {_STATUS_TEXT[status]}", header, *_rows(rows)]
    job_rows = [f for f in report["findings"] if f["host"] is None]
    if job_rows:
        lines += ["", "job", header, *_rows(job_rows)]
    lines += ["", verdict_line(report)]
    return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    """``0-3,8`` for [0, 1, 2, 3, 8]."""
    parts, start = [], None
    for index, rank in enumerate(ranks):
        if start is None:
            start = rank
        if index + 1 == len(ranks) or ranks[index + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)


def write_json(path: str, report: dict) -> None:
    with open(path, "w") as handle:
        json.dump(report, handle, indent=2, default=str)
        handle.write("\n")
