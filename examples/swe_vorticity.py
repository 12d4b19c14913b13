"""Relative vorticity of the shallow-water jet at four times: an operation of your own on a bundled model.

The beta-plane channel of ``python -m apps.stencil`` (``--model swe``: a balanced jet that rolls up
into eddies) run by :class:`hpcgpu.Simulation` with one more operation: at a quarter, half, three
quarters and all of the run it gathers the relative vorticity zeta / f0 at the cell centres, and at
the end it draws the four frames into one PNG, ``OUTPUT/swe_vorticity.png``. Every option of
``python -m apps.stencil`` applies (``--days``, ``--nx``, ``--cfl``, ``--init``, ``--backend``,
``--checkpoint-every`` ...); the state, the summary and its checksum are the app's.

    python examples/swe_vorticity.py --days 20 --output swe_jet
    mpiexec -n 4 python examples/swe_vorticity.py --days 20 --nx 720 --ny 360 --output swe_jet

A run continued with ``--restart latest`` draws the frames it reached itself.
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the bundled apps, from a checkout

from apps.stencil.app import build_parser as app_parser, make_model, resolve_options  # noqa: E402
from apps.stencil.swe_scheme.model import SECONDS_PER_DAY  # noqa: E402
from apps.stencil.channel.output import centred_fields  # noqa: E402
from hpcgpu.app.checkpointing import fingerprinted_options  # noqa: E402
from hpcgpu.app.environment import prepare_output  # noqa: E402
from hpcgpu.app.main import run_app  # noqa: E402
from hpcgpu.errors import ConfigurationError  # noqa: E402
from hpcgpu.simulation import (Operation, Periodic, Simulation, Trigger, nccl_channel_limit,  # noqa: E402
                               setup_architecture)

FIGURE = "swe_vorticity.png"


class AtFractions(Trigger):
    """Fires at the first step at or past each fraction of the run (1/4, 1/2, 3/4 and 1 by default)."""

    def __init__(self, fractions=(0.25, 0.5, 0.75, 1.0)):
        self.fractions = tuple(fractions)

    def steps(self, final_step: int) -> list:
        return sorted({max(1, math.ceil(fraction * final_step)) for fraction in self.fractions})

    def __call__(self, step: int, final_step: int) -> bool:
        return step in self.steps(final_step)

    def next_step(self, after: int, final_step: int):
        return next((step for step in self.steps(final_step) if step > after), None)


class VorticityFrames(Operation):
    """Collective: zeta / f0 at the cell centres when the trigger fires (kept on rank 0); the PNG at the end."""

    def __init__(self, model, trigger):
        super().__init__(trigger)
        self.model, self.frames = model, []

    def act(self, simulation) -> None:
        fields = centred_fields(self.model)   # a gather onto rank 0 (None on the others)
        if fields is not None:
            self.frames.append((self.model.time, fields["zeta"] / self.model.parameters.coriolis_f0))

    def end(self, simulation) -> None:
        if simulation.comm.rank == 0 and simulation.plot and self.frames:
            draw(simulation.output / FIGURE, self.frames, self.model.parameters, self.model.init_name)


def draw(path, frames, parameters, init_name) -> None:
    """Rank 0: one panel per ``(time in s, zeta / f0 of shape (ny, nx))``, on one symmetric colour scale."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG written (pip install 'hpcgpu[apps]')")
        return

    extent = (0, parameters.length_x / 1e3, 0, parameters.length_y / 1e3)
    limit = max(float(abs(zeta).max()) for _, zeta in frames) or 1.0
    figure, axes = plt.subplots(len(frames), 1, figsize=(9, 2.4 * len(frames)), sharex=True, squeeze=False)
    for axis, (time, zeta) in zip(axes[:, 0], frames):
        image = axis.imshow(zeta, origin="lower", extent=extent, cmap="RdBu_r", vmin=-limit, vmax=limit,
                            aspect="equal", interpolation="nearest")
        axis.set_title(f"{init_name}: relative vorticity / f0, day {time / SECONDS_PER_DAY:.2f}")
        axis.set_ylabel("y [km]")
        figure.colorbar(image, ax=axis, shrink=0.9)
    axes[-1, 0].set_xlabel("x [km]")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def build_parser(rank=0):
    parser = app_parser(rank)
    parser.prog = "python examples/swe_vorticity.py"
    parser.description = "Relative vorticity of the shallow-water channel at four times (apps.stencil --model swe)."
    return parser


def run(options, comm):
    config = resolve_options(options)
    if config.model != "swe" or config.grid != "channel":
        raise ConfigurationError(f"swe_vorticity.py draws the channel (--model swe --grid channel), not --model "
                                 f"{config.model} --grid {config.grid}; run python -m apps.stencil for the others")
    with nccl_channel_limit(config.nccl_channels):   # as the app: NCCL reads it when the first exchange connects
        arch = setup_architecture(comm, config)        # --backend, --transport
        model = make_model(comm, arch, config)
        output = prepare_output(comm, arch, config)
        frames = VorticityFrames(model, AtFractions())   # the trigger is told the final step (--steps or --days)
        return Simulation(comm, arch, model, config, app="swe_vorticity", output=output, final_step=config.steps,
                          operations=[frames], nan_check=Periodic(config.nan_check_every), graph=config.graph,
                          plot=not config.no_plot, fingerprint=fingerprinted_options(config.as_dict())).run()


def main(argv=None):
    return run_app("swe_vorticity", build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
