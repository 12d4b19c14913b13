"""The loss-curve plot written to ``--output`` (PNG, matplotlib's Agg backend)."""

from hpcgpu.output.atomic import save_figure


def plot_history(history, path, title="apps.train"):
    """Plot training loss per step and test accuracy per evaluation into ``path``.

    ``history`` holds lists ``step``, ``loss``, ``eval_step``, ``test_accuracy``.
    Returns the path, or None when matplotlib is missing (nothing is written).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, loss_axis = plt.subplots(figsize=(7, 4), dpi=120)
    loss_axis.plot(history["step"], history["loss"], lw=0.8, color="tab:blue", label="training loss")
    loss_axis.set_xlabel("optimiser step")
    loss_axis.set_ylabel("training loss (cross-entropy)", color="tab:blue")
    if history["loss"] and min(history["loss"]) > 0:
        loss_axis.set_yscale("log")
    if history.get("test_accuracy"):
        accuracy_axis = loss_axis.twinx()
        accuracy_axis.plot(history["eval_step"], [100 * a for a in history["test_accuracy"]], "o-",
                           ms=3, color="tab:red", label="test accuracy")
        accuracy_axis.set_ylabel("test accuracy (%)", color="tab:red")
    loss_axis.set_title(title)
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)
    return path
