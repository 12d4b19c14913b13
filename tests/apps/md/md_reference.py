"""NumPy references and setup helpers for the MD tests (imported by the test modules)."""

import numpy as np

from apps.md import cells, ghosts, neighbors


def neighbor_setup(positions, box, pair_cutoff, skin, capacity=None):
    """Ghosts + cells + neighbour list for owned ``positions`` (already in the box)."""
    width = pair_cutoff + skin
    ghost = ghosts.make_periodic_ghosts(positions, box, width)
    all_positions = np.ascontiguousarray(np.concatenate([positions, ghost.positions]))
    grid = cells.make_cell_grid(np.zeros(3), box, width, width)
    cell_list = cells.bin_atoms(all_positions, grid)
    neighbor_list = neighbors.build_neighbor_list(all_positions, positions.shape[0], cell_list, grid,
                                                  pair_cutoff, skin, capacity=capacity)
    return all_positions, ghost, neighbor_list


def reference_energy_forces(positions, types, box, potential):
    """Plain NumPy O(N^2) reference with all periodic images within the cutoff (any box size)."""
    n_atoms = positions.shape[0]
    cutoff = potential.max_cutoff
    n_images = np.ceil(cutoff / np.asarray(box)).astype(int)
    shifts = np.array([[i, j, k] for i in range(-n_images[0], n_images[0] + 1)
                       for j in range(-n_images[1], n_images[1] + 1)
                       for k in range(-n_images[2], n_images[2] + 1)]) * np.asarray(box)
    forces = np.zeros_like(positions)
    energy = 0.0
    virial = 0.0
    for i in range(n_atoms):
        delta = positions[i] - (positions[None, :, :] + shifts[:, None, :])  # (n_shifts, n_atoms, 3)
        r = np.linalg.norm(delta, axis=-1)
        r[r == 0] = np.inf  # the atom itself
        type_j = np.broadcast_to(types[None, :], r.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(np.isfinite(r), potential.energy(np.where(np.isfinite(r), r, 1.0), types[i], type_j), 0.0)
            f = np.where(np.isfinite(r), potential.force(np.where(np.isfinite(r), r, 1.0), types[i], type_j), 0.0)
        energy += 0.5 * e.sum()
        virial += 0.5 * (f * np.where(np.isfinite(r), r, 0.0)).sum()
        forces[i] = ((f / np.where(np.isfinite(r), r, 1.0))[..., None] * delta).sum(axis=(0, 1))
    return energy, forces, virial
