"""GhostExchange: the ghosts of every sub-box are the serial periodic images within the ghost width.

The reference (:func:`~tests.particles.particle_reference.ghost_shell`) tries all 27 images of every
particle of the whole system. Ghosts arrive grouped by direction: the rows of direction ``k`` come from
the neighbour at ``-offset[k]`` and lie in the shell on that side, e.g. ``offset = (+1, 0, -1)``::

    x in [lower_x - width, lower_x)     y in [lower_y, upper_y)     z in [upper_z, upper_z + width)

Cases: every process grid of the rank count, float64 and float32, a box with four ghost widths per axis
and a thin one (one block of just over a ghost width along y: a rank's own images on both sides; two
blocks along z: the same rank below and above), particles spread uniformly or clustered in one corner
(ranks without particles).
"""

import math
import os

import numpy as np
import pytest

from hpcgpu.errors import DecompositionError
from tests.particles.particle_reference import ghost_shell, owner_blocks, process_grids, sorted_rows, wrap

WIDTH = 2.8
BOXES = [np.array([12.0, 11.3, 12.7]), np.array([12.0, 2.9, 5.7])]
N_PARTICLES = 500


def _cases(n_ranks):
    """(box, dims) pairs: every grid of ``n_ranks`` whose sub-boxes are at least a ghost width wide."""
    for box in BOXES:
        fits = [math.floor(length / WIDTH) for length in box]
        for dims in process_grids(n_ranks):
            if all(d <= f for d, f in zip(dims, fits)):
                yield box, dims


def _positions(box, dtype, layout, seed):
    rng = np.random.default_rng(seed)
    low, high = (0.0, 1.0) if layout == "uniform" else (-0.2, 0.2)    # clustered: around the origin's corner
    spread = rng.uniform(low, high, (N_PARTICLES, 3))
    return wrap((spread * box).astype(dtype), box)


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=90)
def test_ghosts_and_their_refresh_equal_the_serial_periodic_images(comm, monkeypatch):
    """On one node (rank order), then on two simulated nodes (a node-aware placement of the sub-boxes)."""
    from hpcgpu.particles.node_traffic import ghost_traffic_line

    _check_every_case(comm)
    if comm.size > 1:
        monkeypatch.setenv("HPCGPU_SIMULATE_NODES", "2:cyclic")
        domains = _check_every_case(comm)
        line = ghost_traffic_line(domains[-1], N_PARTICLES)
        assert line is not None and line.startswith("2 nodes x ") and "inter-node halo" in line, line
        if comm.size == 4:   # ranks 0, 2 on one node: some grid is placed off the rank order
            assert any(not domain.decomposition.node_layout.is_rank_order for domain in domains)


def _check_every_case(comm):
    """Build, compare and refresh the ghosts of every case; returns the domains."""
    from hpcgpu.particles import GhostExchange, ParticleDomain
    from hpcgpu.particles.node_traffic import ghost_traffic_line

    domains = []
    ids = np.arange(1, N_PARTICLES + 1, dtype=np.int64)
    charges = np.column_stack([ids * 0.5, -ids * 2.0]).astype(np.float32)    # a carried array (n, 2)
    for case, (box, dims) in enumerate(_cases(comm.size)):
        domain = ParticleDomain(comm, box, WIDTH, dims=dims)
        domains.append(domain)
        rank_of = {coords: rank for rank, coords in enumerate(comm.mpi.allgather(domain.coords))}
        if "HPCGPU_SIMULATE_NODES" not in os.environ:
            assert ghost_traffic_line(domain, N_PARTICLES) is None     # one node: no inter-node traffic to name
        for dtype in (np.float64, np.float32):
            for layout in ("uniform", "clustered"):
                what = (box.tolist(), dims, np.dtype(dtype).name, layout, os.environ.get("HPCGPU_SIMULATE_NODES"))
                everything = _positions(box, dtype, layout, seed=[case, dtype == np.float32, layout == "uniform"])
                owners = np.array([rank_of[tuple(c)] for c in owner_blocks(everything, box, dims)])
                mine = owners == comm.rank
                positions = np.ascontiguousarray(everything[mine])
                exchange = GhostExchange(domain, positions, WIDTH, carried={"ids": ids[mine], "charges": charges[mine]})

                # The ghosts are exactly the serial images in the shell, bit for bit, carried arrays alongside.
                reference_ids, reference_positions, reference_shifts = ghost_shell(
                    everything, ids, box, domain.subbox.lower, domain.subbox.upper, WIDTH)
                assert exchange.n_local == positions.shape[0] and exchange.n_ghost == reference_ids.size, what
                assert exchange.positions.dtype == dtype, what
                assert np.array_equal(sorted_rows(exchange.carried["ids"], exchange.positions),
                                      sorted_rows(reference_ids, reference_positions)), what
                assert np.array_equal(exchange.carried["charges"], charges[exchange.carried["ids"] - 1]), what

                _check_counts_and_directions(comm, domain, exchange, what)

                # forward(): owned particles move; every ghost becomes its owner's new position plus the same
                # periodic shift, summed in the positions' dtype (bit for bit).
                step = np.random.default_rng([case, 7]).uniform(-0.2, 0.2, (N_PARTICLES, 3)).astype(dtype)
                moved = everything + step
                shifts = np.round((exchange.positions.astype(np.float64)
                                   - everything[exchange.carried["ids"] - 1]) / box) * box
                assert set(map(tuple, shifts)) <= set(map(tuple, reference_shifts)), what
                rows = np.concatenate([moved[mine], exchange.positions])
                exchange.forward(rows)
                expected = moved[exchange.carried["ids"] - 1] + shifts.astype(dtype)
                assert np.array_equal(rows[exchange.n_local:], expected), what
                assert np.array_equal(rows[:exchange.n_local], moved[mine]), "forward leaves owned rows alone"

                with pytest.raises(DecompositionError, match="rebuild the exchange after migration"):
                    exchange.forward(rows[:-1] if len(rows) else np.zeros((1, 3), dtype))
    return domains


def _check_counts_and_directions(comm, domain, exchange, what):
    """What direction k receives is what its source sent in direction k; the rows lie on the source's side."""
    sent = comm.mpi.allgather(list(exchange.send_counts))
    assert len(exchange.receive_counts) == len(domain.neighbors) == 26
    for k, source in enumerate(exchange.sources):
        assert exchange.receive_counts[k] == sent[source][k], (what, k)
    assert sum(exchange.receive_counts) == exchange.n_ghost
    assert comm.allreduce(exchange.n_ghost, "sum") == sum(map(sum, sent)), what
    lower, upper = domain.subbox.lower, domain.subbox.upper
    slack = 1e-5 * float(np.max(domain.box))     # shifted positions are rounded once, in the positions' dtype
    for k, neighbor in enumerate(domain.neighbors):
        rows = exchange.positions[exchange.receive_offsets[k]:exchange.receive_offsets[k + 1]].astype(np.float64)
        for axis, d in enumerate(neighbor.offset):
            low, high = {+1: (lower[axis] - exchange.width, lower[axis]), 0: (lower[axis], upper[axis]),
                         -1: (upper[axis], upper[axis] + exchange.width)}[d]
            assert np.all((rows[:, axis] >= low - slack) & (rows[:, axis] < high + slack)), (what, neighbor.offset)


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_a_ghost_width_wider_than_a_sub_box_is_refused_on_every_rank(comm):
    from hpcgpu.particles import GhostExchange, ParticleDomain

    domain = ParticleDomain(comm, (12.0, 6.0, 6.0), 2.8, dims=(2, 1, 1))   # sub-boxes 6 x 6 x 6
    positions = np.zeros((0, 3))
    with pytest.raises(DecompositionError, match="thinner than the ghost width 6.5.*fewer ranks"):
        GhostExchange(domain, positions, 6.5)
