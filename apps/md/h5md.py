"""H5MD 1.1 trajectories (https://www.nongnu.org/h5md/h5md.html), written by rank 0.

Choice of layout: every ``--dump-every`` steps the owned atoms of all ranks are gathered to rank 0,
sorted by atom id, and appended as one frame (row ``k`` of every array is atom ``id[k]`` in every
frame). That keeps the file readable by any H5MD reader (MDAnalysis, h5md-tools, VMD's plugin) and
independent of the number of ranks; per-rank hyperslab writes with parallel HDF5 would avoid the gather
on very large runs. File layout::

    h5md/                        attrs version = [1, 1]
        author/                  attrs name
        creator/                 attrs name = "hpcgpu apps.md", version
    particles/all/
        box/                     attrs dimension = 3, boundary = ["periodic"] * 3
            edges/{step, time, value (n_frames, 3)}
        position/{step, time, value (n_frames, n_atoms, 3)}     float64, sigma
        image/{step, time, value (n_frames, n_atoms, 3)}        int32 box crossings
        velocity/{step, time, value (n_frames, n_atoms, 3)}     float64, sigma / tau
        species (n_atoms,)       0-based atom types
        id (n_atoms,)            atom ids (LAMMPS numbering)
    observables/{temperature, potential_energy, total_energy, pressure}/{step, time, value (n_frames,)}
    parameters/                  attrs time_step (tau), units = "lj"

Every time series, the observables included, has one entry per frame at the frames' steps, so readers
that index observables by frame (MDAnalysis) line up (energies are per atom, as in the thermo output).

File name and readers
---------------------
The app writes ``OUTPUT/trajectory.h5md`` (:data:`TRAJECTORY_NAME`). The extension is what MDAnalysis
chooses its reader by (``.h5md``; a ``.h5`` file is not recognised), so with the LAMMPS data file the
app reads (``--data``) or writes (``--write-data``)::

    import MDAnalysis
    universe = MDAnalysis.Universe("system.data", "output/trajectory.h5md")

works with no options; ``universe.trajectory.ts.data`` holds the step and the observables. Without a
data file, ``MDAnalysis.Universe("output/trajectory.h5md")`` builds a Universe of the right number of
atoms (no types or masses): MDAnalysis looks for the particle group ``particles/trajectory``, a soft
link to ``particles/all`` here.

Units
-----
Everything is in reduced Lennard-Jones units (sigma, tau, epsilon, the atom mass). H5MD readers that
convert units (MDAnalysis) reject names such as "sigma", so the ``unit`` attributes carry
MDAnalysis's base units, in which reduced values pass through unchanged: lengths "Angstrom" (= sigma),
times "ps" (= tau), velocities "Angstrom ps-1" (= sigma/tau). That is the convention MDAnalysis applies
to a LAMMPS data file in ``units lj`` as well (its coordinates are read as Angstrom). The true units
are in each dataset's ``reduced_unit`` attribute and in ``parameters`` (``units = "lj"``): do not
convert the values to SI with the ``unit`` strings.

Crash safety
------------
A hard kill at any moment leaves ``trajectory.h5md`` a complete file holding every frame written
before: frames are appended to a hidden twin copy (``.trajectory.h5md.twin``) that then replaces the
file atomically (:mod:`hpcgpu.output.twin_file`). While the run writes, the trajectory takes twice its
size on disk; the twin is removed at the end of the run.

Restarts
--------
A file is never overwritten. A fresh run (step 0) refuses an existing file; a run restarted from a
checkpoint at step R appends to the file of the run it continues: the frames up to step R are kept,
frames after R (written by the earlier job after the checkpoint it restarts from, and computed again
by this run) are dropped, and the frame at R is not written twice. A file of another system (atom
ids, species, box or time step differ) is refused. Each refusal is one ConfigurationError, raised on
every rank before any gather.
"""

from __future__ import annotations

import errno
import getpass
import os
import shutil
from pathlib import Path

import numpy as np

import hpcgpu
from hpcgpu.errors import ConfigurationError
from hpcgpu.output.errors import output_error
from hpcgpu.output.twin_file import TwinFile

from . import distributed

#: File name of the trajectory in the output directory; ``.h5md`` lets MDAnalysis pick its H5MD reader.
TRAJECTORY_NAME = "trajectory.h5md"

#: ``unit`` attributes: MDAnalysis's base units, in which the reduced LJ values are unchanged (see above).
_UNITS = {"position": "Angstrom", "velocity": "Angstrom ps-1", "edges": "Angstrom", "time": "ps"}
#: ``reduced_unit`` attributes: what the values are.
_REDUCED_UNITS = {"position": "sigma", "velocity": "sigma tau-1", "edges": "sigma", "time": "tau",
                  "temperature": "epsilon k_B-1", "potential_energy": "epsilon (per atom)",
                  "total_energy": "epsilon (per atom)", "pressure": "epsilon sigma-3"}
_OBSERVABLES = ("temperature", "potential_energy", "total_energy", "pressure")
_PARTICLE_SERIES = {"position": "particles/all/position", "image": "particles/all/image",
                    "velocity": "particles/all/velocity", "edges": "particles/all/box/edges"}


class H5MDWriter:
    """Append frames of a fixed set of atoms to an H5MD file (rank 0 only; the caller gathers).

    Parameters
    ----------
    path : str or Path
    box : array_like, shape (3,) -- box lengths (sigma), periodic
    atom_ids : numpy.ndarray, shape (n_atoms,), int64 -- sorted ids, the row order of every frame
    species : numpy.ndarray, shape (n_atoms,), int32 -- 0-based atom types
    dt : float -- time step (tau), to convert steps to times
    first_step : int -- the step the run starts from: 0 for a fresh run (``path`` must not exist),
        the checkpoint's step R after a restart (``path``, if it exists, is appended to after step R)
    author : str, optional -- default: the user name
    continuing : bool -- the run was asked to continue (``--restart``): an existing file of this system
        is continued even from step 0 (``--restart latest`` before the first checkpoint, after a job
        killed before it wrote one), keeping its frame of step 0

    Raises
    ------
    ConfigurationError
        When ``path`` exists on a fresh run, or belongs to another system on a restart.
    """

    def __init__(self, path, box, atom_ids, species, dt: float, first_step: int = 0, author: str | None = None,
                 continuing: bool = False):
        import h5py

        self.path = Path(path)
        self.dt = float(dt)
        self.box = np.asarray(box, dtype=np.float64)
        self.atom_ids = np.asarray(atom_ids, dtype=np.int64)
        self.species = np.asarray(species, dtype=np.int32)
        self.n_atoms = int(self.atom_ids.shape[0])
        self.file = None      # the TwinFile through which every change goes (crash-safe appends)
        self.last_step = -1   # step of the last frame in the file (-1: none)
        if not self.path.exists():
            def define(new_path):
                with h5py.File(new_path, "w-") as handle:
                    self._define(handle, author)
                    handle.flush()
            try:
                self.file = TwinFile.create(self.path, define)
            except FileExistsError:
                raise ConfigurationError(f"{self.path} appeared while this run was starting (another run writes "
                                         "there): choose another --output") from None
            return
        if first_step == 0 and not continuing:
            raise ConfigurationError(
                f"{self.path} already exists and this run starts from step 0: it would be overwritten. Move or "
                f"delete it, choose another --output, or continue the run that wrote it with --restart latest "
                f"(or --restart PATH)")
        try:
            with h5py.File(self.path, "r") as handle:
                problem = self._incompatibility(handle)
                steps = handle["particles/all/position/step"][()]
        except (OSError, KeyError, ValueError) as exc:
            problem = f"{self.path} cannot be read as an H5MD trajectory of apps.md ({exc})"
        if problem is not None:
            raise ConfigurationError(f"{problem}; this restarted run would append to it. Move it away or choose "
                                     "another --output")
        self.file = TwinFile.open(self.path)
        step = int(first_step)
        if steps.size and steps[-1] > step:
            self.file.modify(lambda file_path: self._drop_frames_after(file_path, step))
        kept = steps[steps <= step]
        self.last_step = int(kept[-1]) if kept.size else -1

    # ------------------------------------------------------------------ layout
    def _define(self, handle, author) -> None:
        h5md = handle.create_group("h5md")
        h5md.attrs["version"] = np.array([1, 1], dtype=np.int32)
        author_group = h5md.create_group("author")
        author_group.attrs["name"] = author or _user()
        creator = h5md.create_group("creator")
        creator.attrs["name"] = "hpcgpu apps.md"
        creator.attrs["version"] = hpcgpu.__version__
        particles = handle.create_group("particles/all")
        box_group = particles.create_group("box")
        box_group.attrs["dimension"] = np.int32(3)
        box_group.attrs["boundary"] = np.array([b"periodic"] * 3)
        particles.create_dataset("species", data=self.species)
        particles.create_dataset("id", data=self.atom_ids)
        # MDAnalysis (2.x) builds a topology-free Universe from particles/trajectory only: a soft link
        # lets MDAnalysis.Universe("trajectory.h5md") work without a data file (readers that list the
        # particle groups see "all" first, by name order).
        import h5py

        handle["particles"]["trajectory"] = h5py.SoftLink("/particles/all")
        self._time_series(box_group, "edges", (3,), np.float64)
        self._time_series(particles, "position", (self.n_atoms, 3), np.float64)
        self._time_series(particles, "image", (self.n_atoms, 3), np.int32)
        self._time_series(particles, "velocity", (self.n_atoms, 3), np.float64)
        observables = handle.create_group("observables")
        for name in _OBSERVABLES:
            self._time_series(observables, name, (), np.float64)
        parameters = handle.create_group("parameters")
        parameters.attrs["time_step"] = self.dt
        parameters.attrs["units"] = "lj"
        parameters.attrs["unit_convention"] = (
            "reduced Lennard-Jones units; the unit attributes name MDAnalysis base units in which the values are "
            "unchanged (Angstrom = sigma, ps = tau): see each dataset's reduced_unit")

    def _time_series(self, parent, name, frame_shape, dtype) -> None:
        group = parent.create_group(name)
        group.create_dataset("step", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(64,))
        time = group.create_dataset("time", shape=(0,), maxshape=(None,), dtype=np.float64, chunks=(64,))
        time.attrs["unit"] = _UNITS["time"]
        time.attrs["reduced_unit"] = _REDUCED_UNITS["time"]
        chunk = (1,) + frame_shape if frame_shape else (64,)
        value = group.create_dataset("value", shape=(0,) + frame_shape, maxshape=(None,) + frame_shape,
                                     dtype=dtype, chunks=chunk)
        if name in _UNITS:
            value.attrs["unit"] = _UNITS[name]
        if name in _REDUCED_UNITS:
            value.attrs["reduced_unit"] = _REDUCED_UNITS[name]

    @staticmethod
    def _series(handle):
        """``{name: h5py.Group}`` of every time series (particles and observables) of the open file."""
        series = {name: handle[path] for name, path in _PARTICLE_SERIES.items()}
        series.update({name: handle[f"observables/{name}"] for name in _OBSERVABLES})
        return series

    # ------------------------------------------------------------------ restart
    def _incompatibility(self, handle):
        """Why the open file is not a trajectory of this system, or None."""
        found_ids = handle["particles/all/id"][()]
        found_species = handle["particles/all/species"][()]
        if found_ids.shape != self.atom_ids.shape or not np.array_equal(found_ids, self.atom_ids):
            return f"{self.path} holds {found_ids.shape[0]} other atoms (ids differ from this run's {self.n_atoms})"
        if not np.array_equal(found_species, self.species):
            return f"{self.path} holds other atom types than this run"
        found_dt = float(handle["parameters"].attrs["time_step"]) if "parameters" in handle else None
        if found_dt != self.dt:
            return f"{self.path} was written with time step {found_dt}, this run uses {self.dt}"
        edges = handle["particles/all/box/edges/value"]
        if edges.shape[0] and not np.array_equal(edges[0], self.box):
            return f"{self.path} has the box {edges[0].tolist()}, this run {self.box.tolist()}"
        return None

    def _drop_frames_after(self, file_path, step: int) -> None:
        """Keep the frames at steps <= ``step`` in every series of ``file_path``, drop later ones."""
        import h5py

        with h5py.File(file_path, "r+") as handle:
            for group in self._series(handle).values():
                keep = int(np.searchsorted(group["step"][()], step, side="right"))   # steps increase
                for key in ("step", "time", "value"):
                    group[key].resize(keep, axis=0)
            handle.flush()

    # ------------------------------------------------------------------ frames
    def _append(self, group, step, value) -> None:
        n_frames = group["step"].shape[0]
        for key in ("step", "time", "value"):
            group[key].resize(n_frames + 1, axis=0)
        group["step"][n_frames] = step
        group["time"][n_frames] = step * self.dt
        group["value"][n_frames] = value

    def append(self, step: int, arrays: dict, thermo) -> None:
        """Add one frame: ``arrays`` from :func:`apps.md.distributed.gather_by_id`, ``thermo`` of this step.

        Crash-safe (:class:`hpcgpu.output.twin_file.TwinFile`): ``OUTPUT/trajectory.h5md`` is a complete
        file at every instant. A failed write raises :class:`hpcgpu.errors.OutputError`.
        """
        import h5py

        if arrays["atom_ids"].shape[0] != self.n_atoms:
            raise ValueError(f"H5MD frame: expected {self.n_atoms} atoms, found {arrays['atom_ids'].shape[0]}")
        values = (thermo.temperature, thermo.pair_energy, thermo.total_energy, thermo.pressure)

        frame = {"position": arrays["positions"].astype(np.float64), "image": arrays["images"].astype(np.int32),
                 "velocity": arrays["velocities"].astype(np.float64)}
        frame_bytes = sum(value.nbytes for value in frame.values())
        free = shutil.disk_usage(self.path.parent).free
        if free < 2 * frame_bytes + (64 << 10):   # the frame goes to two copies (TwinFile), plus metadata
            raise output_error(self.path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                               f"the frames written before are intact ({free} bytes free, a frame needs "
                               f"{2 * frame_bytes} on this file system)")

        def write_frame(file_path):
            with h5py.File(file_path, "r+") as handle:
                series = self._series(handle)
                self._append(series["edges"], step, self.box)
                for name, value in frame.items():
                    self._append(series[name], step, value)
                for name, value in zip(_OBSERVABLES, values):
                    self._append(series[name], step, value)
                handle.flush()   # raises on a full disk; h5py's close() would only print the failure
            # HDF5 does not always report a write the storage refused (a full tmpfs left holes that read
            # as zeros): read the frame back before the file is published.
            with h5py.File(file_path, "r") as handle:
                for name, value in frame.items():
                    stored = handle[_PARTICLE_SERIES[name]]
                    if int(stored["step"][-1]) != step or not np.array_equal(stored["value"][-1], value):
                        raise OSError(errno.EIO, f"frame of step {step} read back differs from what was written "
                                                 f"(the storage lost a write)")

        try:
            self.file.append(write_frame)
        except OSError as exc:
            raise output_error(self.path, exc, "the frames written before are intact") from None
        self.last_step = int(step)

    def close(self) -> None:
        """Remove the twin copy (the file itself is complete at every instant)."""
        if self.file is not None:
            self.file.remove_twin()
            self.file = None


class Trajectory:
    """Collective H5MD output of a distributed run: every rank calls :meth:`dump`, rank 0 writes.

    Opening gathers the atom ids and types and opens (or creates) ``path`` on rank 0 (see
    :class:`H5MDWriter` and the module docstring for what happens to an existing file); a refusal is
    raised on every rank.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    path : str or Path
    state : apps.md.distributed.DistributedState -- at the step the run starts from (0 or the restart's)
    config : apps.md.serial.MDConfig
    every : int -- frames at the steps that are multiples of ``every`` (``--dump-every``)
    continuing : bool -- ``--restart`` was given (see :class:`H5MDWriter`)
    """

    def __init__(self, comm, path, state, config, every: int, continuing: bool = False):
        self.comm, self.config, self.every = comm, config, int(every)
        gathered = distributed.gather_by_id(state)
        self.writer, problem, last_step = None, None, -1
        if comm.rank == 0:
            try:
                self.writer = H5MDWriter(path, state.box, gathered["atom_ids"], gathered["types"], config.dt,
                                         first_step=state.step, continuing=continuing)
                last_step = self.writer.last_step
            except ConfigurationError as exc:
                problem = str(exc)
        # Rank 0 alone sees the file: every rank raises its verdict together, before any gather.
        problem, self.last_step = comm.broadcast((problem, last_step))
        if problem is not None:
            raise ConfigurationError(problem)

    def dump(self, state, thermo=None) -> None:
        """Collective: append the frame of ``state.step`` if it is a multiple of ``every`` not yet in the file.

        ``thermo`` is the sample of this step if the caller has one; otherwise it is computed here, so
        that the observables have an entry for every frame. Returns None.
        """
        step = state.step
        # A restart re-dumps its first step: it is in the file already, or not on the schedule.
        if step % self.every or step <= self.last_step:
            return
        if thermo is None or thermo.step != step:
            thermo = distributed.thermo(state, self.config)
        gathered = distributed.gather_by_id(state)
        if self.writer is not None:
            self.writer.append(step, gathered, thermo)
        self.last_step = step

    def close(self) -> None:
        """Rank 0: close the file (a no-op elsewhere)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"
