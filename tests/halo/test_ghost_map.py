"""The composed ghost fill (hpcgpu.halo.ghost_map): one gather, bitwise the sequence it replaces."""

import itertools

import numpy as np
import pytest

from hpcgpu.halo.boundaries import (
    LOWER,
    UPPER,
    BoundaryConditions,
    BoundaryFill,
    Dirichlet,
    Mirror,
    ZeroGradient,
    free_slip_channel_walls,
)
from hpcgpu.halo.ghost_map import GhostMap, SymbolicBuffer

CONDITIONS = [Dirichlet(2.5), Dirichlet(-1.0, staggered=True), ZeroGradient(), Mirror(+1), Mirror(-1),
              Mirror(-1, staggered=True)]


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def awkward_values(shape, dtype, seed):
    """Random values with the bit patterns a fill must move unchanged: -0.0, inf, NaN."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    flat = values.reshape(-1)
    flat[::7], flat[3::11], flat[5::13] = -0.0, np.inf, np.nan
    return values


def run_one_by_one(fill: BoundaryFill) -> None:
    saved, fill.ghost_map = fill.ghost_map, None
    try:
        fill.apply()
    finally:
        fill.ghost_map = saved


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_composed_boundary_fill_is_bitwise_the_fills_one_by_one(dtype):
    """Every pair of conditions on two axes (corners where they meet), widths 1-3, 2-D and 3-D."""
    for shape, widths in [((5, 6), (1, 2)), ((4, 7), (3, 1)), ((3, 4, 5), (2, 1, 2))]:
        padded = tuple(n + 2 * w for n, w in zip(shape, widths))
        sides = {(axis, side) for axis in range(len(shape)) for side in (LOWER, UPPER)}
        for case, (first, second) in enumerate(itertools.product(CONDITIONS, repeat=2)):
            declared = BoundaryConditions({(0, LOWER): first, (0, UPPER): second,
                                           (1, LOWER): second, (1, UPPER): first})
            values = awkward_values(padded, dtype, case)
            composed, sequential = values.copy(), values.copy()
            fill = BoundaryFill([composed], [widths], [declared], sides)
            assert fill.ghost_map is not None, (first, second)
            fill.apply()
            run_one_by_one(BoundaryFill([sequential], [widths], [declared], sides))
            assert same_bits(composed, sequential), (shape, first, second)


def test_a_fill_that_reads_what_it_writes_is_not_composed():
    """a[0] <- a[1], then a[1] <- -a[0]: a gather cannot do both at once, so compose says no."""
    symbols = [SymbolicBuffer(4, np.float64, first_id=0)]
    symbols[0].assign(np.array([0]), symbols[0], np.array([1]), negate=False)
    symbols[0].assign(np.array([1]), symbols[0], np.array([0]), negate=True)
    assert GhostMap.compose([np.zeros(4)], symbols, 4) is None
    symbols = [SymbolicBuffer(4, np.float64, first_id=0)]
    symbols[0].assign(np.array([0]), symbols[0], np.array([1]), negate=True)
    symbols[0].assign(np.array([3]), symbols[0], np.array([0]), negate=True)   # -(-a[1]): a copy of a[1]
    ghost_map = GhostMap.compose([np.zeros(4)], symbols, 4)
    values = np.array([1.0, 2.0, 3.0, 4.0])
    ghost_map.arrays[0][...] = values
    ghost_map.apply()
    assert ghost_map.arrays[0].tolist() == [-2.0, 2.0, 3.0, 2.0]


def test_a_strided_view_is_filled_one_by_one_not_through_a_flat_copy():
    """A fill of a non-contiguous view (a flat index would address a copy of it) runs slice by slice."""
    parent = np.arange(8 * 14, dtype=np.float64).reshape(8, 14)
    view = parent[:, ::2]
    fill = BoundaryFill([view], [(1, 1)], [BoundaryConditions.on_axis(0, Mirror(-1))], {(0, LOWER), (0, UPPER)})
    assert fill.ghost_map is None
    fill.apply()
    assert np.array_equal(parent[0, ::2], -parent[1, ::2]) and np.array_equal(parent[7, ::2], -parent[6, ::2])


def test_integer_fields_compose_copies_but_not_negations():
    arrays = [np.arange(30, dtype=np.int64).reshape(5, 6)]
    even = BoundaryFill(arrays, [(1, 1)], [BoundaryConditions.on_axis(0, Mirror(+1))], {(0, LOWER), (0, UPPER)})
    odd = BoundaryFill(arrays, [(1, 1)], [BoundaryConditions.on_axis(0, Mirror(-1))], {(0, LOWER), (0, UPPER)})
    assert even.ghost_map is not None and odd.ghost_map is None


@pytest.mark.mpi(ranks=[1, 2])
def test_one_rank_exchange_is_one_local_gather_bitwise_the_transport_path(comm):
    """Periodic and walled axes, corners or faces, one field (direct rows) or three, with and
    without boundary conditions: the local gather equals pack / copy / unpack / fills run one by
    one through the transport. With two ranks the split axis has remote neighbours: no local map."""
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    cases = [((9, 11), (False, True), 2, None, 3, free_slip_channel_walls()),
             ((9, 11), (True, True), (1, 0), (0, 1), 1, None),
             ((7, 8), (True, False), 3, None, 2, [BoundaryConditions.on_axis(1, Dirichlet(4.0)), None]),
             ((5, 6, 7), (False, True, False), 1, None, 1,
              [BoundaryConditions({(0, LOWER): Mirror(-1, staggered=True), (2, UPPER): ZeroGradient()})]),
             ((6, 5, 4), (True, True, True), 2, None, 2, None)]
    for index, (shape, periodic, halo, dims, n_fields, conditions) in enumerate(cases):
        grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=periodic)
        for corners in (True, False):
            results = []
            for composed in (True, False):
                fields = [hpcgpu.Field(grid, arch, halo_width=halo, name=f"f{k}") for k in range(n_fields)]
                for k, field in enumerate(fields):
                    field.data[...] = awkward_values(field.data.shape, "float64", 100 * index + k + comm.rank)
                plan = hpcgpu.HaloExchange(fields, corners=corners, boundary_conditions=conditions)
                remote = any(grid.neighbor(d) not in (None, comm.rank)
                             for d in itertools.product((-1, 0, 1), repeat=len(shape)) if any(d))
                assert (plan.local_map is not None) == (not remote), (index, comm.size)
                if not composed:
                    plan.local_map = None
                pending = plan.start()
                assert pending.is_local == (composed and not remote)
                pending.wait()
                results.append([f.data.copy() for f in fields])
            for got, want in zip(*results):
                assert same_bits(got, want), (index, corners)


# ---------------------------------------------------------------------- GPU: the gather kernel
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_gpu_gather_is_bitwise_the_cpu_gather_eager_and_captured(dtype):
    """Two arrays, every condition on two axes: the kernel (eager, and replayed from a CUDA graph
    on a non-default stream) writes bitwise what NumPy writes, NaN payloads and -0.0 included."""
    import cupy

    from hpcgpu.runtime.capture import capture_graph

    stream = cupy.cuda.Stream(non_blocking=True)
    shape, widths = (6, 9), (2, 3)
    padded = tuple(n + 2 * w for n, w in zip(shape, widths))
    sides = {(axis, side) for axis in range(2) for side in (LOWER, UPPER)}
    for case, (first, second) in enumerate(itertools.product(CONDITIONS, repeat=2)):
        declared = [BoundaryConditions({(0, LOWER): first, (0, UPPER): second, (1, LOWER): second,
                                        (1, UPPER): first}), BoundaryConditions.on_axis(0, second)]
        host = [awkward_values(padded, dtype, case), awkward_values(padded, dtype, case + 99)]
        expected = [a.copy() for a in host]
        BoundaryFill(expected, [widths] * 2, declared, sides).apply()
        with stream:
            device = [cupy.asarray(a) for a in host]
            fill = BoundaryFill(device, [widths] * 2, declared, sides)
            assert fill.ghost_map is not None and fill.ghost_map.on_gpu
            fill.apply()
            stream.synchronize()
            assert all(same_bits(cupy.asnumpy(d), e) for d, e in zip(device, expected)), (first, second)
            for d, a in zip(device, host):
                d.set(a, stream=stream)
            graph = capture_graph(stream, fill.apply)
            graph.launch(stream)
        stream.synchronize()
        assert all(same_bits(cupy.asnumpy(d), e) for d, e in zip(device, expected)), (first, second, "graph")
