"""The latitude-longitude sphere (``--grid latlon``): one of the two grids of the shallow-water core.

The core (:mod:`apps.stencil.swe_scheme`) holds the scheme -- vector-invariant equations with
Sadourny's energy-conserving vorticity term and flux-form continuity on an Arakawa C-grid, SSP-RK3,
one Numba kernel and one set of CUDA device functions, the model's overlapped step. This package is
what only the sphere has: its metrics (cos(latitude) factors, f per corner, topography; no point at
a pole, v = 0 on the zero-length pole faces), a Fourier polar filter poleward of a cutoff latitude
(whole latitude circles gathered in row communicators; its rows take the stage's increment path),
and the Williamson et al. (1992) test cases 2, 5 and 6. Earth constants a = 6.37122e6 m,
Omega = 7.292e-5 1/s, g = 9.80616 m/s^2. Like :mod:`apps.stencil.channel`, every numerical function works
on padded local arrays of one tile; :class:`apps.stencil.sphere.model.LatLonModel` adds MPI.

Modules
-------
``parameters``          :class:`SphereParameters`, :class:`SphereTile`, :func:`tile_parameters` (grid, metrics)
``stage``               :func:`sphere_stage`: the core's stage with the lat-lon metrics and the filtered rows
``polar_filter``        :func:`damping_factors`, :func:`make_filter_plan`, :func:`filter_and_combine`
``polar_filter_gpu``    the filter on the device (cuFFT, whole circles) or staged through the host (split rows)
``timestep``            :func:`stability_rate` (CFL at the cutoff), one-tile :func:`ssp_rk3_step`
``initial_conditions``  ``williamson2/5/6``, :func:`make_initial_condition`, :func:`initial_owned_state`
``diagnostics``         mass, energy, potential enstrophy; Williamson l1/l2/linf errors
``model``               :class:`LatLonModel` (the app-level model, same interface as ``SweModel``; CPU or GPU)
``output``              CF-1.8 netCDF snapshots (lat/lon coordinates) and PNG maps of h and vorticity
"""

from apps.stencil.sphere.diagnostics import DIAGNOSTIC_NAMES, error_norms, local_diagnostics, local_error_sums
from apps.stencil.sphere.initial_conditions import (
    INITIAL_CONDITIONS,
    InitialCondition,
    initial_owned_state,
    make_initial_condition,
)
from apps.stencil.sphere.parameters import SphereParameters, SphereTile, tile_parameters
from apps.stencil.sphere.polar_filter import (
    damping_factors,
    filter_and_combine,
    filter_circles,
    local_gather,
    make_filter_plan,
    row_gather,
)
from apps.stencil.sphere.stage import SSP_RK3_STAGES, sphere_stage
from apps.stencil.sphere.timestep import DEFAULT_CFL, ssp_rk3_step, stability_rate

__all__ = [
    "DEFAULT_CFL", "DIAGNOSTIC_NAMES", "INITIAL_CONDITIONS", "SSP_RK3_STAGES", "InitialCondition",
    "SphereParameters", "SphereTile", "damping_factors", "error_norms", "filter_and_combine", "filter_circles",
    "initial_owned_state", "local_diagnostics", "local_error_sums", "local_gather", "make_filter_plan",
    "make_initial_condition", "row_gather", "sphere_stage", "ssp_rk3_step", "stability_rate", "tile_parameters",
]  # fmt: skip
