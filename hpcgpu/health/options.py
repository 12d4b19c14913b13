"""The apps' flags for hang and straggler detection (added to every app by the common parser).

``--no-watchdog`` turns the watchdog off; ``--watchdog-startup``, ``--watchdog-step``,
``--watchdog-checkpoint`` and ``--watchdog-factor`` set its timeouts
(:class:`~hpcgpu.health.watchdog.WatchdogSettings`); ``--straggler-every``, ``--straggler-margin`` and
``--straggler-windows`` the straggler comparison (:class:`~hpcgpu.health.stragglers.StragglerDetector`).
None of them changes the model: they are left out of the checkpoints' fingerprint.
"""

from __future__ import annotations

import argparse

from hpcgpu.health.watchdog import EXIT_HANG, WatchdogSettings

#: The ``argparse`` destinations of these flags (restart-independent options).
OPTION_NAMES = frozenset({"watchdog", "watchdog_startup", "watchdog_step", "watchdog_checkpoint", "watchdog_factor",
                          "straggler_every", "straggler_margin", "straggler_windows"})


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_watchdog_arguments(parser) -> None:
    """Add the watchdog and straggler flags to an app's parser (in their own group)."""
    defaults = WatchdogSettings()
    group = parser.add_argument_group("hangs and stragglers (docs/health.md)")
    group.add_argument("--no-watchdog", dest="watchdog", action="store_false",
                       help=f"no hang detection (default: on; a hung job ends with exit {EXIT_HANG}, naming the stuck "
                            "rank and node)")
    group.add_argument("--watchdog-startup", type=_positive, default=defaults.startup_s, metavar="SECONDS",
                       help=f"timeout from the start to the end of the first step [{defaults.startup_s:g}]")
    group.add_argument("--watchdog-step", type=_positive, default=defaults.step_s, metavar="SECONDS",
                       help=f"least timeout of a step (and the operations after it) [{defaults.step_s:g}]")
    group.add_argument("--watchdog-checkpoint", type=_positive, default=defaults.checkpoint_s, metavar="SECONDS",
                       help=f"least timeout of a checkpoint [{defaults.checkpoint_s:g}]")
    group.add_argument("--watchdog-factor", type=_positive, default=defaults.factor, metavar="F",
                       help="step and checkpoint timeouts are at least F x the longest step / checkpoint measured "
                            f"so far [{defaults.factor:g}]")
    group.add_argument("--straggler-every", type=_count, default=100, metavar="N",
                       help="compare the ranks' own time per step every N steps (0: never) [100]")
    group.add_argument("--straggler-margin", type=_positive, default=0.2, metavar="F",
                       help="a rank slower than the median by more than this fraction is slow [0.2]")
    group.add_argument("--straggler-windows", type=_count, default=3, metavar="K",
                       help="... in K comparisons in a row: a straggler, named in the progress and summary [3]")


def settings_from_options(options) -> WatchdogSettings:
    """The :class:`WatchdogSettings` of parsed options (defaults for options an app does not have)."""
    defaults = WatchdogSettings()
    return WatchdogSettings(startup_s=getattr(options, "watchdog_startup", defaults.startup_s),
                            step_s=getattr(options, "watchdog_step", defaults.step_s),
                            checkpoint_s=getattr(options, "watchdog_checkpoint", defaults.checkpoint_s),
                            factor=getattr(options, "watchdog_factor", defaults.factor))
