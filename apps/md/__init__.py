"""Lennard-Jones molecular dynamics: the single-domain physics and kernels of ``apps.md``.

Everything works in reduced LJ units (length sigma, energy epsilon, mass m, time
tau = sigma * sqrt(m / epsilon), temperature epsilon / k_B, pressure epsilon / sigma**3).

Modules, one concept each:

- :mod:`apps.md.lattice`     -- fcc/bcc/sc lattices and id-seeded thermal velocities.
- :mod:`apps.md.rng`         -- counter-based random numbers from (seed, step, atom id), Numba == CUDA.
- :mod:`apps.md.potential`   -- LJ 12-6 pair table (plain / shift / force_shift, mixing, tail corrections).
- :mod:`apps.md.ghosts`      -- wrapping into the box and periodic ghost images for one rank.
- :mod:`apps.md.cells`       -- cell grid and counting-sort binning.
- :mod:`apps.md.neighbors`   -- full Verlet list with skin, overflow-safe, rebuild criterion.
- :mod:`apps.md.forces`      -- forces on owned atoms, pair energy and virial.
- :mod:`apps.md.integrate`   -- velocity Verlet, Langevin and Nose-Hoover thermostats.
- :mod:`apps.md.thermo`      -- temperature, energies, pressure and LAMMPS-style thermo lines.
- :mod:`apps.md.lammps_data` -- LAMMPS data files (atom_style atomic).
- :mod:`apps.md.serial`      -- a serial driver: ``init`` and ``step`` over a state record.

Arrays of one rank hold ``n_local`` owned atoms followed by ``n_ghost`` ghost atoms. Importing this
package does no work (no Numba compilation, no CuPy import).
"""
