"""Node-aware placement (hpcgpu.decomposition.nodes): halo bytes inside / across nodes, the layout
chosen for any launcher rank order, simulated nodes, and app runs that must not change."""

import itertools
import os
import random
import sys

import numpy as np
import pytest

from hpcgpu.decomposition.comm import simulated_nodes
from hpcgpu.decomposition.nodes import describe_node_traffic, halo_bytes, node_aware_layout
from hpcgpu.decomposition.shape import split_extents
from hpcgpu.errors import DecompositionError

from tests.helpers.app_runs import run_app_summary

MB = 1e6


def reference_halo_bytes(dims, shape, width, itemsize, nodes, periodic, corners=True):
    """Rank by rank, message by message: the definition halo_bytes vectorises."""
    extents = [split_extents(n, d) for n, d in zip(shape, dims)]
    intra = inter = 0
    for position in itertools.product(*(range(d) for d in dims)):
        for offset in itertools.product((-1, 0, 1), repeat=len(dims)):
            if not any(offset) or (not corners and sum(map(abs, offset)) != 1):
                continue
            target = []
            for axis, (c, step) in enumerate(zip(position, offset)):
                c += step
                if not 0 <= c < dims[axis]:
                    if not periodic[axis]:
                        break
                    c %= dims[axis]
                target.append(c)
            else:
                if tuple(target) == position:
                    continue   # own neighbour: local copy
                cells = np.prod([width if step else extents[a][position[a]] for a, step in enumerate(offset)])
                if nodes[position] == nodes[tuple(target)]:
                    intra += int(cells) * itemsize
                else:
                    inter += int(cells) * itemsize
    return intra, inter


@pytest.mark.parametrize("dims, shape, periodic", [
    ((4, 2), (8192, 8192), (False, False)),
    ((3, 2), (7, 5), (True, False)),
    ((2, 3, 2), (9, 7, 5), (True, False, True)),
    ((5,), (13,), (True,)),
    ((1, 4), (6, 11), (True, True)),
])
def test_halo_bytes_matches_a_message_by_message_count(dims, shape, periodic):
    rng = np.random.default_rng(7)
    for width, corners in ((1, True), (2, False)):
        nodes = rng.integers(0, 3, size=dims)
        expected = reference_halo_bytes(dims, shape, width, 8, nodes, periodic, corners)
        assert halo_bytes(dims, shape, width, 8, nodes, periodic, corners) == expected
        # Moving blocks between nodes only moves bytes between the two columns.
        one_node = halo_bytes(dims, shape, width, 8, np.zeros(dims, dtype=int), periodic, corners)
        assert one_node[1] == 0 and one_node[0] == sum(expected)


def test_two_nodes_of_four_on_8192_squared():
    """The issue's case. Default dims 4 x 2 with srun's block placement are already node-aware (each node a
    2 x 2 box); slabs 8 x 1 from a round-robin launcher send every cut across nodes until reordered.

    ::

        rank order, nodes r % 2:  0 1 0 1 0 1 0 1  (7 cuts cross)   node-aware: 0 0 0 0 1 1 1 1  (1 cut)
    """
    face = 8192 * 8 * 2          # one cut of fp64 rows, both directions
    default = node_aware_layout(2, 4, (8192, 8192))
    assert default.dims == (4, 2) and not default.node_aware and default.is_rank_order
    assert default.node_tile() == (2, 2)
    assert default.inter_bytes == face // 2 * 2 + 4 * 8   # two half-width faces across, plus 4 corner cells

    round_robin = [rank % 2 for rank in range(8)]
    slabs = node_aware_layout(2, 4, (8192, 8192), dims=(8, 1), node_of_rank=round_robin)
    assert slabs.naive_inter_bytes == 7 * face and slabs.inter_bytes == face
    assert slabs.intra_bytes == 6 * face and slabs.naive_intra_bytes == 0
    assert slabs.node_aware and slabs.node_tile() == (4, 1)
    assert describe_node_traffic(slabs) == (
        "2 nodes x 4 ranks: node-aware layout 8x1 (node blocks 4x1): inter-node halo 131 kB/step vs 918 kB naive")
    assert describe_node_traffic(slabs, exchanges_per_step=3).endswith("393 kB/step vs 2.75 MB naive")


@pytest.mark.parametrize("n_nodes, per_node, shape, periodic", [
    (2, 4, (8192, 8192), False),
    (4, 8, (16384, 16384), (True, False)),
    (8, 8, (256, 256, 256), True),
    (3, 4, (1000, 999), False),          # 12 ranks: 4 x 3 blocks of uneven size
    (2, 3, (7, 5), (True, False)),       # 3 ranks per node do not tile 3 x 2
])
def test_any_launcher_order_gets_the_same_traffic(n_nodes, per_node, shape, periodic):
    """The placement depends on which ranks share a node, never on how the launcher numbered them."""
    block = [rank // per_node for rank in range(n_nodes * per_node)]
    reference = node_aware_layout(n_nodes, per_node, shape, periodic, node_of_rank=block)
    assert reference.inter_bytes <= reference.naive_inter_bytes
    random.seed(3)
    orders = [[rank % n_nodes for rank in range(n_nodes * per_node)], random.sample(block, len(block))]
    for node_of_rank in orders:
        layout = node_aware_layout(n_nodes, per_node, shape, periodic, node_of_rank=node_of_rank)
        assert layout.dims == reference.dims
        assert layout.inter_bytes == reference.inter_bytes <= layout.naive_inter_bytes
        assert layout.intra_bytes + layout.inter_bytes == layout.naive_intra_bytes + layout.naive_inter_bytes
        # Every block has exactly one owner, and a node's ranks own that node's blocks.
        assert sorted(layout.position_of_rank) == sorted(itertools.product(*(range(d) for d in layout.dims)))
        grid = layout.node_of_position()
        normalised = layout.node_of_rank
        assert all(grid[p] == normalised[r] for r, p in enumerate(layout.position_of_rank))


def test_three_dimensional_nodes_become_cubes():
    layout = node_aware_layout(8, 8, (512, 512, 512), True, node_of_rank=[r % 8 for r in range(64)])
    assert layout.dims == (4, 4, 4) and layout.node_tile() == (2, 2, 2)
    assert layout.inter_bytes < 0.76 * layout.naive_inter_bytes


def test_one_node_keeps_the_rank_order():
    for shape, dims in (((8192, 8192), None), ((64, 64, 64), (2, 2, 2)), ((11, 7), (3, 1))):
        n = int(np.prod(dims)) if dims else 4
        layout = node_aware_layout(1, n, shape, dims=dims)
        assert layout.is_rank_order and not layout.node_aware and layout.inter_bytes == 0
        assert layout.position_of_rank == tuple(tuple(int(c) for c in np.unravel_index(r, layout.dims)) for r in range(n))


def test_inconsistent_node_counts_are_refused():
    with pytest.raises(DecompositionError, match="node_of_rank names 2 node"):
        node_aware_layout(3, 4, (64, 64), node_of_rank=[0] * 4 + [1] * 4)
    with pytest.raises(DecompositionError, match="positive integers"):
        node_aware_layout(0, 4, (64, 64))


def test_simulated_nodes_patterns_and_errors():
    assert simulated_nodes("2", 4) == (0, 0, 1, 1)
    assert simulated_nodes("2:block", 5) == (0, 0, 0, 1, 1)
    assert simulated_nodes("2:cyclic", 4) == (0, 1, 0, 1)
    assert simulated_nodes(" 3 ", 4) == (0, 0, 1, 2)
    for bad in ("0", "5", "two", "2:random"):
        with pytest.raises(DecompositionError, match="HPCGPU_SIMULATE_NODES"):
            simulated_nodes(bad, 4)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_simulated_nodes_reorder_owners_not_blocks(comm, monkeypatch):
    import hpcgpu
    from hpcgpu.decomposition.nodes import header_line

    shape = (24, 10)
    plain = hpcgpu.Decomposition(comm, shape, dims=(comm.size, 1), periodic=(True, False))
    assert plain.node_layout.is_rank_order and header_line(plain) is None    # one real node
    monkeypatch.setenv("HPCGPU_SIMULATE_NODES", "2:cyclic" if comm.size >= 2 else "1")
    grid = hpcgpu.Decomposition(comm, shape, dims=(comm.size, 1), periodic=(True, False))
    # The same blocks, each owned exactly once; neighbours still symmetric.
    assert grid.dims == plain.dims
    owned = np.zeros(shape, dtype=np.int64)
    owned[grid.local_slices] += 1
    assert np.all(comm.allreduce(owned, "sum") == 1)
    assert grid.owner_of(grid.local_start) == comm.rank
    for offset, rank in grid.neighbors.items():
        back = comm.mpi.allgather(grid.neighbor(tuple(-d for d in offset)))
        assert rank is None or back[rank] == comm.rank
    if comm.size == 4:
        assert not grid.node_layout.is_rank_order
        assert grid.coords == ((0, 0), (2, 0), (1, 0), (3, 0))[comm.rank]   # node 0 = ranks 0, 2 gets blocks 0, 1
        line = header_line(grid, halo_width=1, itemsize=8)
        assert line == "2 nodes x 2 ranks: node-aware layout 4x1 (node blocks 2x1): inter-node halo 320 B/step vs 640 B naive"
        plain_again = hpcgpu.Decomposition(comm, shape, dims=(comm.size, 1), periodic=(True, False), node_aware=False)
        assert plain_again.coords == plain.coords and "rank-order layout" in header_line(plain_again)
    # Fields gathered in global order are the same whatever the owners.
    field = hpcgpu.Field(grid, hpcgpu.arch.auto(comm), halo_width=1, dtype="float64")
    field.set_from_global(lambda y, x: 100.0 * y + x)
    gathered = field.gather()
    if comm.rank == 0:
        y, x = np.indices(shape)
        assert np.array_equal(gathered, 100.0 * y + x)


def run_app(n_ranks, module_args, simulate, tmp_path):
    out = tmp_path / f"{n_ranks}-{simulate or 'plain'}".replace(":", "-")
    summary, _ = run_app_summary(n_ranks, [*module_args, "--quiet", "--no-plot"], out,
                                 env={"HPCGPU_SIMULATE_NODES": simulate or None})
    return summary["checksum"]


@pytest.mark.parametrize("n_ranks, args", [
    (2, ["apps.stencil", "--model", "jacobi", "--nx", "40", "--ny", "36", "--steps", "10"]),
    (4, ["apps.stencil", "--model", "jacobi", "--nx", "40", "--ny", "36", "--steps", "10", "--dims", "4,1"]),
    (4, ["apps.stencil", "--model", "swe", "--nx", "48", "--ny", "32", "--steps", "5", "--dims", "4,1"]),
    (4, ["apps.md", "--cells", "8", "--steps", "5", "--dims", "4,1,1"]),
])
def test_app_checksum_is_unchanged_on_simulated_nodes(n_ranks, args, tmp_path):
    plain = run_app(n_ranks, args, None, tmp_path)
    assert run_app(n_ranks, args, "2:cyclic", tmp_path) == plain
    if n_ranks == 2:
        assert run_app(n_ranks, args, "2", tmp_path) == plain


def test_the_stencil_header_names_the_inter_node_halo_traffic(tmp_path):
    """On several (here simulated) nodes the header says how many halo bytes cross nodes; on one, nothing."""
    from hpcgpu.jobs.launch import run_mpi

    command = [sys.executable, "-m", "apps.stencil", "--model", "swe", "--nx", "48", "--ny", "32", "--steps", "2",
               "--dims", "4,1", "--no-plot", "--snapshot-every", "0"]
    env = dict(os.environ, NUMBA_NUM_THREADS="1", HPCGPU_SIMULATE_NODES="2:cyclic")
    simulated = run_mpi(4, command + ["--output", str(tmp_path / "simulated")], timeout=240, env=env)
    assert simulated.returncode == 0, simulated.output[-3000:]
    lines = [line for line in simulated.output.splitlines() if line.startswith("nodes: ")]
    assert len(lines) == 1 and "inter-node halo" in lines[0] and "2 nodes x 2 ranks" in lines[0], simulated.output
    env.pop("HPCGPU_SIMULATE_NODES")
    one_node = run_mpi(4, command + ["--output", str(tmp_path / "one-node")], timeout=240, env=env)
    assert one_node.returncode == 0 and "nodes: " not in one_node.output, one_node.output[-3000:]


def test_the_md_header_names_the_inter_node_ghost_traffic(tmp_path):
    """MD on simulated nodes: the header gives the ghost bytes that cross nodes (node-aware vs naive)."""
    from hpcgpu.jobs.launch import run_mpi

    command = [sys.executable, "-m", "apps.md", "--cells", "8", "--steps", "2", "--dims", "4,1,1"]
    env = dict(os.environ, NUMBA_NUM_THREADS="1", HPCGPU_SIMULATE_NODES="2:cyclic")
    simulated = run_mpi(4, command + ["--output", str(tmp_path / "simulated")], timeout=240, env=env)
    assert simulated.returncode == 0, simulated.output[-3000:]
    lines = [line for line in simulated.output.splitlines() if line.startswith("nodes: ")]
    assert len(lines) == 1, simulated.output
    # 4 sub-boxes in a periodic ring along x, dealt cyclically over 2 nodes: the node-aware layout keeps
    # two neighbours on each node, so half the naive layout's ghost bytes cross nodes.
    assert "node-aware layout 1x1x4 (z, y, x)" in lines[0] and "vs" in lines[0], lines[0]


def test_ghost_traffic_counts_one_ghost_width_of_atoms_per_face():
    """The ghost-width grid: 4 x 4 x 4 cells of 32 atoms; 4 sub-boxes along x on 2 nodes."""
    from hpcgpu.particles.node_traffic import ghost_cells

    box, width = (13.4368,) * 3, 2.8
    assert ghost_cells(box, (4, 1, 1), width) == (4, 4, 4)
    assert ghost_cells((3.0, 30.0, 30.0), (4, 1, 1), width) == (10, 10, 4)   # at least one cell per sub-box
    nodes = np.array([[[0, 0, 1, 1]]])
    intra, inter = halo_bytes((1, 1, 4), (4, 4, 4), 1, 768, nodes, periodic=True, corners=False)
    # Faces only: each rank sends one 4 x 4-cell face each way; 2 of the 4 ring links cross nodes.
    assert (intra, inter) == (2 * 2 * 16 * 768, 2 * 2 * 16 * 768)
