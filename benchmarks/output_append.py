"""Cost of a crash-safe record: netCDF classic appends and H5MD twin-file frames, against plain appends.

Rows, each the median of ``--repeats`` records after ``--warmup`` records (one file per row, in
``--dir``, removed afterwards):

- ``netcdf classic``: :class:`hpcgpu.output.netcdf_classic.RecordFile.append` (write, fdatasync, count)
  of a record of four float32 fields of NY x NX (the stencil apps' snapshot), and without the fdatasync;
- ``h5netcdf (not crash-safe)``: the same record appended with h5netcdf and flushed, as the apps wrote
  snapshots before (a kill could destroy that file);
- ``h5md twin``: :class:`hpcgpu.output.twin_file.TwinFile` frame of N atoms (positions, velocities,
  images; written twice and read back), and ``h5md plain``: the same frame appended to an open h5py
  file and flushed (not crash-safe).

    python benchmarks/output_append.py --json output_append.json
    python benchmarks/output_append.py --grid 1800x3600 --atoms 2048000 --repeats 5

The rate column is record bytes / time: compare it with the file system's write rate (``dd`` with
``oflag=dsync``), not with memory bandwidth.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcgpu.output.netcdf_classic import RecordFile, Schema  # noqa: E402
from hpcgpu.output.twin_file import TwinFile  # noqa: E402

FIELDS = ("h", "u", "v", "zeta")


def _median_seconds(append_fn, repeats: int, warmup: int) -> float:
    times = []
    for index in range(warmup + repeats):
        started = time.perf_counter()
        append_fn(index)
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def netcdf_classic(directory: Path, ny: int, nx: int, repeats: int, warmup: int, durable: bool) -> float:
    schema = Schema()
    schema.dimensions = {"time": None, "y": ny, "x": nx}
    schema.create_variable("time", ("time",), "f8")
    for name in FIELDS:
        schema.create_variable(name, ("time", "y", "x"), "f4")
    record = {"time": 0.0, **{name: np.random.default_rng(1).random((ny, nx), dtype=np.float32) for name in FIELDS}}
    path = directory / f"classic-{durable}.nc"
    with RecordFile.create(path, schema, durable=durable) as file:
        return _median_seconds(lambda index: file.append(record), repeats, warmup)


def h5netcdf_flush(directory: Path, ny: int, nx: int, repeats: int, warmup: int) -> float | None:
    try:
        import h5netcdf
    except ImportError:
        return None
    values = np.random.default_rng(1).random((ny, nx), dtype=np.float32)
    with h5netcdf.File(directory / "h5netcdf.nc", "w") as file:
        file.dimensions = {"time": None, "y": ny, "x": nx}
        file.create_variable("time", ("time",), "f8")
        for name in FIELDS:
            file.create_variable(name, ("time", "y", "x"), "f4", chunks=(1, ny, nx))

        def append(index):
            file.resize_dimension("time", index + 1)
            file.variables["time"][index] = float(index)
            for name in FIELDS:
                file.variables[name][index, :, :] = values
            file.flush()
        return _median_seconds(append, repeats, warmup)


def _frame_datasets(handle, n_atoms):
    for name, width, dtype in (("position", 3, np.float64), ("velocity", 3, np.float64), ("image", 3, np.int32)):
        handle.create_dataset(f"{name}/value", shape=(0, n_atoms, width), maxshape=(None, n_atoms, width),
                              dtype=dtype, chunks=(1, n_atoms, width))
        handle.create_dataset(f"{name}/step", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(64,))


def _append_frame(handle, frame, step):
    for name, value in frame.items():
        n = handle[f"{name}/step"].shape[0]
        handle[f"{name}/step"].resize(n + 1, axis=0)
        handle[f"{name}/value"].resize(n + 1, axis=0)
        handle[f"{name}/step"][n] = step
        handle[f"{name}/value"][n] = value


def h5md_frames(directory: Path, n_atoms: int, repeats: int, warmup: int, twin: bool) -> float:
    import h5py

    rng = np.random.default_rng(2)
    frame = {"position": rng.random((n_atoms, 3)), "velocity": rng.random((n_atoms, 3)),
             "image": np.zeros((n_atoms, 3), np.int32)}
    path = directory / f"frames-{twin}.h5"
    if not twin:
        with h5py.File(path, "w") as handle:
            _frame_datasets(handle, n_atoms)

            def append(index):
                _append_frame(handle, frame, index)
                handle.flush()
            return _median_seconds(append, repeats, warmup)

    def define(new_path):
        with h5py.File(new_path, "w") as handle:
            _frame_datasets(handle, n_atoms)

    file = TwinFile.create(path, define)

    def write(file_path, index):
        with h5py.File(file_path, "r+") as handle:
            _append_frame(handle, frame, index)
            handle.flush()
        with h5py.File(file_path, "r") as handle:   # the read-back apps.md does
            if not np.array_equal(handle["position/value"][-1], frame["position"]):
                raise OSError("read back differs")

    seconds = _median_seconds(lambda index: file.append(lambda p: write(p, index)), repeats, warmup)
    file.remove_twin()
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="180x360", help="snapshot grid NYxNX [180x360, the default stencil run]")
    parser.add_argument("--atoms", type=int, default=32000, help="atoms per H5MD frame [32000, bench/in.lj]")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (the file system measured) "
                                                               "[a temporary directory]")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    ny, nx = (int(v) for v in args.grid.lower().split("x"))
    directory = Path(tempfile.mkdtemp(prefix="hpcgpu-output-append-", dir=args.dir))
    record_bytes = len(FIELDS) * ny * nx * 4 + 8
    frame_bytes = args.atoms * 3 * (8 + 8 + 4)
    rows = []
    try:
        for label, nbytes, fn in (
                ("netcdf classic (crash-safe, fdatasync)", record_bytes,
                 lambda: netcdf_classic(directory, ny, nx, args.repeats, args.warmup, durable=True)),
                ("netcdf classic (crash-safe, no fdatasync)", record_bytes,
                 lambda: netcdf_classic(directory, ny, nx, args.repeats, args.warmup, durable=False)),
                ("h5netcdf + flush (not crash-safe)", record_bytes,
                 lambda: h5netcdf_flush(directory, ny, nx, args.repeats, args.warmup)),
                ("h5md twin file (crash-safe)", frame_bytes,
                 lambda: h5md_frames(directory, args.atoms, args.repeats, args.warmup, twin=True)),
                ("h5md plain h5py + flush (not crash-safe)", frame_bytes,
                 lambda: h5md_frames(directory, args.atoms, args.repeats, args.warmup, twin=False))):
            seconds = fn()
            rows.append({"what": label, "record_bytes": nbytes, "seconds": seconds,
                         "mb_per_s": None if seconds is None else nbytes / seconds / 1e6})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"snapshot record: {ny} x {nx} x {len(FIELDS)} float32 = {record_bytes / 1e6:.2f} MB; "
          f"H5MD frame: {args.atoms} atoms = {frame_bytes / 1e6:.2f} MB; median of {args.repeats}")
    print(f"{'what':44s} {'ms/record':>10s} {'MB/s':>8s}")
    for row in rows:
        if row["seconds"] is None:
            print(f"{row['what']:44s} {'n/a':>10s}")
            continue
        print(f"{row['what']:44s} {row['seconds'] * 1e3:10.2f} {row['mb_per_s']:8.0f}")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                         "grid": [ny, nx], "atoms": args.atoms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
