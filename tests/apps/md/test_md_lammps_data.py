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


def _shifted_box_data():
    """3 x 3 x 3 fcc cells (108 atoms) in the box -5.3..0.1 x 2.25..7.65 x -100.125..-94.725, all inside."""
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (3, 3, 3))
    lower = np.array([-5.3, 2.25, -100.125])
    upper = np.array([0.1, 7.65, -94.725])
    rng = np.random.default_rng(11)
    fractions = (positions + rng.uniform(0.0, 0.4, positions.shape)) / box
    return lammps_data.LammpsData(
        box_lower=lower, box_upper=upper, masses=np.array([1.0]), atom_ids=atom_ids,
        types=np.zeros(atom_ids.size, np.int32), positions=lower + np.minimum(fractions, 0.999) * (upper - lower),
        images=rng.integers(-1, 2, (atom_ids.size, 3)).astype(np.int32), velocities=rng.normal(size=(atom_ids.size, 3)))


def _through_the_app(tmp_path, source, name):
    """read_data -> data_atoms -> distributed state -> gather_by_id -> write_gathered, as apps.md does."""
    import hpcgpu
    from apps.md import distributed, potential, serial, system
    from hpcgpu.particles import ParticleDomain

    comm = hpcgpu.Communicator()
    data = lammps_data.read_data(source)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5))
    domain = ParticleDomain(comm, data.box, config.ghost_width)
    atoms = system.data_atoms(domain, data, 1.0, seed=0)
    assert np.all((atoms.positions >= 0) & (atoms.positions < data.box))
    state = distributed.init(domain, atoms.positions, atoms.velocities, config, types=atoms.types,
                             masses=atoms.masses, atom_ids=atoms.atom_ids, images=atoms.images)
    target = tmp_path / name
    system.write_gathered(target, distributed.gather_by_id(state), domain.box, atoms.masses, "round trip",
                          box_lower=atoms.box_lower, box_upper=atoms.box_upper)
    return target


def test_write_data_keeps_a_box_that_does_not_start_at_the_origin(tmp_path):
    """Issue 24: --write-data used to move the box to 0..L. Bounds now come back bit for bit; atoms in
    [0, L) keep their bits (no translation: coordinates are taken modulo L); an atom moved by a box
    length into [0, L) comes back within half an ulp of L; a second round trip changes nothing."""
    original = _shifted_box_data()
    source = tmp_path / "shifted.data"
    lammps_data.write_data(source, original)
    first = _through_the_app(tmp_path, source, "first.data")
    back = lammps_data.read_data(first)
    for name in ("box_lower", "box_upper"):
        np.testing.assert_array_equal(getattr(back, name), getattr(original, name), err_msg=name)
    assert "-5.3 0.1 xlo xhi" in first.read_text() and "-100.125 -94.725 zlo zhi" in first.read_text()
    order = np.argsort(back.atom_ids)
    for name in ("atom_ids", "types", "images", "velocities"):
        np.testing.assert_array_equal(getattr(back, name)[order], getattr(original, name), err_msg=name)
    positions = back.positions[order]
    box = original.box
    kept = (original.positions >= 0) & (original.positions < box)     # per coordinate
    assert kept.any() and (~kept).any()
    np.testing.assert_array_equal(positions[kept], original.positions[kept])
    assert np.all(np.abs(positions - original.positions) <= np.spacing(box) / 2)
    second = _through_the_app(tmp_path, first, "second.data")
    assert second.read_text() == first.read_text()


def test_remap_into_box_is_lammps_read_data():
    """Domain::remap: x < lo moves up, x >= hi moves down, by whole box lengths, image flags counting."""
    from apps.md.system import remap_into_box

    lower, upper = np.array([-5.3, 0.0, 2.0]), np.array([1.5, 6.8, 8.8])
    positions = np.array([[-5.3, 0.0, 2.0], [1.5, 6.8, 8.8], [-12.1, 13.6, -11.6], [0.25, 3.5, 40.0]])
    images = np.zeros((4, 3), np.int32)
    remapped, new_images = remap_into_box(positions, images, lower, upper)
    assert np.all((remapped >= lower) & (remapped < upper))
    np.testing.assert_array_equal(remapped[0], positions[0])         # on the lower bounds: unchanged
    np.testing.assert_array_equal(remapped[3, :2], positions[3, :2])  # inside: unchanged bits
    np.testing.assert_array_equal(new_images, [[0, 0, 0], [1, 1, 1], [-1, 2, -2], [0, 0, 5]])
    np.testing.assert_allclose(remapped + new_images * (upper - lower), positions, rtol=0, atol=1e-13)
