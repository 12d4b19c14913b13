"""A PNG of the thermo history (rank 0, matplotlib without a display)."""

from __future__ import annotations

from hpcgpu.output.atomic import save_figure


def plot_thermo(path, history, title: str = "") -> None:
    """Four panels (Temp, E_pair, TotEng, Press) against the step; ``history`` is a list of Thermo."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [sample.step for sample in history]
    panels = (("temperature", "Temp"), ("pair_energy", "E_pair / atom"), ("total_energy", "TotEng / atom"),
              ("pressure", "Press"))
    figure, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    for axis, (field, label) in zip(axes.ravel(), panels):
        axis.plot(steps, [getattr(sample, field) for sample in history], marker="o", markersize=3)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    for axis in axes[1]:
        axis.set_xlabel("step")
    figure.suptitle(title or "apps.md thermo")
    figure.tight_layout()
    save_figure(figure, path, dpi=100)
    plt.close(figure)
