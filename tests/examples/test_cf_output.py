"""Every netCDF file an example in examples/ writes passes the CF-1.8 checker with no failure, on 1 and 2
ranks and after a restart on another rank count, and xarray decodes its time as the file declares it.

Each example runs from its command line, as a user runs it, small: of the flags in :data:`SMALL`, those
its ``--help`` lists (a grid size, how often to write) are given, with the common ``--steps``,
``--checkpoint-every`` and ``--restart``. A new example is covered without changing this file. The runs::

    whole      1 rank and 2 ranks, steps 0 ... 6          the reference files (the same variables)
    stopped    2 ranks, steps 0 ... 4, checkpoint at 4     its files pass the checker as they are
    continued  1 rank, --restart latest to step 6          its files pass and equal the whole run's on
                                                           2 ranks (global attributes included: a
                                                           file may record the ranks that created it)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import compliance_checker  # noqa: F401  (test dependencies: a missing one fails these tests, never skips them)
import netCDF4
import numpy as np
import pytest
import xarray

from hpcgpu.jobs.launch import run_command, run_mpi

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.stem for path in (ROOT / "examples").glob("*.py"))
STEPS, STOP = 6, 4   # STOP on a step that writes (every 2)
#: Flags that make an example small and write often, given when its --help lists them.
SMALL = {"--n": "12", "--nx": "36", "--ny": "18", "--output-every": "2", "--snapshot-every": "2",
         "--backend": "numpy", "--no-plot": None}
#: Global attributes that differ between two runs of the same command (the creation time).
RUN_ATTRIBUTES = ("history",)


def environment():
    return dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT), MPLBACKEND="Agg")


def small_flags(name: str) -> list[str]:
    """The flags of :data:`SMALL` that ``examples/NAME.py --help`` lists."""
    result = run_command([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--help"], 120, env=environment(),
                         cwd=str(ROOT), label=f"{name} --help")
    assert result.returncode == 0, result.output[-2000:]
    listed = set(re.findall(r"(?<![\w-])--[\w-]+", result.output))
    flags = []
    for flag, value in SMALL.items():
        if flag in listed:
            flags += [flag] if value is None else [flag, value]
    return flags


def run_example(name: str, n_ranks: int, out: Path, *args) -> None:
    result = run_mpi(n_ranks, [sys.executable, str(ROOT / "examples" / f"{name}.py"), *args, "--output", str(out),
                               "--quiet"], timeout=240, env=environment(), cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]


def netcdf_files(out: Path) -> list[str]:
    return sorted(path.name for path in out.glob("*.nc"))


def contents(path: Path) -> dict:
    """Every variable (values and attributes) and every global attribute but :data:`RUN_ATTRIBUTES`."""
    with netCDF4.Dataset(path) as dataset:
        dataset.set_auto_mask(False)
        found = {f":{name}": str(dataset.getncattr(name)) for name in dataset.ncattrs() if name not in RUN_ATTRIBUTES}
        for name, variable in dataset.variables.items():
            found[name] = (variable.dimensions, np.array(variable[:]),
                           {key: str(variable.getncattr(key)) for key in variable.ncattrs()})
    return found


def assert_same_contents(found: Path, reference: Path, global_attributes: bool = True) -> None:
    a, b = contents(found), contents(reference)
    assert a.keys() == b.keys(), f"{found.name}: {sorted(a.keys() ^ b.keys())}"
    for key in b:
        if key.startswith(":"):
            assert a[key] == b[key] or not global_attributes, f"{found.name} attribute {key}"
        else:
            assert a[key][0] == b[key][0] and a[key][2] == b[key][2], f"{found.name} variable {key}"
            np.testing.assert_array_equal(a[key][1], b[key][1], err_msg=f"{found.name} variable {key}")


def assert_time_decodes_as_declared(path: Path) -> None:
    """A time in 'UNIT since DATE' decodes to dates; any other time stays the numbers in the file, units kept."""
    with netCDF4.Dataset(path) as dataset:
        dataset.set_auto_mask(False)
        if "time" not in dataset.variables:
            return
        raw, units = np.array(dataset["time"][:]), str(dataset["time"].getncattr("units"))
    with xarray.open_dataset(path) as opened:
        time = opened["time"]
        if " since " in units:
            assert time.dtype.kind == "M" or time.dtype == object, f"{path.name}: {units!r} gave {time.dtype}"
        else:
            assert time.dtype == np.float64 and time.attrs["units"] == units, f"{path.name}: {time}"
            np.testing.assert_array_equal(time.values, raw)


def assert_cf(path: Path, tmp_path: Path) -> None:
    from tests.apps.stencil.test_output_files import cf_problems

    assert cf_problems(path, tmp_path) == [], path.name
    assert_time_decodes_as_declared(path)


@pytest.fixture(scope="module", params=EXAMPLES)
def whole(request, tmp_path_factory):
    """``(name, flags, {ranks: output directory})`` of the uninterrupted runs of one example on 1 and 2 ranks."""
    name = request.param
    flags = small_flags(name)
    outputs = {}
    for n_ranks in (1, 2):
        outputs[n_ranks] = tmp_path_factory.mktemp(f"{name}_whole_{n_ranks}")
        run_example(name, n_ranks, outputs[n_ranks], *flags, "--steps", str(STEPS))
    return name, flags, outputs


def test_every_file_of_a_run_on_1_and_2_ranks_passes_the_cf_checker(whole, tmp_path):
    _, _, outputs = whole
    files = netcdf_files(outputs[1])
    assert files == netcdf_files(outputs[2])
    for file in files:
        for n_ranks in (1, 2):
            assert_cf(outputs[n_ranks] / file, tmp_path)
        assert_same_contents(outputs[2] / file, outputs[1] / file, global_attributes=False)


def test_every_file_continued_by_a_restart_passes_and_equals_the_uninterrupted_run(whole, tmp_path):
    name, flags, outputs = whole
    checkpoints = ["--checkpoint-every", str(STOP)]
    run_example(name, 2, tmp_path, *flags, "--steps", str(STOP), *checkpoints)
    for file in netcdf_files(tmp_path):
        assert_cf(tmp_path / file, tmp_path)   # a stopped run's file
    run_example(name, 1, tmp_path, *flags, "--steps", str(STEPS), *checkpoints, "--restart", "latest")
    assert netcdf_files(tmp_path) == netcdf_files(outputs[2])
    for file in netcdf_files(tmp_path):
        assert_cf(tmp_path / file, tmp_path)
        assert_same_contents(tmp_path / file, outputs[2] / file)
