"""A model's program: :func:`run_model` builds the command line, architecture, output and driver.

A model file ends with::

    if __name__ == "__main__":
        raise SystemExit(MyModel.main())      # the same as hpcgpu.run_model(MyModel)

and gets, from the model's class attributes (``name``, ``version``, ``default_steps``, ``options``,
the docstring's first paragraph as the description):

- the command line of every hpcgpu app (``--help``, ``--config FILE.toml``, ``--backend``, ``--steps``,
  ``--output``, ``--summary``, ``--checkpoint-every``, ``--checkpoint-dir``, ``--restart``, ``--seed``,
  ``--quiet``, ``--dims``, ``--transport``, ``--wall-time-limit`` ...) plus one flag per
  :class:`~hpcgpu.Option`, and ``--output-every`` for a :class:`~hpcgpu.FieldModel` that writes netCDF;
- the architecture and transport of the whole job (:func:`~hpcgpu.simulation.setup_architecture`);
- the model, then :meth:`FieldModel.check_step` (every stencil bound and checked);
- the output directory, created only after all of that passed;
- :class:`~hpcgpu.Simulation` with the model's operations (:meth:`FieldModel.operations`), a NaN check
  every 100 steps and CUDA graphs where the steps allow them;
- the exit codes of :mod:`hpcgpu.runtime.abort`: 0, 2 for a mistake (one ``error:`` line from rank 0,
  before anything is written), 74 for a failed write, 75 for a stop request after its checkpoint.

Options whose :class:`~hpcgpu.Option` says ``restart_may_change=True`` (and ``--output-every``) may
change on ``--restart``; every other option of the model must stay the same.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from hpcgpu.app.cli import FrozenOptions, common_parser
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.errors import ConfigurationError, replicated
from hpcgpu.simulation.driver import Simulation, setup_architecture
from hpcgpu.simulation.options import Option, check_options, description_of
from hpcgpu.simulation.triggers import Periodic

#: Steps between NaN checks of a model run by :func:`run_model`.
NAN_CHECK_EVERY = 100


def model_options(model_class) -> tuple:
    """The model's :class:`Option` declarations, with ``output_every`` for a model that writes netCDF."""
    declared = tuple(getattr(model_class, "options", ()) or ())
    every = getattr(model_class, "output_every", None)
    if every is not None and "output_every" not in {o.name for o in declared if isinstance(o, Option)}:
        declared += (Option("output_every", int, every, f"write the state to {model_class.name}.nc every N steps "
                            "(0: initial and final only)", minimum=0, restart_may_change=True),)
    return declared


def grid_axes(model_class) -> int | None:
    """Axes of the model's grid for ``--dims``: ``model_class.ndim``, else its first stencil's."""
    ndim = getattr(model_class, "ndim", None)
    if ndim is None and getattr(model_class, "stencils", ()):
        ndim = getattr(getattr(model_class.stencils[0], "definition", None), "ndim", None)
    return ndim


def program_name(model_class) -> str:
    """How ``--help`` names the program: the script's file name (``gray_scott.py``) or the module."""
    module = sys.modules.get(model_class.__module__)
    if model_class.__module__ == "__main__" and getattr(module, "__file__", None):
        return Path(module.__file__).name
    try:
        return Path(inspect.getsourcefile(model_class)).name
    except TypeError:
        return model_class.__module__


def build_parser_for(model_class):
    """``build_parser(rank)`` for :func:`hpcgpu.app.main.run_app`: the common flags and the model's own."""
    def build_parser(rank: int = 0):
        parser = common_parser(program_name(model_class), description_of(model_class), rank=rank,
                               default_steps=model_class.default_steps, version=model_class.version,
                               grid_axes=grid_axes(model_class))
        reserved = {action.dest for action in parser._actions}
        group = parser.add_argument_group("model")
        for option in check_options(model_options(model_class), reserved, model_class.__name__):
            option.add_to(group)
        return parser

    return build_parser


def run_model(model_class, argv=None) -> int:
    """Run ``model_class`` as a program: parse ``argv`` (default ``sys.argv[1:]``), build, check, run.

    Parameters
    ----------
    model_class : type
        A :class:`~hpcgpu.FieldModel` (or :class:`~hpcgpu.Model`) subclass built as
        ``model_class(comm, arch, options)``.
    argv : list of str, optional

    Returns
    -------
    int
        The exit code (0); errors end the job as described in :mod:`hpcgpu.runtime.abort`.
    """
    return run_app(model_class.name, build_parser_for(model_class), lambda options, comm: _run(model_class, options,
                                                                                               comm), argv)


def _run(model_class, options, comm) -> dict:
    config = FrozenOptions(options)
    declared = model_options(model_class)
    arch = setup_architecture(comm, config)     # --backend, --transport, --bind-cpus
    model = model_class.__new__(model_class)
    model.option_values = config                # the stencils' parameters of the same name
    model.__init__(comm, arch, config)
    if not isinstance(getattr(model, "step_index", None), int):
        raise replicated(ConfigurationError(f"{model_class.__name__}.__init__ did not call super().__init__(...)"))
    model.restart_independent_options = frozenset(model.restart_independent_options) | {
        option.name for option in declared if option.restart_may_change}
    check = getattr(model, "check_step", None)
    if check is not None:
        check()                                 # every stencil bound and checked: mistakes end the job here
    output = prepare_output(comm, arch, config)   # the first thing written: the output directory
    operations = model.operations(config) if hasattr(model, "operations") else []
    return Simulation(comm, arch, model, config, app=model_class.name, output=output, final_step=config.steps,
                      operations=operations, nan_check=Periodic(NAN_CHECK_EVERY), graph=None).run()


__all__ = ["NAN_CHECK_EVERY", "build_parser_for", "model_options", "run_model"]
