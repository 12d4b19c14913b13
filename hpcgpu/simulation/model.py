"""The model interface: what :class:`hpcgpu.simulation.Simulation` needs from a model.

A model owns its state (fields, particles or parameters), advances it by one step and describes
itself; the driver owns everything around the steps (backend, checkpoints, NaN checks, progress,
timers, CUDA graphs, the summary). Subclass :class:`Model`, set the class attributes and implement
the methods marked *required*; every other method has a documented no-op default.

Required:

=========================  ====================================================================
``name``, ``unit``         the model's name and the unit of its throughput (``cell-updates/s``)
``step_index``             absolute index of the last completed step (0 before the first)
``updates_per_step``       work of one step in ``unit`` (cells, atoms, samples)
``step(timers)``           advance one step; time phases with ``timers.phase("compute")`` ...
``describe()``             one line for the header
``decomposition()``        how the work is split, for the summary (``dims``, ``global_shape`` ...)
``checkpoint_state()``     ``{"fields" | "particles" | "replicated" | "metadata": ...}`` to save
``load_checkpoint(ctl)``   continue from ``--restart`` through a :class:`~hpcgpu.app.checkpointing.RunControl`
``checksum()``             collective: ``sha256:`` of the global state in canonical order
=========================  ====================================================================
"""

from __future__ import annotations

from hpcgpu.app.checkpointing import STOP_CHECK_EVERY
from hpcgpu.simulation.program import run_model


class Model:
    """Base class of the models the simulation driver runs (see the module docstring).

    Attributes
    ----------
    name : str
        Short name (``"swe"``, ``"lj"``, ``"mlp"``).
    unit : str
        Unit of the throughput, e.g. ``"cell-updates/s"``.
    default_steps : int or None
        The final step when the user gives no ``--steps``.
    updates_per_step : float
        Work of one step in the units of ``unit`` (throughput = updates_per_step * steps / wall).
    min_bytes_per_update : float or None
        Bytes one update must at least read and write; the driver refuses a throughput that would beat
        the GPU's copy bandwidth (:mod:`hpcgpu.app.plausibility`). None: no bound, no check.
    graph_unsupported : str or None
        Why this model can never be captured as a CUDA graph (a refusal of ``--graph``), None when it
        can be (then :meth:`capturable` decides step by step).
    steps_use_job_transport : bool
        Whether a step moves data between ranks through the job's transport (halo exchanges through
        ``comm.job_transport``). Then, on several ranks, only a transport a CUDA graph can hold
        (:data:`hpcgpu.simulation.driver.CAPTURABLE_TRANSPORTS`) allows graphs. Default True; a model
        whose steps exchange by other means (peer stores) or not at all sets False.
    stop_check_every : int
        Steps between the ranks' agreement on stopping (signal, wall-time limit); long steps use 1.
    restart_independent_options : frozenset of str
        The model's own options (``argparse`` destinations, ``"threads"`` for ``--threads``) that a
        restart may change: left out of the checkpoints' fingerprint, in addition to the common ones
        (:data:`hpcgpu.app.checkpointing.RESTART_INDEPENDENT_OPTIONS`: ``--steps``, ``--dims``,
        ``--backend``, output and checkpoint flags ...). Every other option must be equal on
        ``--restart latest``; a differing one is refused with its name. Default: none.
    unset_option_values : dict
        The model's options (``argparse`` destinations) that it fills in itself when they are left unset
        (``None``): destination -> the value it then uses, or a function of the fingerprinted options
        (``{"--temperature": 1.0, ...}``) giving it. The checkpoints record, and restarts compare, these
        resolved values, so an option left unset and its default given explicitly are the same run.
        Default: none.
    version : str or None
        The model's (app's) own version, shown in the header and the summary's ``app_version``.
    step_index : int
        Absolute index of the last completed step.
    """

    name = "model"
    unit = "updates/s"
    default_steps: int | None = None
    updates_per_step: float = 1
    min_bytes_per_update: float | None = None
    graph_unsupported: str | None = None
    steps_use_job_transport = True
    stop_check_every = STOP_CHECK_EVERY
    restart_independent_options: frozenset = frozenset()
    unset_option_values: dict = {}
    version: str | None = None
    step_index = 0
    #: The model's own options (:class:`hpcgpu.Option`): flags of :func:`hpcgpu.run_model`'s command line.
    options: tuple = ()

    @classmethod
    def main(cls, argv=None) -> int:
        """Run the model as a program (:func:`hpcgpu.run_model`); returns the exit code.

        ``if __name__ == "__main__": raise SystemExit(MyModel.main())`` ends a model file.
        """
        return run_model(cls, argv)

    # ------------------------------------------------------------------ required
    def step(self, timers) -> None:
        """Advance the state by one step and increment ``step_index`` (required).

        Parameters
        ----------
        timers : hpcgpu.app.timers.PhaseTimers
            Time the work as phases (``compute``, ``communication``, ``io``); during a CUDA graph
            capture a stand-in that records nothing.
        """
        raise NotImplementedError

    def describe(self) -> str:
        """One line describing the model for the header (required)."""
        raise NotImplementedError

    def decomposition(self) -> dict:
        """How the work is split over the ranks, for the summary's ``decomposition`` (required)."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict:
        """What a checkpoint holds: ``{"fields", "particles", "replicated", "metadata", "units"}`` (any subset).

        ``units`` maps names of particle arrays and replicated values to unit strings, stored as
        ``units`` attributes (:meth:`hpcgpu.checkpoint.CheckpointManager.save`).
        """
        raise NotImplementedError

    def load_checkpoint(self, control) -> int | None:
        """Collective: continue from ``--restart`` (required for models that checkpoint).

        Parameters
        ----------
        control : hpcgpu.app.checkpointing.RunControl
            Call ``control.restore(...)`` or ``control.restore_with(...)``; both return None for a
            fresh start.

        Returns
        -------
        int or None
            The step the run continues from, None for a fresh start.
        """
        if control.restart_requested():
            raise NotImplementedError(f"{self.name} cannot restart from a checkpoint")
        return None

    def checksum(self) -> str:
        """Collective: ``sha256:`` of the global state in canonical order, on every rank (required)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ optional, with defaults
    def set_final_step(self, final_step: int) -> None:
        """Told the absolute step the run ends at, before the header is printed. Default: stored."""
        self.final_step = final_step

    def header_lines(self, comm, arch) -> list[str]:
        """Header lines after the first (``APP VERSION: describe()``). Default: backend and ranks."""
        return [f"backend: {arch.name} ({arch.reason})", f"ranks: {comm.size} on {comm.n_nodes} node(s)"]

    def prepare(self) -> None:
        """Work before the timed loop (compile kernels, make connections). Default: nothing."""

    def capturable(self, n_steps: int) -> bool:
        """True if the next ``n_steps`` steps never synchronise with the host (a CUDA graph can hold
        them) and the model's own output (:meth:`after_step`, called only after the whole replay) needs
        none of them but the last. The driver asks for ``n_steps`` = 32, 16, ..., 2 (even: ping-pong
        buffers back in place) and replays the longest allowed. Default: False."""
        return False

    def graph_key(self):
        """What a captured graph depends on besides its length: it is replayed only where this is
        equal to its value at capture (e.g. which of two ping-pong buffers is current: a graph bakes
        in the buffers' addresses, and an odd number of eager steps swaps them). Default None: the
        model's arrays never change places."""
        return None

    def after_step(self, timers, output, final_step: int) -> None:
        """Model output after each step, and once before the first step of a fresh run (snapshots).
        Collective. Default: nothing."""

    def settle(self, timers) -> None:
        """Finish deferred work after the last step (inside the timed interval). Default: nothing."""

    def finite_arrays(self) -> list:
        """This rank's arrays (or Python floats) that must hold finite values: the NaN check's input.
        Default: none."""
        return []

    def nan_message(self, step: int, ranks: list[int]) -> str:
        """The NaN check's message: what is not finite at ``step`` on ``ranks``, and the likely fix."""
        return (f"the {self.name} state holds NaN/Inf at step {step} (ranks {ranks}); expected finite values. "
                "The time step is probably unstable.")

    def progress_note(self) -> str:
        """Extra text for the progress line (``day 1.25``). Default: none."""
        return ""

    def diagnostics(self) -> dict:
        """Collective: the summary's ``diagnostics`` (conserved quantities, errors). Default: empty."""
        return {}

    def summary_extra(self, simulation) -> dict:
        """More summary keys (``model``, ``precision`` ...). Default: none."""
        return {}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        """The table's first line. Default: steps, seconds and throughput, total and per rank."""
        return (f"{steps} steps in {wall:.3f} s: {throughput:,.4g} {self.unit} "
                f"({throughput / n_ranks:,.4g} per rank)")

    def result_lines(self, diagnostics: dict) -> list[str]:
        """Table lines after the timers. Default: every diagnostic as ``name value``."""
        return [f"{key:<24} {value}" for key, value in diagnostics.items()]

    def finish(self, output, summary: dict, plot: bool = True) -> None:
        """Collective: app outputs at the end of the run (close files, plots). Default: nothing."""

    def closing_lines(self) -> list[str]:
        """Lines after the table naming the model's own output files (rank 0). Default: none."""
        return []

    def close(self) -> None:
        """Release resources (threads, limits); called once, also after an error. Default: nothing."""
