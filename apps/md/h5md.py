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
        position/{step, time, value (n_frames, n_atoms, 3)}     unit "sigma"
        image/{step, time, value (n_frames, n_atoms, 3)}        int32 box crossings
        velocity/{step, time, value (n_frames, n_atoms, 3)}     unit "sigma tau-1"
        species (n_atoms,)       0-based atom types
        id (n_atoms,)            atom ids (LAMMPS numbering)
    observables/{temperature, potential_energy, total_energy, pressure}/{step, time, value (n_frames,)}

Units are reduced Lennard-Jones units; ``time`` carries unit "tau". Readers that convert units (MDAnalysis)
need ``convert_units=False`` for them.
"""

from __future__ import annotations

import getpass

import numpy as np

import hpcgpu

_UNITS = {"position": "sigma", "velocity": "sigma tau-1", "edges": "sigma", "image": None}
_OBSERVABLES = ("temperature", "potential_energy", "total_energy", "pressure")


class H5MDWriter:
    """Append frames of a fixed set of atoms to an H5MD file (rank 0 only; the caller gathers).

    Parameters
    ----------
    path : str or Path
    box : array_like, shape (3,) -- box lengths (sigma), periodic
    atom_ids : numpy.ndarray, shape (n_atoms,), int64 -- sorted ids, the row order of every frame
    species : numpy.ndarray, shape (n_atoms,), int32 -- 0-based atom types
    dt : float -- time step (tau), to convert steps to times
    """

    def __init__(self, path, box, atom_ids, species, dt: float, author: str | None = None):
        import h5py

        self.dt = float(dt)
        self.box = np.asarray(box, dtype=np.float64)
        self.n_atoms = int(atom_ids.shape[0])
        self.file = h5py.File(path, "w")
        h5md = self.file.create_group("h5md")
        h5md.attrs["version"] = np.array([1, 1], dtype=np.int32)
        author_group = h5md.create_group("author")
        author_group.attrs["name"] = author or _user()
        creator = h5md.create_group("creator")
        creator.attrs["name"] = "hpcgpu apps.md"
        creator.attrs["version"] = hpcgpu.__version__
        particles = self.file.create_group("particles/all")
        box_group = particles.create_group("box")
        box_group.attrs["dimension"] = np.int32(3)
        box_group.attrs["boundary"] = np.array([b"periodic"] * 3)
        particles.create_dataset("species", data=np.asarray(species, dtype=np.int32))
        particles.create_dataset("id", data=np.asarray(atom_ids, dtype=np.int64))
        self.series = {
            "edges": self._time_series(box_group, "edges", (3,), np.float64),
            "position": self._time_series(particles, "position", (self.n_atoms, 3), np.float64),
            "image": self._time_series(particles, "image", (self.n_atoms, 3), np.int32),
            "velocity": self._time_series(particles, "velocity", (self.n_atoms, 3), np.float64),
        }
        observables = self.file.create_group("observables")
        for name in _OBSERVABLES:
            self.series[name] = self._time_series(observables, name, (), np.float64)

    def _time_series(self, parent, name, frame_shape, dtype):
        group = parent.create_group(name)
        group.create_dataset("step", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(64,))
        time = group.create_dataset("time", shape=(0,), maxshape=(None,), dtype=np.float64, chunks=(64,))
        time.attrs["unit"] = "tau"
        chunk = (1,) + frame_shape if frame_shape else (64,)
        value = group.create_dataset("value", shape=(0,) + frame_shape, maxshape=(None,) + frame_shape,
                                     dtype=dtype, chunks=chunk)
        unit = _UNITS.get(name)
        if unit:
            value.attrs["unit"] = unit
        return group

    def _append(self, name, step, value):
        group = self.series[name]
        n_frames = group["step"].shape[0]
        for key in ("step", "time", "value"):
            group[key].resize(n_frames + 1, axis=0)
        group["step"][n_frames] = step
        group["time"][n_frames] = step * self.dt
        group["value"][n_frames] = value

    def append(self, step: int, arrays: dict, thermo=None) -> None:
        """Add one frame: ``arrays`` from :func:`apps.md.distributed.gather_by_id`; ``thermo`` optional."""
        if arrays["atom_ids"].shape[0] != self.n_atoms:
            raise ValueError(f"H5MD frame: expected {self.n_atoms} atoms, found {arrays['atom_ids'].shape[0]}")
        self._append("edges", step, self.box)
        self._append("position", step, arrays["positions"].astype(np.float64))
        self._append("image", step, arrays["images"].astype(np.int32))
        self._append("velocity", step, arrays["velocities"].astype(np.float64))
        if thermo is not None:
            values = (thermo.temperature, thermo.pair_energy, thermo.total_energy, thermo.pressure)
            for name, value in zip(_OBSERVABLES, values):
                self._append(name, step, value)
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"
