"""The fused SSP-RK3 stage of the shallow-water core: one pass computes h, u and v of a region.

Semi-discrete equations on the C-grid (vector-invariant form; the metric factors of
:mod:`apps.stencil.swe_scheme.metrics` per row: ``c`` = cos_center, ``c'`` = cos_face,
``rdx``/``rdy`` the inverse spacings; all 1, 1/dx, 1/dy on the channel)::

    dh/dt = -[ delta_x(h_u u) rdx_center + delta_y(h_v v c') rdy_center ]
    du/dt = +avg_y(q * avg_x(h_v v c')) / c  - delta_x B rdx_center  + nu lap u - nu4 lap lap u
    dv/dt = -avg_x(q * avg_y(h_u u))         - delta_y B rdy         + nu lap v - nu4 lap lap v
    q     = (f + zeta) / h_q,   zeta = delta_x v rdx_face - delta_y(u c) rdy_face
    B     = g (h + h_s) + [avg_x u^2 + avg_y(v^2 c') / c] / 2

``h_u``, ``h_v``, ``h_q`` are the two- and four-point averages of h at the u, v and vorticity
points. The vorticity term is Sadourny's (1975) energy-conserving one written with the face
lengths: with the flux-form continuity and this kinetic energy it conserves total energy of the
semi-discrete system, and mass exactly, up to rounding. The v tendency is multiplied by the v-face
mask (0 on the channel walls and the zero-length pole faces), after the (hyper)viscosity.

:func:`shallow_water_stage` computes ``out = a*base + b*(stage + dt*L(stage))`` for all three
fields; the Shu-Osher SSP-RK3 step is three such stages (:data:`SSP_RK3_STAGES`)::

    s1 = u0 + dt L(u0)                            (a, b) = (0,   1)
    s2 = 3/4 u0 + 1/4 (s1 + dt L(s1))             (a, b) = (3/4, 1/4)
    u1 = 1/3 u0 + 2/3 (s2 + dt L(s2))             (a, b) = (1/3, 2/3)

On *filtered rows* (``filtered_rows[j] != 0``, the lat-lon grid's polar rows) it stores the raw
increment ``dt*L(stage)`` in ``increment`` instead and leaves ``out`` untouched; the polar filter
finishes those rows. Each cell reads ``stage`` at most ``reach`` cells away (1, or 2 with
hyperviscosity) and ``base`` only at the cell itself, so a model can update the interior while halos
are in flight and the rim after they arrive, with bitwise the same result as one whole-tile call.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.swe_scheme.metrics import GridMetrics
from hpcgpu.arch import array_module, is_device_array

SSP_RK3_STAGES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0))
"""(a, b) of the three SSP-RK3 stages in Shu-Osher form; ``base`` is the state at the step start."""


class IdentityCache:
    """Remembers which tuples of objects passed a check, by identity, with a value for each.

    The stage validates its arrays (shapes, dtypes, contiguity, aliasing) on the first call with a
    given set of array objects and skips that on later calls with the very same objects: the
    properties checked cannot change while the objects live, and the cache holds references to
    them, so an ``id`` cannot be reused by another object while cached. At most ``size`` tuples are
    kept (least recently used dropped first). The models call the same few tuples every stage,
    where the checks cost tens of microseconds per call.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._entries: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()

    def get(self, objects: tuple) -> Any:
        """The value stored with ``objects``, or None when they have not passed the check."""
        key = tuple(map(id, objects))
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def add(self, objects: tuple, value: Any) -> None:
        """Remember ``objects`` with ``value`` (call after they passed the check); returns None."""
        self._entries[tuple(map(id, objects))] = (tuple(objects), value)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def _buffer_address(array: Any) -> int:
    if is_device_array(array):
        return int(array.data.ptr)
    return int(array.__array_interface__["data"][0])


def _as_triple(name: str, fields: Sequence[Any]) -> tuple[Any, Any, Any]:
    if len(fields) != 3:
        raise ValueError(f"{name} must be the three padded fields (h, u, v); found {len(fields)} items.")
    return tuple(fields)  # type: ignore[return-value]


_VALIDATED = IdentityCache()
"""Argument tuples that passed :func:`_validate_arrays`, with the 2-D Coriolis and topography views."""


def _validate_arrays(out, base, stage, increment, metrics: GridMetrics, filtered_rows) -> None:
    shape = stage[0].shape
    if len(shape) != 2:
        raise ValueError(f"Fields must be 2D padded arrays (y, x); found shape {shape}.")
    on_gpu = is_device_array(stage[0])
    library = "cupy" if on_gpu else "numpy"
    for array in (*out, *base, *stage, *increment):
        if array.shape != shape or array.dtype != metrics.dtype or is_device_array(array) != on_gpu:
            raise ValueError(
                f"All arrays of out, base, stage (and increment) must share shape {shape}, dtype {metrics.dtype} "
                f"and array library ({library}); found shape {array.shape}, dtype {array.dtype}, "
                f"{type(array).__module__}. Allocate them alike (and build the tile parameters with the "
                f"fields' dtype and xp)."
            )
        if not array.flags.c_contiguous:
            raise ValueError("Fields must be C-contiguous padded arrays (pass Field.data, not a slice of it).")
    named = [(name, getattr(metrics, name), (shape[0],)) for name in
             ("cos_center", "rcos_center", "rdx_center", "rdy_center", "cos_face", "rdx_face", "rdy_face", "v_face_mask")]
    named.append(("coriolis", metrics.coriolis, (shape[0],) if metrics.coriolis.ndim == 1 else shape))
    if metrics.topography is not None:
        named.append(("topography", metrics.topography, shape))
    for label, array, expected in named:
        if (array.shape != expected or is_device_array(array) != on_gpu or array.dtype != metrics.dtype
                or not array.flags.c_contiguous):
            what = "one entry per padded row" if len(expected) == 1 else "one entry per padded cell"
            raise ValueError(
                f"params.{label} must have {what} {expected}, dtype {metrics.dtype}, C-contiguous, on the fields' "
                f"device ({library}); found shape {array.shape}, dtype {array.dtype} ({type(array).__module__}). "
                f"Build the tile parameters for this tile (its owned rows and halo width) with xp=<fields' xp>."
            )
    if filtered_rows.shape != (shape[0],) or is_device_array(filtered_rows) != on_gpu or filtered_rows.dtype != np.int8:
        raise ValueError(f"filtered_rows must be an int8 {library} array of shape ({shape[0]},) (one flag per padded "
                         f"row); found {filtered_rows.dtype} {filtered_rows.shape} ({type(filtered_rows).__module__}).")
    stage_addresses = {_buffer_address(a) for a in stage}
    # out may alias base (read only at the cell written) but never stage (read at neighbours).
    if any(_buffer_address(a) in stage_addresses for a in (*out, *increment)):
        raise ValueError(
            "out (and increment) must not share memory with stage: the stencil reads neighbours of stage "
            "while writing out. Use a separate buffer for the new stage."
        )


def _validate_region(shape, reach: int, region) -> tuple[int, int, int, int]:
    if len(region) != 4:
        raise ValueError(f"region must be (j0, j1, i0, i1) in padded indices; found {region!r}.")
    j0, j1, i0, i1 = (int(x) for x in region)
    n_rows, n_columns = shape
    if not (reach <= j0 <= j1 <= n_rows - reach and reach <= i0 <= i1 <= n_columns - reach):
        raise ValueError(
            f"region {(j0, j1, i0, i1)} reaches outside the padded arrays: with a stencil reach of "
            f"{reach} it must satisfy {reach} <= j0 <= j1 <= {n_rows - reach} and "
            f"{reach} <= i0 <= i1 <= {n_columns - reach}. Update only owned cells, or widen the halo."
        )
    return j0, j1, i0, i1


def _cell_views(metrics: GridMetrics, shape) -> tuple[Any, Any]:
    """Coriolis and topography as 2-D arrays of the fields' shape (stride-0 views where per row / flat)."""
    xp = array_module(metrics.coriolis)
    coriolis = metrics.coriolis
    if coriolis.ndim == 1:
        coriolis = xp.broadcast_to(coriolis[:, None], shape)
    topography = metrics.topography
    if topography is None:
        topography = xp.broadcast_to(xp.zeros((1, 1), dtype=metrics.dtype), shape)
    return coriolis, topography


def shallow_water_stage(
    out: Sequence[Any],
    base: Sequence[Any],
    stage: Sequence[Any],
    a: float,
    b: float,
    dt: float,
    metrics: GridMetrics,
    region: Sequence[int],
    increment: Sequence[Any] = (),
    filtered_rows: Any = None,
) -> None:
    """``out = a*base + b*(stage + dt*L(stage))`` over ``region``, or ``increment = dt*L`` on filtered rows.

    Parameters
    ----------
    out, base, stage : sequence of 3 arrays (h, u, v), each shape (n_rows + 2w, n_cols + 2w)
        Padded NumPy or CuPy fields (h in m, u and v in m/s), C-contiguous, one dtype and library.
        ``stage`` needs valid ghosts up to the stencil reach around ``region``. ``out`` may be
        ``base`` but must not share memory with ``stage``.
    a, b : float
        Stage weights (:data:`SSP_RK3_STAGES`).
    dt : float
        Time step in s.
    metrics : GridMetrics
        The tile's metrics (:func:`~apps.stencil.swe_scheme.metrics.channel_metrics` or
        :func:`~apps.stencil.swe_scheme.metrics.latlon_metrics`).
    region : (j0, j1, i0, i1)
        Padded-index bounds of the updated cells, ``j0 <= j < j1``, ``i0 <= i < i1``. Cells
        outside it are left untouched.
    increment : sequence of 3 arrays, optional
        Like ``out``; receives ``dt*L`` on the filtered rows. Needed with ``filtered_rows``.
    filtered_rows : int8 array, shape (n_rows + 2w,), optional
        Non-zero on the padded rows the polar filter finishes; None: no row is filtered.

    Notes
    -----
    GPU arrays run on CuPy's current stream; the call returns without synchronising. Uniform
    metrics run the channel's fast kernels, per-row metrics one thread per cell.
    """
    out, base, stage = _as_triple("out", out), _as_triple("base", base), _as_triple("stage", stage)
    if filtered_rows is None:
        filtered_rows, increment = metrics.unfiltered_rows, out  # never written: no row is filtered
    else:
        increment = _as_triple("increment", increment)
    objects = (*out, *base, *stage, *increment, metrics, filtered_rows, *metrics.arrays())
    views = _VALIDATED.get(objects)
    if views is None:
        _validate_arrays(out, base, stage, () if increment is out else increment, metrics, filtered_rows)
        views = _cell_views(metrics, stage[0].shape)
        _VALIDATED.add(objects, views)
    j0, j1, i0, i1 = _validate_region(stage[0].shape, metrics.stencil_reach, region)
    if j0 == j1 or i0 == i1:
        return
    real = metrics.dtype.type
    half, quarter, two = real(0.5), real(0.25), real(2.0)
    if is_device_array(stage[0]):
        from apps.stencil.swe_scheme import stage_gpu

        if metrics.uniform and filtered_rows is metrics.unfiltered_rows:
            scalars = (real(a), real(b), real(dt), real(metrics.gravity), real(metrics.rdx), real(metrics.rdy),
                       real(metrics.rdx2), real(metrics.rdy2), real(metrics.viscosity), real(metrics.hyperviscosity),
                       half, quarter, two)  # fmt: skip
            stage_gpu.uniform_stage_gpu(out, base, stage, metrics.coriolis, metrics.v_face_mask, scalars, (j0, j1, i0, i1))
            return
        if metrics.coriolis.ndim != 2 or metrics.topography is None or metrics.viscosity or metrics.hyperviscosity:
            raise ValueError("On the GPU, filtered rows need per-row metrics with per-corner Coriolis, a topography "
                             "array and no (hyper)viscosity (the lat-lon grid's); build them with latlon_metrics.")
        stage_gpu.row_metrics_stage_gpu(
            *out, *base, *stage, *increment, *metrics.row_arrays(), filtered_rows, metrics.coriolis,
            metrics.topography, real(a), real(b), real(dt), real(metrics.gravity), real(metrics.rdy), half, quarter,
            j0, j1, i0, i1, coriolis_by_row=metrics.coriolis_by_row, flat=metrics.flat,
        )  # fmt: skip
        return
    from apps.stencil.swe_scheme.stage_cpu import stage_cpu

    coriolis, topography = views
    stage_cpu(
        *out, *base, *stage, *increment, *metrics.row_arrays(), filtered_rows, coriolis, topography,
        real(a), real(b), real(dt), real(metrics.gravity), real(metrics.rdy), real(metrics.rdx2), real(metrics.rdy2),
        real(metrics.viscosity), real(metrics.hyperviscosity), half, quarter, two, j0, j1, i0, i1,
    )  # fmt: skip


def ssp_rk3_step(
    state: Sequence[Any],
    work_1: Sequence[Any],
    work_2: Sequence[Any],
    dt: float,
    metrics: GridMetrics,
    region: Sequence[int],
    fill_ghosts_fn: Callable[[Sequence[Any]], None],
    increment: Sequence[Any] = (),
    filtered_rows: Any = None,
    finish_stage_fn: Callable[[Sequence[Any], Sequence[Any], float, float], None] | None = None,
) -> None:
    """Advance ``state`` = (h, u, v) of one tile by one SSP-RK3 step over ``region``, in place; returns None.

    For a tile that fills its own ghosts (tests, single-rank runs); the models split each stage into
    interior and rim around their halo exchange instead (:mod:`apps.stencil.swe_scheme.model`).
    ``fill_ghosts_fn(fields)`` fills the ghosts of a triple before every stage;
    ``finish_stage_fn(out, stage, a, b)`` runs after each stage (the polar filter). ``work_1`` and
    ``work_2`` are scratch triples like ``state``; the ghosts of ``state`` are stale on return.
    """
    inputs = (state, work_1, work_2)
    outputs = (work_1, work_2, state)
    for (a, b), source, target in zip(SSP_RK3_STAGES, inputs, outputs):
        fill_ghosts_fn(source)
        # The last stage writes state, which is also base: read only at the cell being written, safe.
        shallow_water_stage(target, state, source, a, b, dt, metrics, region, increment, filtered_rows)
        if finish_stage_fn is not None:
            finish_stage_fn(target, source, a, b)


__all__ = ["SSP_RK3_STAGES", "IdentityCache", "shallow_water_stage", "ssp_rk3_step"]
