"""The scaling study's outputs: the printed table, ``scaling.csv`` and ``scaling.png``.

Rows are those of :func:`hpcgpu.bench.scaling.make_row` (one per rank count, with per-phase seconds
per step and shares); see :mod:`hpcgpu.bench.scaling` for the study itself.
"""

from __future__ import annotations

import csv
from pathlib import Path


def format_seconds(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def format_table(rows: list[dict], phases: list[str]) -> str:
    header = f"{'ranks':>5} {'per rank':>16} {'time/step':>10} {'throughput':>26} {'speedup':>7} {'eff.':>5}"
    header += "".join(f" {name[:15]:>15}" for name in phases) + "  grows most"
    lines = [header]
    for row in rows:
        size = f"{row['size_per_rank']:,.0f} {row['size_unit'].split('/')[0]}"
        if row["status"] != "ok":
            word, _, rest = row["status"].partition(" ")
            lines.append(f"{row['n_ranks']:>5} {size:>16} {word.upper()}{' ' + rest if rest else ''}: {row['error']}")
            continue
        efficiency = f"{100 * row['efficiency']:.0f}%" if row.get("efficiency") is not None else "-"
        speedup = f"{row['speedup']:.2f}" if row.get("speedup") is not None else "-"
        line = (f"{row['n_ranks']:>5} {size:>16} {format_seconds(row['seconds_per_step']):>10} "
                f"{row['throughput']:>10.3g} {row['unit']:<15} {speedup:>7} {efficiency:>5}")
        for name in phases:
            phase = row["phases"].get(name)
            cell = f"{format_seconds(phase['seconds_per_step'])} {100 * phase['share']:.0f}%" if phase else "-"
            line += f" {cell:>15}"
        lines.append(line + f"  {row.get('grows_most') or '-'}")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict], phases: list[str]) -> None:
    columns = ["n_ranks", "status", "problem", "size_per_rank", "size_unit", "steps", "wall_seconds",
               "seconds_per_step", "throughput", "unit", "speedup", "efficiency"]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns + [f"{p} s/step" for p in phases] + [f"{p} share" for p in phases] + ["grows_most", "error"])
        for row in rows:
            phase_rows = row.get("phases", {})
            writer.writerow([row.get(c, "") for c in columns]
                            + [phase_rows[p]["seconds_per_step"] if p in phase_rows else "" for p in phases]
                            + [phase_rows[p]["share"] if p in phase_rows else "" for p in phases]
                            + [row.get("grows_most") or "", row.get("error") or ""])


def write_plot(path: Path, rows: list[dict], phases: list[str], title: str) -> None:
    """Efficiency vs ranks (left) and stacked per-phase time per step for each rank count (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "ok"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    ranks = [r["n_ranks"] for r in done]
    efficiency = [r.get("efficiency") or 0.0 for r in done]
    left.plot(ranks, efficiency, "o-", label="measured")
    left.axhline(1.0, color="gray", linestyle="--", label="ideal")
    if ranks:
        left.set_xscale("log", base=2)
        left.set_xticks(ranks, [str(n) for n in ranks])
    left.set_ylim(0, max([1.1] + [e * 1.1 for e in efficiency]))
    left.set_xlabel("ranks")
    left.set_ylabel("parallel efficiency")
    left.set_title("efficiency")
    left.legend()
    positions = list(range(len(done)))
    bottom = [0.0] * len(done)
    for name in phases:
        heights = [r["phases"].get(name, {}).get("seconds_per_step", 0.0) * 1e3 for r in done]
        right.bar(positions, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    right.set_xticks(positions, [str(n) for n in ranks])
    right.set_xlabel("ranks")
    right.set_ylabel("ms per step (mean over ranks)")
    right.set_title("where the time goes")
    if done:
        right.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


__all__ = ["format_seconds", "format_table", "write_csv", "write_plot"]
