"""The beta-plane channel: one of the two grids of the shallow-water core (:mod:`apps.stencil.swe_scheme`).

The core holds the scheme (discrete equations, Numba kernel, CUDA device functions, the model's
overlapped SSP-RK3 step); this package is what only the channel has: its parameters and uniform
metrics (``TileParameters.metrics``), the beta plane, (hyper)viscosity, the walls, its initial
conditions, diagnostics and output. On GPUs the channel's uniform metrics select the core's fast
kernels (warp-marching by default).

The nonlinear shallow-water equations in vector-invariant form, periodic in x, between free-slip
walls at y = 0 and y = Ly. Every function works on *padded local arrays* -- the owned cells of one
tile plus ``w`` ghost cells on each side -- so the same code runs on one rank or as one tile of a
decomposed domain; nothing here knows about MPI. The model fills ghosts with one halo exchange
(x-periodicity, tile neighbours) whose boundary conditions are the walls
(``hpcgpu.halo.free_slip_channel_walls()``, bitwise :func:`fill_channel_boundaries`, for one-tile
code such as the tests' references), then calls :func:`swe_stage`.

Grid
----
Arrays have shape ``(n_rows + 2w, n_cols + 2w)``, axis order (y, x); global channel ``ny x nx``
cells, ``Lx = nx dx``, ``Ly = ny dy``. Index ``[j, i]`` of each array names a different point of
cell (j, i)::

        y
        ^    q[j+1,i] ---- v[j+1,i] ---- q[j+1,i+1]
        |       |                            |
        |       |                            |
        |    u[j,i]        h[j,i]        u[j,i+1]
        |       |                            |
        |       |                            |
        |    q[j,i] ------ v[j,i] ------ q[j,i+1]
        +-----------------------------------------> x

    h[j,i]   cell centre        x = (i + 1/2) dx,  y = (j + 1/2) dy     depth, m
    u[j,i]   west face          x = i dx,          y = (j + 1/2) dy     m/s
    v[j,i]   south face         x = (i + 1/2) dx,  y = j dy             m/s
    q[j,i]   south-west corner  x = i dx,          y = j dy             vorticity, Coriolis f

(global indices; padded index = global - local_start + w). ``v = 0`` on the wall faces y = 0 (the
south face of global row 0) and y = Ly (global v row ny: the first ghost row above the northern
tile's last owned row). The Coriolis parameter ``f = f0 + beta (y - Ly/2)`` is evaluated at the
corners of every padded row from global row indices (:func:`tile_parameters`).

Modules
-------
``parameters``           :class:`SWEParameters` (global), :class:`TileParameters`, :func:`tile_parameters`
``boundaries``           :func:`fill_channel_boundaries` (free-slip walls)
``stage``                :func:`swe_stage`: the core's stage with the channel's metrics (scheme documented there)
``stage_cpu/stage_gpu``  the core's kernels under the channel's argument lists (benchmarks)
``model``                :class:`~apps.stencil.channel.model.SweModel`, the core's model on the channel
``timestep``             :func:`stable_dt`, :func:`stability_rate`, :func:`check_dt`, :func:`ssp_rk3_step`
``initial_conditions``   ``jet``, ``geostrophic``, ``gaussian``, :func:`fill_initial_state`
``diagnostics``          :func:`local_diagnostics` (mass, energy, potential enstrophy)
"""

from apps.stencil.channel.boundaries import fill_channel_boundaries
from apps.stencil.channel.diagnostics import DIAGNOSTIC_NAMES, local_diagnostics
from apps.stencil.channel.initial_conditions import (
    INITIAL_CONDITIONS,
    GaussianBump,
    Jet,
    fill_initial_state,
    make_initial_condition,
    staggered_coordinates,
)
from apps.stencil.channel.parameters import SWEParameters, TileParameters, tile_parameters
from apps.stencil.channel.stage import SSP_RK3_STAGES, kernel_constants, swe_stage
from apps.stencil.channel.timestep import DEFAULT_CFL, check_dt, ssp_rk3_step, stability_rate, stable_dt

__all__ = [
    "DEFAULT_CFL",
    "DIAGNOSTIC_NAMES",
    "INITIAL_CONDITIONS",
    "SSP_RK3_STAGES",
    "GaussianBump",
    "Jet",
    "SWEParameters",
    "TileParameters",
    "check_dt",
    "fill_channel_boundaries",
    "fill_initial_state",
    "kernel_constants",
    "local_diagnostics",
    "make_initial_condition",
    "ssp_rk3_step",
    "stability_rate",
    "stable_dt",
    "staggered_coordinates",
    "swe_stage",
    "tile_parameters",
]
