"""``apps.md`` as a :class:`hpcgpu.simulation.Model`: Lennard-Jones MD steps, thermo and trajectory output.

The physics stays in :mod:`apps.md.distributed` (``init``, ``step``, ``thermo``, ``settle``); this
module adapts it to the simulation driver: :class:`LennardJonesModel` (a step, checkpoints, the
checksum of the atoms sorted by id, diagnostics) and two operations, :class:`ThermoOutput` (the
LAMMPS-style thermo line every ``--thermo-every`` steps and at the end, checked for NaN) and
:class:`TrajectoryOutput` (an H5MD frame every ``--dump-every`` steps).
"""

from __future__ import annotations

import time

import numpy as np

from hpcgpu.app.checksum import hash_arrays
from hpcgpu.app.progress import format_rate
from hpcgpu.errors import ConfigurationError
from hpcgpu.particles.node_traffic import ghost_traffic_line
from hpcgpu.simulation import AtEnd, Model, Operation, Periodic

from . import distributed, system
from .h5md import TRAJECTORY_NAME, Trajectory
from .plot import plot_thermo
from .thermo import format_thermo, thermo_header

#: Diagnostics printed in the final table (the summary holds all of them).
TABLE_DIAGNOSTICS = ("energy_drift", "neighbor_builds", "neighbor_reallocations", "rebuild_checks", "step_graphs",
                     "resident_steps", "atoms_per_rank", "ghosts_per_rank")


#: ``units`` attributes of the checkpoint's datasets: reduced Lennard-Jones units (sigma, epsilon, the atom
#: mass m, tau = sigma sqrt(m / epsilon)); "1" is dimensionless (ids, types, periodic image counts).
CHECKPOINT_UNITS = {
    "particles": {"atom_ids": "1", "types": "1", "positions": "sigma", "reference_positions": "sigma",
                  "images": "1", "velocities": "sigma tau-1", "masses": "m", "forces": "epsilon sigma-1"},
    "replicated": {"step": "1", "box": "sigma"},
}


class LennardJonesModel(Model):
    """The distributed LJ system of one run.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    state : apps.md.distributed.DistributedState
        The initial state (:func:`apps.md.app.build_state`).
    atoms : apps.md.system.Atoms
        Where the atoms came from (description, masses, box bounds for ``--write-data``).
    config : apps.md.serial.MDConfig
    options : argparse.Namespace
        Uses ``thermo_every``, ``precision``, ``thermostat``, ``write_data``.
    final_step : int
        The step the run ends at (thermo is always sampled there).
    setup_seconds : float
        Seconds spent building ``state`` (reported in the diagnostics).
    """

    name = "lj"
    unit = "atom-steps/s"
    #: The driver's CUDA graph windows never hold MD steps (``docs/architecture.md``, "MD's chunked graphs").
    graph_unsupported = ("its steps launch CUDA graphs of their own (device-resident chunks whose replay is redone "
                         "after a capacity overflow, apps.md.chunked_graphs; the halves of a step, apps.md.step_graph), "
                         "chosen by the MD options --resident and --graph")
    #: --target-temperature left unset is --temperature (apps.md.app.make_config).
    unset_option_values = {"target_temperature": lambda options: options.get("--temperature")}

    def __init__(self, comm, arch, state, atoms, config, options, final_step: int, setup_seconds: float = 0.0):
        self.comm, self.arch, self.state, self.atoms, self.config = comm, arch, state, atoms, config
        self.options = options
        self.final_step = final_step
        self.setup_seconds = setup_seconds
        self.thermo_trigger = Periodic(options.thermo_every or max(final_step, 1)) | AtEnd()
        self.history, self.conserved = [], []
        self.sample = None
        self.gathered = None
        itemsize = 8 if options.precision == "fp64" else 4
        # A step reads and writes positions and velocities at least once (3 components each).
        self.min_bytes_per_update = 12 * itemsize

    @property
    def step_index(self) -> int:
        return self.state.step

    @property
    def updates_per_step(self) -> int:
        return self.state.n_atoms

    # ------------------------------------------------------------------ stepping
    def step(self, timers) -> None:
        compute_energy = self.thermo_trigger(self.state.step + 1, self.final_step)
        distributed.step(self.state, self.config, compute_energy=compute_energy, timers=timers)

    def prepare(self) -> None:
        distributed.warm_up(self.state)   # NCCL peer connections are made here, not in the first timed step

    def settle(self, timers) -> None:
        distributed.settle(self.state, self.config, timers)   # the last steps since a check (replayed if needed)

    def sample_thermo(self, timers):
        """Collective: the thermo sample of the current step (appended to ``history`` by the caller)."""
        with timers.phase("thermo"):
            self.sample = distributed.thermo(self.state, self.config)
            self.conserved.append(distributed.conserved_energy(self.state, self.config, self.sample))
        return self.sample

    def finite_arrays(self) -> list:
        return [] if self.sample is None else [float(value) for value in self.sample[1:]]

    def nan_message(self, step: int, ranks: list[int]) -> str:
        return (f"thermo at step {self.sample.step} is not finite ({format_thermo(self.sample).strip()}); "
                "expected finite energies. The time step is probably too large: lower --dt.")

    # ------------------------------------------------------------------ description
    def describe(self) -> str:
        return f"Lennard-Jones MD, {self.atoms.description}"

    def header_lines(self, comm, arch) -> list[str]:
        config, options, domain = self.config, self.options, self.state.domain
        lines = [f"box {' x '.join(f'{v:.6g}' for v in domain.box)} sigma; {config.potential.variant} cut "
                f"{config.potential.max_cutoff:g}, skin {config.skin:g}, dt {config.dt:g}, "
                f"thermostat {options.thermostat}, {options.precision}"
                f"{' (fp32 pair forces, fp64 accumulation)' if options.precision == 'fp32' else ''}",
                f"backend: {arch.name} ({arch.reason})",
                f"ranks: {comm.size} on {comm.n_nodes} node(s); {domain.describe()}"]
        # On several (real or HPCGPU_SIMULATE_NODES) nodes: ghost bytes that cross nodes, chosen vs naive layout.
        traffic = ghost_traffic_line(domain, self.state.n_atoms)
        return lines + ([f"nodes: {traffic}"] if traffic else [])

    def decomposition(self) -> dict:
        domain = self.state.domain
        return {"dims": list(domain.dims), "axes": "x,y,z", "box": domain.box.tolist(), "periodic": [True] * 3}

    # ------------------------------------------------------------------ checkpoint / restart
    def checkpoint_state(self) -> dict:
        particles, replicated = distributed.checkpoint_payload(self.state)
        replicated.update({"potential": self.config.potential.variant, "precision": self.options.precision,
                           "thermostat": self.options.thermostat})
        return {"particles": particles, "replicated": replicated, "units": CHECKPOINT_UNITS}

    def load_checkpoint(self, control) -> int | None:
        """Collective: continue from ``--restart``; atoms go to the rank whose sub-box holds them."""
        started = time.perf_counter()
        restored = control.restore(particles=True, select_fn=_owned_by(self.state.domain))
        if restored is None:
            return None
        self.state = _restore(self.state, restored, self.config, self.options, self.arch)
        self.setup_seconds += time.perf_counter() - started
        return self.state.step

    # ------------------------------------------------------------------ results
    def checksum(self) -> str:
        """Collective: the atoms sorted by id (ids, types, positions, images, velocities)."""
        self.gathered = distributed.gather_by_id(self.state)   # after the timed loop: not a phase
        checksum = hash_arrays([(name, self.gathered[name]) for name in ("atom_ids", "types", "positions", "images",
                                                                          "velocities")]) if self.comm.rank == 0 else None
        return self.comm.broadcast(checksum)

    def diagnostics(self) -> dict:
        """Collective: thermo at both ends, drift of the conserved energy, neighbour-list counts."""
        diagnostics = _diagnostics(self.comm, self.state, self.config, self.history, self.conserved)
        diagnostics["setup_seconds"] = self.setup_seconds
        return diagnostics

    def summary_extra(self, simulation) -> dict:
        return {"n_atoms": self.state.n_atoms, "precision": self.options.precision,
                "thermostat": self.options.thermostat, "potential": self.config.potential.variant,
                "thermo": [dict(zip(("step", "temp", "e_pair", "toteng", "press"), s)) for s in self.history]}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        return (f"{steps} steps of {self.state.n_atoms} atoms in {wall:.3f} s: "
                f"{format_rate(throughput, 'atom-steps/s')} ({format_rate(throughput / n_ranks, 'per rank')})")

    def result_lines(self, diagnostics: dict) -> list[str]:
        return [f"{key:<24} {diagnostics[key]}" for key in TABLE_DIAGNOSTICS]

    def finish(self, output, summary: dict, plot: bool = True) -> None:
        """Rank 0: ``--write-data`` and ``OUTPUT/thermo.png``."""
        if self.comm.rank != 0:
            return
        if self.options.write_data:
            system.write_gathered(self.options.write_data, self.gathered, self.state.domain.box, self.atoms.masses,
                                  f"LAMMPS data file written by hpcgpu apps.md at step {self.state.step}",
                                  box_lower=self.atoms.box_lower, box_upper=self.atoms.box_upper)
        if plot and self.history:
            plot_thermo(output / "thermo.png", self.history,
                        f"apps.md: {self.state.n_atoms} atoms, {self.comm.size} rank(s)")

    def closing_lines(self) -> list[str]:
        return [f"data file: {self.options.write_data}"] if self.options.write_data else []


class ThermoOutput(Operation):
    """The thermo line (Step Temp E_pair TotEng Press) at step 0 and whenever ``model.thermo_trigger``
    fires; each sample is checked for NaN/Inf (collective) before it is recorded and printed."""

    def __init__(self, model: LennardJonesModel):
        super().__init__(model.thermo_trigger)
        self.model = model

    def begin(self, simulation) -> None:
        if simulation.loud:
            print(thermo_header())
        self.act(simulation)

    def act(self, simulation) -> None:
        sample = self.model.sample_thermo(simulation.timers)
        simulation.check_finite()
        self.model.history.append(sample)
        if simulation.loud:
            print(format_thermo(sample), flush=True)


class TrajectoryOutput(Operation):
    """An H5MD frame (``OUTPUT/trajectory.h5md``) at step 0 and every ``every`` steps (collective)."""

    def __init__(self, model: LennardJonesModel, every: int):
        super().__init__(Periodic(every))
        self.model, self.every, self.writer = model, every, None

    def begin(self, simulation) -> None:
        model = self.model
        self.writer = Trajectory(simulation.comm, simulation.output / TRAJECTORY_NAME, model.state, model.config,
                                 self.every, continuing=getattr(simulation.options, "restart", None) is not None)
        self._dump(simulation, model.history[-1])

    def act(self, simulation) -> None:
        latest = self.model.history[-1] if self.model.history else None
        self._dump(simulation, latest if latest is not None and latest.step == self.model.step_index else None)

    def _dump(self, simulation, sample) -> None:
        with simulation.timers.phase("io"):
            self.writer.dump(self.model.state, sample)

    def end(self, simulation) -> None:
        if simulation.comm.rank == 0 and self.writer is not None:
            self.writer.close()


def _owned_by(domain):
    """Selection of checkpointed atoms for this rank: those whose reference position lies in its sub-box."""
    def select(rows):
        positions = np.asarray(rows["reference_positions"], dtype=np.float64)
        return domain.subbox.contains(np.mod(positions, domain.box))
    return select


def _restore(fresh, restored, config, options, arch):
    """The state of a checkpoint, after checking that it belongs to this system."""
    replicated = restored.replicated
    expected = {"n_atoms": fresh.n_atoms, "box": [float(v) for v in fresh.box], "potential": config.potential.variant,
                "precision": options.precision, "thermostat": options.thermostat}
    found = {key: replicated[key] for key in expected}
    if found != expected:
        raise ConfigurationError(f"the checkpoint holds {found} but this run is {expected}; restart with the same "
                                 "system options (any number of ranks works)")
    dtype = np.float64 if options.precision == "fp64" else np.float32
    return distributed.restore(fresh.domain, restored.particles, replicated, config, dtype, xp=arch.xp)


def _diagnostics(comm, state, config, history, conserved) -> dict:
    """Thermo at both ends, drift of the conserved energy (TotEng, plus the Nose-Hoover term), counts."""
    first, last = history[0], history[-1]
    elapsed = (last.step - first.step) * config.dt
    change = conserved[-1] - conserved[0]
    counts = comm.mpi.allgather((state.n_local, 0 if state.resident is not None else state.ghosts.n_ghost))
    return {
        "thermo_first": first._asdict(), "thermo_last": last._asdict(),
        "energy_drift": {
            "quantity": "TotEng + Nose-Hoover energy per atom" if config.thermostat == "nose_hoover" else "TotEng per atom",
            "relative": change / abs(conserved[0]) if conserved[0] else 0.0,
            "per_atom_per_tau": change / elapsed if elapsed > 0 else 0.0,
        },
        "neighbor_builds": state.n_builds,
        "neighbor_reallocations": state.n_reallocations,
        "neighbor_capacity": state.neighbor_list.capacity,
        "rebuild_checks": state.watch.summary() if state.watch is not None else {"check_interval": 1},
        "step_graphs": state.graphs.summary() if state.graphs is not None else None,
        "resident_steps": state.resident.summary() if state.resident is not None else None,
        "atoms_per_rank": {"min": min(c[0] for c in counts), "max": max(c[0] for c in counts)},
        "ghosts_per_rank": {"min": min(c[1] for c in counts), "max": max(c[1] for c in counts)},
    }
