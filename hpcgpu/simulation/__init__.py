"""The simulation driver: hpcgpu owns the run loop, an app brings its model.

- :mod:`hpcgpu.simulation.model`      -- :class:`Model`, the interface a model implements
- :mod:`hpcgpu.simulation.field_model` -- :class:`FieldModel`, a Model over ping-pong Fields advanced by stencils
- :mod:`hpcgpu.simulation.options`    -- :class:`Option`, a model's own option declared once
- :mod:`hpcgpu.simulation.program`    -- :func:`run_model`, a model as a program (command line, output, driver)
- :mod:`hpcgpu.simulation.triggers`   -- when operations act (:class:`Periodic`, :class:`AtEnd` ...)
- :mod:`hpcgpu.simulation.operations` -- NaN check, model output, progress, checkpoints
- :mod:`hpcgpu.simulation.netcdf_output` -- :class:`NetCDFOutput`, any model's fields as CF netCDF records
- :mod:`hpcgpu.simulation.driver`     -- :class:`Simulation`, the one run loop

See ``docs/architecture.md`` for the loop order and ``docs/user-guide.md`` for a model built step by step.
"""

from hpcgpu.simulation.driver import Simulation, nccl_channel_limit, setup_architecture, use_graphs
from hpcgpu.simulation.field_model import CurrentField, FieldModel
from hpcgpu.simulation.model import Model
from hpcgpu.simulation.operations import Operation, check_finite
from hpcgpu.simulation.options import Option
from hpcgpu.simulation.program import run_model
from hpcgpu.simulation.triggers import AtEnd, Periodic, Trigger

__all__ = ["AtEnd", "CurrentField", "FieldModel", "Model", "Operation", "Option", "Periodic", "Simulation", "Trigger", "check_finite",
           "nccl_channel_limit", "run_model", "setup_architecture", "use_graphs"]
