"""LAMMPS data files: round trip and clear errors on malformed input."""

import numpy as np
import pytest

from apps.md import lammps_data, lattice
from hpcgpu.errors import ConfigurationError


def _sample():
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (2, 2, 2))
    rng = np.random.default_rng(0)
    return lammps_data.LammpsData(
        box_lower=np.zeros(3), box_upper=box, masses=np.array([1.0, 2.5]),
        atom_ids=atom_ids[::-1].copy(), types=(atom_ids % 2).astype(np.int32), positions=positions + 1e-3 / 3,
        images=rng.integers(-2, 3, (atom_ids.size, 3)).astype(np.int32),
        velocities=rng.normal(size=(atom_ids.size, 3)))


def test_round_trip_is_exact(tmp_path):
    data = _sample()
    path = tmp_path / "lj.data"
    lammps_data.write_data(path, data)
    back = lammps_data.read_data(path)
    for name in ("box_lower", "box_upper", "masses", "atom_ids", "types", "positions", "images", "velocities"):
        np.testing.assert_array_equal(getattr(back, name), getattr(data, name), err_msg=name)
    assert "2 atom types" in path.read_text() and "Atoms # atomic" in path.read_text()


def test_reads_a_hand_written_file_without_images_or_velocities(tmp_path):
    path = tmp_path / "small.data"
    path.write_text("LAMMPS data file\n\n2 atoms\n1 atom types\n\n0 5 xlo xhi\n0 5 ylo yhi\n-1 4 zlo zhi\n\n"
                    "Masses\n\n1 1.0 # argon-ish\n\nPair Coeffs # lj/cut\n\n1 1.0 1.0\n\n"
                    "Atoms # atomic\n\n2 1 1.0 2.0 3.0\n1 1 0.5 0.5 0.5\n")
    data = lammps_data.read_data(path)
    np.testing.assert_array_equal(data.atom_ids, [2, 1])
    np.testing.assert_array_equal(data.types, [0, 0])
    np.testing.assert_array_equal(data.images, 0)
    np.testing.assert_array_equal(data.box, [5, 5, 5])
    assert data.velocities is None


@pytest.mark.parametrize("mutation,message", [
    (lambda t: t.replace("Atoms # atomic", "Atoms # full"), "atom_style atomic"),
    (lambda t: t.replace("32 atoms", "33 atoms"), "expected 33 lines in Atoms"),
    (lambda t: t.replace("2 atom types", "1 atom types"), "type in 1..1"),
    (lambda t: t.replace("xlo xhi", "xlo"), "unsupported header line"),
    (lambda t: t.replace("\nMasses\n", "\nMassez\n"), "unsupported header line|Masses"),
    (lambda t: t.split("Velocities")[0] + "Velocities\n\n1 0.0 0.0\n", "Velocities"),
])
def test_malformed_files_raise_clear_errors(tmp_path, mutation, message):
    path = tmp_path / "bad.data"
    lammps_data.write_data(path, _sample())
    path.write_text(mutation(path.read_text()))
    with pytest.raises(ConfigurationError, match=message):
        lammps_data.read_data(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigurationError, match="existing file"):
        lammps_data.read_data(tmp_path / "nope.data")


def test_serial_state_round_trips_through_a_data_file(tmp_path):
    from apps.md import potential, serial

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (3, 3, 3))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.0, 3)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5))
    state = serial.init(positions, velocities, box, config, atom_ids=atom_ids)
    for _ in range(5):
        serial.step(state, config)
    path = tmp_path / "state.data"
    lammps_data.write_data(path, serial.to_lammps_data(state, [1.0]))
    restarted = serial.init_from_lammps_data(lammps_data.read_data(path), config)
    before, after = serial.host_arrays_by_id(state), serial.host_arrays_by_id(restarted)
    for name in ("atom_ids", "types", "velocities"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # Between rebuilds atoms may sit slightly outside the box; the restart wraps them: compare unwrapped.
    np.testing.assert_allclose(after["positions"] + after["images"] * box,
                               before["positions"] + before["images"] * box, rtol=0, atol=1e-12)
    np.testing.assert_allclose(serial.thermo(restarted, config)[1:], serial.thermo(state, config)[1:], rtol=1e-12)
