"""Physical boundary conditions (hpcgpu.halo.boundaries) and their place in the halo fill.

References are written out layer by layer (a loop over k per side), independently of the slices the
module plans. Arrays are compared bit for bit (as unsigned integers: -0.0 != 0.0 here).
"""

import itertools

import numpy as np
import pytest

from hpcgpu.errors import ConfigurationError
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


def bits(array):
    array = np.ascontiguousarray(array)
    return array.view(np.uint64 if array.dtype.itemsize == 8 else np.uint32)


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def reference_fill(padded, axis, side, condition, w) -> None:
    """Fill one side of ``padded`` (a NumPy array) along ``axis``, one layer at a time. In place."""
    data = np.moveaxis(padded, axis, 0)   # a view: writes go to ``padded``
    n = data.shape[0] - 2 * w
    top = w + n
    staggered = getattr(condition, "staggered", False)
    if isinstance(condition, Dirichlet):
        value = data.dtype.type(condition.value)
        layers = range(0, w + 1 if staggered else w) if side == LOWER else range(top, top + w)
        for layer in layers:
            data[layer] = value
    elif isinstance(condition, ZeroGradient):
        for k in range(1, w + 1):
            if side == LOWER:
                data[w - k] = data[w]
            else:
                data[top + k - 1] = data[top - 1]
    elif not staggered:
        for k in range(1, w + 1):
            source = data[w + k - 1] if side == LOWER else data[top - k]
            data[w - k if side == LOWER else top + k - 1] = source if condition.parity == 1 else -source
    elif side == LOWER:
        for k in range(1, w + 1):
            data[w - k] = -data[w + k]
        data[w] = 0
    else:
        data[top] = 0
        for k in range(1, w):
            data[top + k] = -data[top - k]


def reference_all(padded, conditions, widths, sides) -> None:
    """Every declared side this block touches: axes in increasing order, lower before upper."""
    for (axis, side), condition in conditions.sides:
        if (axis, side) in sides:
            reference_fill(padded, axis, side, condition, widths[axis])


CONDITIONS = [Dirichlet(2.5), Dirichlet(-1.0, staggered=True), ZeroGradient(), Mirror(+1), Mirror(-1),
              Mirror(-1, staggered=True)]


# ---------------------------------------------------------------------- the channel walls
@pytest.mark.parametrize("halo_width", [1, 2, 3])
@pytest.mark.parametrize("at_south,at_north", [(True, False), (False, True), (True, True), (False, False)])
def test_channel_walls_are_bitwise_fill_channel_boundaries(halo_width, at_south, at_north):
    """free_slip_channel_walls() gives bitwise the arrays of the shallow-water model's own wall fill,
    on random padded arrays (owned rows from halo_width (the least allowed) up), float64 and float32."""
    from apps.stencil.channel.boundaries import fill_channel_boundaries

    w = halo_width
    sides = {(0, LOWER)} if at_south else set()
    sides |= {(0, UPPER)} if at_north else set()
    rng = np.random.default_rng(100 * w + 10 * at_south + at_north)
    for n_rows, n_cols, dtype in [(w, 5, "float64"), (w + 1, 7, "float64"), (9, 4, "float32"), (2 * w + 3, 11, "float64")]:
        arrays = [rng.standard_normal((n_rows + 2 * w, n_cols + 2 * w)).astype(dtype) for _ in range(3)]
        expected = [a.copy() for a in arrays]
        fill_channel_boundaries(*expected, w, at_south=at_south, at_north=at_north)
        BoundaryFill(arrays, [(w, w)] * 3, free_slip_channel_walls(), sides).apply()
        for name, got, want in zip("huv", arrays, expected):
            assert same_bits(got, want), (name, n_rows, dtype)


# ---------------------------------------------------------------------- each condition
@pytest.mark.parametrize("condition", CONDITIONS, ids=repr)
@pytest.mark.parametrize("shape,widths", [((6, 5), (1, 2)), ((5, 4), (3, 1)), ((4, 5, 6), (2, 1, 3)), ((3, 3, 4), (3, 2, 1))])
def test_each_condition_on_each_side_against_a_layer_loop(condition, shape, widths):
    """One condition on one side of one axis at a time, 2-D and 3-D, widths 1-3, float64 and float32;
    everything else (owned cells, other sides) is left exactly as it was."""
    rng = np.random.default_rng(len(shape) * 10 + sum(widths))
    for axis, side, dtype in itertools.product(range(len(shape)), (LOWER, UPPER), ("float64", "float32")):
        padded_shape = tuple(n + 2 * w for n, w in zip(shape, widths))
        array = rng.standard_normal(padded_shape).astype(dtype)
        expected = array.copy()
        reference_fill(expected, axis, side, condition, widths[axis])
        conditions = BoundaryConditions({(axis, side): condition})
        BoundaryFill([array], [widths], [conditions], {(axis, side)}).apply()
        assert same_bits(array, expected), (axis, side, dtype)
        untouched = array.copy()
        BoundaryFill([untouched], [widths], [conditions], {(axis, -side)}).apply()   # not this block's edge
        assert same_bits(untouched, array)


def test_centred_conditions_match_numpy_pad():
    """The cell-centred conditions are NumPy's pad modes: symmetric (even mirror), edge, constant."""
    rng = np.random.default_rng(3)
    owned = rng.standard_normal((5, 6))
    for w in (1, 2, 3):
        for condition, pad in [(Mirror(+1), dict(mode="symmetric")), (ZeroGradient(), dict(mode="edge")),
                               (Dirichlet(4.0), dict(mode="constant", constant_values=4.0))]:
            array = np.pad(owned, w, mode="constant", constant_values=np.nan)
            conditions = BoundaryConditions.on_axis(0, condition) | BoundaryConditions.on_axis(1, condition)
            BoundaryFill([array], [(w, w)], [conditions], {(0, LOWER), (0, UPPER), (1, LOWER), (1, UPPER)}).apply()
            assert same_bits(array, np.pad(owned, w, **pad)), (w, condition)
            odd = np.pad(owned, w, mode="constant", constant_values=np.nan)
            BoundaryFill([odd], [(w, w)], [BoundaryConditions.on_axis(1, Mirror(-1))], {(1, LOWER), (1, UPPER)}).apply()
            symmetric = np.pad(owned, ((0, 0), (w, w)), mode="symmetric")
            assert np.array_equal(odd[w:-w, :w], -symmetric[:, :w]) and np.array_equal(odd[w:-w, -w:], -symmetric[:, -w:])


def test_staggered_odd_mirror_vanishes_on_the_faces():
    """A field on the lower cell faces: 0 on both boundary faces, odd about each (v at walls)."""
    w, n = 2, 4
    faces = np.arange(1.0, n + 2 * w + 1)[:, None] * np.ones((1, 3))   # rows 1..8, face of row i at y = i - w
    BoundaryFill([faces], [(w, 1)], [BoundaryConditions.on_axis(0, Mirror(-1, staggered=True))],
                 {(0, LOWER), (0, UPPER)}).apply()
    column = faces[:, 0]
    # padded rows 0..7: face positions y = -2, -1, 0 (wall), 1, 2, 3, 4 (wall), 5
    assert column[w] == 0 and column[w + n] == 0
    assert np.array_equal(column[:w], -column[2 * w:w:-1])
    assert column[w + n + 1] == -column[w + n - 1]


def test_corners_where_two_physical_axes_meet():
    """Mirrors commute at a corner; a Dirichlet on the later axis wins the corner."""
    rng = np.random.default_rng(5)
    w = 2
    owned = rng.standard_normal((4, 5))
    array = np.pad(owned, w, mode="constant", constant_values=np.nan)
    all_sides = {(0, LOWER), (0, UPPER), (1, LOWER), (1, UPPER)}
    conditions = BoundaryConditions.on_axis(0, Mirror(-1)) | BoundaryConditions.on_axis(1, Mirror(+1))
    BoundaryFill([array], [(w, w)], [conditions], all_sides).apply()
    expected = np.pad(np.pad(owned, ((0, 0), (w, w)), mode="symmetric"), ((w, w), (0, 0)), mode="symmetric")
    expected[:w] *= -1
    expected[-w:] *= -1
    assert same_bits(array, expected)
    array = np.pad(owned, w, mode="constant", constant_values=np.nan)
    conditions = BoundaryConditions.on_axis(0, Mirror(+1)) | BoundaryConditions.on_axis(1, Dirichlet(7.0))
    BoundaryFill([array], [(w, w)], [conditions], all_sides).apply()
    assert np.all(array[:, :w] == 7.0) and np.all(array[:, -w:] == 7.0)
    assert np.array_equal(array[:w, w:-w], owned[w - 1::-1])


def test_declarations_are_checked():
    with pytest.raises(ConfigurationError, match="even mirror"):
        Mirror(+1, staggered=True)
    with pytest.raises(ConfigurationError, match="parity"):
        Mirror(0)
    with pytest.raises(ConfigurationError, match="side"):
        BoundaryConditions({(0, "left"): Mirror()})
    with pytest.raises(ConfigurationError, match="Dirichlet, ZeroGradient or Mirror"):
        BoundaryConditions({(0, "lower"): 3.0})
    with pytest.raises(ConfigurationError, match="ghost width >= 1"):
        BoundaryFill([np.zeros((6, 4))], [(1, 0)], [BoundaryConditions.on_axis(1, Mirror())], {(1, LOWER)})
    with pytest.raises(ConfigurationError, match="ghost width >= 1"):   # 1 owned row, width 2
        BoundaryFill([np.zeros((5, 4))], [(2, 0)], [BoundaryConditions.on_axis(0, Mirror())], {(0, LOWER)})
    with pytest.raises(ConfigurationError, match="one BoundaryConditions"):
        BoundaryFill([np.zeros((5, 4))], [(1, 1)], [], {(0, LOWER)})
    walls = BoundaryConditions.on_axis(0, Dirichlet(1.0))
    assert walls == BoundaryConditions({(0, "lower"): Dirichlet(1.0), (0, +1): Dirichlet(1.0)})
    assert hash(walls) == hash(BoundaryConditions.on_axis(0, Dirichlet(1.0)))
    assert not BoundaryConditions()


# ---------------------------------------------------------------------- in the halo fill, on 1-4 ranks
DISTRIBUTED_CASES = [
    # (global_shape, periodic, halo_width, corners, conditions per field)
    ((10, 9), (False, True), 2, True, free_slip_channel_walls()),
    ((10, 9), (False, True), 1, False, free_slip_channel_walls()),
    ((9, 8), (False, False), (2, 1), True,
     (BoundaryConditions.on_axis(0, Dirichlet(3.0), upper=ZeroGradient()) | BoundaryConditions.on_axis(1, Mirror(-1)),
      BoundaryConditions.on_axis(1, Mirror(-1, staggered=True)) | BoundaryConditions.on_axis(0, Mirror(+1)),
      None)),
    ((6, 7, 8), (False, True, False), (2, 1, 2), True,
     (BoundaryConditions.on_axis(0, Mirror(+1)) | BoundaryConditions.on_axis(2, Mirror(-1, staggered=True)),
      BoundaryConditions({(2, "upper"): Dirichlet(-2.0, staggered=True)}))),
]


def global_reference(global_array, periodic, widths, conditions):
    """The padded global array after an exchange with corners and the boundary fill: periodic axes
    wrapped, ghosts beyond the other edges NaN (never written by an exchange), then the conditions
    axis by axis over the whole padded array. NaN cells of the result are the ones left alone."""
    padded = np.pad(global_array, [(w, w) for w in widths], mode="wrap")
    for axis, is_periodic in enumerate(periodic):
        if not is_periodic:
            moved = np.moveaxis(padded, axis, 0)
            w, n = widths[axis], global_array.shape[axis]
            moved[:w] = np.nan
            moved[w + n:] = np.nan
    if conditions is not None:
        sides = {(axis, side) for axis in range(len(periodic)) if not periodic[axis] for side in (LOWER, UPPER)}
        reference_all(padded, conditions, widths, sides)
    return padded


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_exchange_with_boundary_conditions_matches_a_global_reference(comm):
    """Random fields, exchanged with their boundary conditions (split start / wait): every ghost of
    every block, corners included, holds what the padded global array says; the ghosts a
    faces-only exchange does not fill (inner corners) are left alone."""
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for case_index, (shape, periodic, halo, corners, conditions) in enumerate(DISTRIBUTED_CASES):
        grid = hpcgpu.Decomposition(comm, shape, periodic=periodic)
        rng = np.random.default_rng(case_index)
        fields, globals_ = [], []
        for i in range(len(conditions)):
            field = hpcgpu.Field(grid, arch, halo_width=halo, name=f"f{i}")
            field.data[...] = np.nan
            globals_.append(rng.standard_normal(shape))
            field.scatter(globals_[-1] if comm.rank == 0 else None)
            fields.append(field)
        pending = hpcgpu.exchange_halos(fields, wait=False, corners=corners, boundary_conditions=conditions)
        pending.wait()
        widths = fields[0].halo_width
        selection = tuple(slice(s, e + 2 * w) for s, e, w in zip(grid.local_start, grid.local_stop, widths))
        for field, global_array, declared in zip(fields, globals_, conditions):
            expected = global_reference(global_array, periodic, widths, declared)[selection]
            data = field.data
            if corners:
                assert same_bits(data, expected), (case_index, field.name, str(grid))
                continue
            # Faces only: the exchange leaves edge and corner ghosts between blocks alone (NaN); the
            # fill mirrors face ghosts, which are right, into the corners of the physical edges.
            faces = _face_cells(widths, grid.local_shape)
            written = ~np.isnan(data)
            assert same_bits(data[written], expected[written]), (case_index, field.name, str(grid))
            assert np.all(np.isnan(expected[faces & ~written])), (case_index, field.name, "face ghost left out")


def _face_cells(widths, local_shape):
    """Cells of the padded block that are owned or lie in a face ghost region (not an edge or corner)."""
    inside = [np.zeros(n + 2 * w, bool) for n, w in zip(local_shape, widths)]
    for flags, n, w in zip(inside, local_shape, widths):
        flags[w:w + n] = True
    ndim = len(widths)
    outside = sum((~flags).reshape([-1 if a == axis else 1 for a in range(ndim)]).astype(int)
                  for axis, flags in enumerate(inside))
    return np.broadcast_to(outside <= 1, tuple(n + 2 * w for n, w in zip(local_shape, widths)))


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_channel_exchange_with_walls_is_exchange_then_fill_channel_boundaries(comm):
    """What the shallow-water channel does today (exchange, then its wall fill with the tile's
    at_south / at_north) and one exchange with free_slip_channel_walls() give bitwise the same
    arrays on every rank, for halo widths 1-3 (the walls across y, x periodic)."""
    import hpcgpu
    from apps.stencil.channel.boundaries import fill_channel_boundaries

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for w in (1, 2, 3):
        grid = hpcgpu.Decomposition(comm, (13, 10), periodic=(False, True))
        results = []
        for with_conditions in (False, True):
            rng = np.random.default_rng(w)
            fields = [hpcgpu.Field(grid, arch, halo_width=w, name=name) for name in "huv"]
            for field in fields:
                field.data[...] = np.nan
                field.scatter(rng.standard_normal(grid.global_shape) if comm.rank == 0 else None)
            if with_conditions:
                hpcgpu.exchange_halos(fields, boundary_conditions=free_slip_channel_walls())
            else:
                hpcgpu.exchange_halos(fields)
                fill_channel_boundaries(*(f.data for f in fields), w, at_south=grid.at_lower_edge(0),
                                        at_north=grid.at_upper_edge(0))
            results.append([f.data.copy() for f in fields])
        for name, before, after in zip("huv", *results):
            assert same_bits(after, before), (w, name, str(grid))
            assert not np.any(np.isnan(after)), (w, name)


@pytest.mark.mpi(ranks=[1, 2])
def test_conditions_are_refused_on_a_periodic_axis_and_kept_per_plan(comm):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, (8, 6), periodic=(False, True))
    field = hpcgpu.Field(grid, arch, halo_width=1)
    with pytest.raises(ConfigurationError, match="periodic"):
        hpcgpu.exchange_halos(field, boundary_conditions=BoundaryConditions.on_axis(1, Mirror()))
    field.interior[...] = 1.0
    hpcgpu.exchange_halos(field)                                                     # plan 1: no conditions
    hpcgpu.exchange_halos(field, boundary_conditions=BoundaryConditions.on_axis(0, Dirichlet(5.0)))   # plan 2
    hpcgpu.exchange_halos(field, boundary_conditions=BoundaryConditions.on_axis(0, Dirichlet(5.0)))   # reused
    assert len(field._halo_plans) == 2
    if grid.at_lower_edge(0):
        assert np.all(field.data[0] == 5.0)
    if grid.at_upper_edge(0):
        assert np.all(field.data[-1] == 5.0)


# ---------------------------------------------------------------------- GPU: CuPy == NumPy, bit for bit
@pytest.mark.gpu
@pytest.mark.parametrize("condition", CONDITIONS, ids=repr)
def test_gpu_fill_is_bitwise_the_cpu_fill(condition):
    """Every condition, every side, 2-D and 3-D, widths 1-3, float64 and float32, eager and captured
    as a CUDA graph on a non-default stream: CuPy gives bitwise the NumPy arrays."""
    import cupy

    from hpcgpu.runtime.capture import capture_graph

    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(11)
    for shape, widths in [((6, 5), (1, 2)), ((4, 5, 6), (2, 1, 3)), ((3, 3, 4), (3, 2, 1))]:
        padded_shape = tuple(n + 2 * w for n, w in zip(shape, widths))
        for axis, dtype in itertools.product(range(len(shape)), ("float64", "float32")):
            conditions = BoundaryConditions.on_axis(axis, condition)
            sides = {(axis, LOWER), (axis, UPPER)}
            host = rng.standard_normal(padded_shape).astype(dtype)
            expected = host.copy()
            BoundaryFill([expected], [widths], [conditions], sides).apply()
            with stream:
                device = cupy.asarray(host)
                BoundaryFill([device], [widths], [conditions], sides).apply()
                captured = cupy.asarray(host)
                fill = BoundaryFill([captured], [widths], [conditions], sides)
                fill.apply()                                  # warm up (compile) outside the capture
                captured.set(host, stream=stream)
                graph = capture_graph(stream, fill.apply)
                graph.launch(stream)
            stream.synchronize()
            assert same_bits(cupy.asnumpy(device), expected), (shape, axis, dtype)
            assert same_bits(cupy.asnumpy(captured), expected), (shape, axis, dtype, "graph")


@pytest.mark.gpu
@pytest.mark.parametrize("halo_width", [1, 2, 3])
def test_gpu_channel_walls_are_bitwise_fill_channel_boundaries(halo_width):
    import cupy

    from apps.stencil.channel.boundaries import fill_channel_boundaries

    w = halo_width
    rng = np.random.default_rng(w)
    for at_south, at_north in itertools.product((True, False), repeat=2):
        sides = ({(0, LOWER)} if at_south else set()) | ({(0, UPPER)} if at_north else set())
        arrays = [rng.standard_normal((w + 4 + 2 * w, 9 + 2 * w)) for _ in range(3)]
        expected = [a.copy() for a in arrays]
        fill_channel_boundaries(*expected, w, at_south=at_south, at_north=at_north)
        device = [cupy.asarray(a) for a in arrays]
        BoundaryFill(device, [(w, w)] * 3, free_slip_channel_walls(), sides).apply()
        for got, want in zip(device, expected):
            assert same_bits(cupy.asnumpy(got), want), (at_south, at_north)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2])
@pytest.mark.parametrize("transport_name", ["nccl", "nccl-graph", "mpi-staged"])
def test_gpu_exchange_with_boundary_conditions_is_bitwise_the_cpu_one(comm, transport_name):
    """The distributed cases through every GPU transport: bitwise the NumPy exchange's arrays."""
    import cupy

    import hpcgpu
    from hpcgpu.transport import make_transport

    n_gpus = cupy.cuda.runtime.getDeviceCount()
    if transport_name.startswith("nccl") and comm.size > n_gpus:
        pytest.skip(f"NCCL needs one GPU per rank: {comm.size} ranks, {n_gpus} GPU(s)")
    gpu = hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=comm.size > n_gpus)
    cpu = hpcgpu.arch.CPU()
    transport = make_transport(transport_name.replace("-graph", ""), comm, gpu)
    for case_index, (shape, periodic, halo, corners, conditions) in enumerate(DISTRIBUTED_CASES):
        grid = hpcgpu.Decomposition(comm, shape, periodic=periodic)
        results = {}
        for arch in (cpu, gpu):
            rng = np.random.default_rng(case_index)
            fields = []
            for i in range(len(conditions)):
                field = hpcgpu.Field(grid, arch, halo_width=halo, name=f"f{i}")
                field.data[...] = np.nan
                field.scatter(rng.standard_normal(shape) if comm.rank == 0 else None)
                fields.append(field)
            options = dict(transport=transport, graph=transport_name.endswith("-graph")) if arch is gpu else {}
            for _ in range(2):   # the second NCCL exchange replays the graph
                hpcgpu.exchange_halos(fields, corners=corners, boundary_conditions=conditions, **options)
            arch.synchronize()
            results[arch.name] = [arch.to_host(f.data) for f in fields]
        for got, want in zip(results["gpu"], results["cpu"]):
            assert same_bits(got, want), (transport_name, case_index)
