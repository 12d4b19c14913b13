"""Read and write LAMMPS data files, ``atom_style atomic`` (orthogonal boxes).

Layout (LAMMPS ``read_data``)::

    <title line>
    <blank>
    N atoms
    T atom types
    xlo xhi xlo xhi     (likewise ylo yhi, zlo zhi)
    <blank>
    Masses                       type mass
    Atoms # atomic               id type x y z [ix iy iz]
    Velocities                   id vx vy vz          (optional)

``#`` starts a comment. In memory atom *types are 0-based* (``type - 1``), like every MD kernel; the
file keeps LAMMPS' 1-based types. Positions are read as written (shift them with ``box_lower`` if the box
does not start at the origin). Coefficient sections (``Pair Coeffs``, ``PairIJ Coeffs``) are skipped:
the potential is set in the run configuration. Any other problem raises :class:`ConfigurationError`
naming the file, the line and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError

_HEADER_KEYWORDS = (("atom types", 1), ("atoms", 1), ("xlo xhi", 2), ("ylo yhi", 2), ("zlo zhi", 2))
_SKIPPED_SECTIONS = ("Pair Coeffs", "PairIJ Coeffs")
_SECTIONS = ("Masses", "Atoms", "Velocities") + _SKIPPED_SECTIONS


@dataclass
class LammpsData:
    """Contents of an atomic data file.

    Attributes
    ----------
    box_lower, box_upper : numpy.ndarray, shape (3,), float64 -- (xlo, ylo, zlo), (xhi, yhi, zhi)
    masses : numpy.ndarray, shape (n_types,), float64 -- mass of type t (0-based) at [t]
    atom_ids : numpy.ndarray, shape (n_atoms,), int64 -- in file order
    types : numpy.ndarray, shape (n_atoms,), int32 -- 0-based
    positions : numpy.ndarray, shape (n_atoms, 3), float64
    images : numpy.ndarray, shape (n_atoms, 3), int32 -- zeros if the file has none
    velocities : numpy.ndarray, shape (n_atoms, 3), float64, or None without a Velocities section
    title : str
    """

    box_lower: np.ndarray
    box_upper: np.ndarray
    masses: np.ndarray
    atom_ids: np.ndarray
    types: np.ndarray
    positions: np.ndarray
    images: np.ndarray
    velocities: np.ndarray | None = None
    title: str = "LAMMPS data file written by hpcgpu apps.md"

    @property
    def box(self) -> np.ndarray:
        """Box lengths, shape (3,)."""
        return self.box_upper - self.box_lower


def write_data(path, data: LammpsData) -> None:
    """Write ``data`` as a LAMMPS data file (full precision, image flags, Velocities if present)."""
    n_atoms, n_types = data.positions.shape[0], data.masses.shape[0]
    lines = [data.title.replace("\n", " "), "", f"{n_atoms} atoms", f"{n_types} atom types", ""]
    for axis, name in enumerate("xyz"):
        lines.append(f"{float(data.box_lower[axis])!r} {float(data.box_upper[axis])!r} {name}lo {name}hi")
    lines += ["", "Masses", ""]
    lines += [f"{t + 1} {mass!r}" for t, mass in enumerate(data.masses.tolist())]
    lines += ["", "Atoms # atomic", ""]
    for atom_id, atom_type, position, image in zip(data.atom_ids.tolist(), data.types.tolist(),
                                                     data.positions.tolist(), data.images.tolist()):
        lines.append(f"{atom_id} {atom_type + 1} {position[0]!r} {position[1]!r} {position[2]!r} "
                     f"{image[0]} {image[1]} {image[2]}")
    if data.velocities is not None:
        lines += ["", "Velocities", ""]
        for atom_id, velocity in zip(data.atom_ids.tolist(), data.velocities.tolist()):
            lines.append(f"{atom_id} {velocity[0]!r} {velocity[1]!r} {velocity[2]!r}")
    with open(path, "w", encoding="ascii") as stream:
        stream.write("\n".join(lines) + "\n")


def read_data(path) -> LammpsData:
    """Read an ``atom_style atomic`` LAMMPS data file (see the module docstring)."""
    if not os.path.isfile(path):
        raise ConfigurationError(f"LAMMPS data file: expected an existing file, found no file at {path!r}")
    with open(path, encoding="ascii", errors="replace") as stream:
        raw_lines = stream.read().splitlines()
    if not raw_lines:
        raise ConfigurationError(f"{path}: expected a LAMMPS data file, found an empty file")
    title = raw_lines[0].strip()
    header = {}
    sections = {}
    current = None
    for number, raw in enumerate(raw_lines[1:], start=2):
        text, _, comment = raw.partition("#")
        text = text.strip()
        if not text:
            continue
        if text in _SECTIONS:
            if text == "Atoms" and comment.strip() not in ("", "atomic"):
                raise ConfigurationError(
                    f"{path}:{number}: expected 'Atoms # atomic', found 'Atoms # {comment.strip()}'; "
                    "only atom_style atomic is supported")
            if text in sections:
                raise ConfigurationError(f"{path}:{number}: section {text!r} appears twice")
            current = text
            sections[current] = []
            continue
        if current is None:
            _parse_header_line(path, number, text, header)
        else:
            sections[current].append((number, text.split()))
    for keyword, _ in _HEADER_KEYWORDS:
        if keyword not in header:
            raise ConfigurationError(f"{path}: expected a header line '... {keyword}', found none")
    n_atoms, n_types = int(header["atoms"][0]), int(header["atom types"][0])
    for required in ("Masses", "Atoms"):
        if required not in sections and not (required == "Atoms" and n_atoms == 0):
            raise ConfigurationError(f"{path}: expected a '{required}' section, found none")
    masses = _parse_masses(path, sections.get("Masses", []), n_types)
    atom_ids, types, positions, images = _parse_atoms(path, sections.get("Atoms", []), n_atoms, n_types)
    velocities = None
    if "Velocities" in sections:
        velocities = _parse_velocities(path, sections["Velocities"], atom_ids)
    lower = np.array([header[k][0] for k in ("xlo xhi", "ylo yhi", "zlo zhi")], dtype=np.float64)
    upper = np.array([header[k][1] for k in ("xlo xhi", "ylo yhi", "zlo zhi")], dtype=np.float64)
    if np.any(upper <= lower):
        raise ConfigurationError(f"{path}: expected xhi > xlo etc., found lower {lower} and upper {upper}")
    return LammpsData(box_lower=lower, box_upper=upper, masses=masses, atom_ids=atom_ids, types=types,
                      positions=positions, images=images, velocities=velocities, title=title)


def _parse_header_line(path, number, text, header):
    if text.endswith("xy xz yz"):
        raise ConfigurationError(f"{path}:{number}: triclinic boxes are not supported; found '{text}'")
    for keyword, n_values in _HEADER_KEYWORDS:
        if text.endswith(keyword):
            values = text[: -len(keyword)].split()
            try:
                if len(values) != n_values:
                    raise ValueError
                header[keyword] = [int(v) for v in values] if n_values == 1 else [float(v) for v in values]
            except ValueError:
                raise ConfigurationError(
                    f"{path}:{number}: expected {n_values} number(s) before '{keyword}', found '{text}'") from None
            return
    # Other header keywords (bonds, extra/...) would need another atom_style.
    raise ConfigurationError(f"{path}:{number}: unsupported header line '{text}'; expected one of "
                             f"{[k for k, _ in _HEADER_KEYWORDS]} (atom_style atomic)")


def _parse_masses(path, rows, n_types):
    masses = np.full(n_types, np.nan)
    for number, fields in rows:
        try:
            atom_type, mass = int(fields[0]), float(fields[1])
            if len(fields) != 2:
                raise ValueError
        except (ValueError, IndexError):
            raise ConfigurationError(f"{path}:{number}: expected 'type mass' in Masses, found {' '.join(fields)!r}") from None
        if not 1 <= atom_type <= n_types or not mass > 0:
            raise ConfigurationError(f"{path}:{number}: expected a type in 1..{n_types} and a positive mass, "
                                     f"found type {atom_type}, mass {mass}")
        masses[atom_type - 1] = mass
    if np.any(np.isnan(masses)):
        missing = (np.nonzero(np.isnan(masses))[0] + 1).tolist()
        raise ConfigurationError(f"{path}: expected a mass for every type, found none for types {missing}")
    return masses


def _parse_atoms(path, rows, n_atoms, n_types):
    if len(rows) != n_atoms:
        raise ConfigurationError(f"{path}: expected {n_atoms} lines in Atoms (header), found {len(rows)}")
    atom_ids = np.empty(n_atoms, np.int64)
    types = np.empty(n_atoms, np.int32)
    positions = np.empty((n_atoms, 3))
    images = np.zeros((n_atoms, 3), np.int32)
    for row, (number, fields) in enumerate(rows):
        try:
            if len(fields) not in (5, 8):
                raise ValueError
            atom_ids[row], types[row] = int(fields[0]), int(fields[1]) - 1
            positions[row] = [float(v) for v in fields[2:5]]
            if len(fields) == 8:
                images[row] = [int(v) for v in fields[5:8]]
        except ValueError:
            raise ConfigurationError(f"{path}:{number}: expected 'id type x y z [ix iy iz]' in Atoms, "
                                     f"found {' '.join(fields)!r}") from None
        if not 0 <= types[row] < n_types:
            raise ConfigurationError(f"{path}:{number}: expected an atom type in 1..{n_types}, found {types[row] + 1}")
    if np.unique(atom_ids).size != n_atoms:
        raise ConfigurationError(f"{path}: expected unique atom ids in Atoms, found duplicates")
    return atom_ids, types, positions, images


def _parse_velocities(path, rows, atom_ids):
    row_of_id = {atom_id: row for row, atom_id in enumerate(atom_ids.tolist())}
    velocities = np.full((atom_ids.size, 3), np.nan)
    if len(rows) != atom_ids.size:
        raise ConfigurationError(f"{path}: expected {atom_ids.size} lines in Velocities, found {len(rows)}")
    for number, fields in rows:
        try:
            if len(fields) != 4:
                raise ValueError
            row = row_of_id[int(fields[0])]
            velocities[row] = [float(v) for v in fields[1:4]]
        except (ValueError, KeyError):
            raise ConfigurationError(f"{path}:{number}: expected 'id vx vy vz' with an id from Atoms, "
                                     f"found {' '.join(fields)!r}") from None
    if np.any(np.isnan(velocities)):
        raise ConfigurationError(f"{path}: expected a velocity for every atom, found some missing")
    return velocities
