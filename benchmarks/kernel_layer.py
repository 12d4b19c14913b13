"""Speed of the kernel layer (``hpcgpu.stencil``) against hand-written kernels of the same stencils.

    python benchmarks/kernel_layer.py                                  # CPU rows; GPU rows if a GPU is there
    python benchmarks/kernel_layer.py --n2d 4096 --n3d 256 --repeats 9 --json kernel_layer.json
    python benchmarks/kernel_layer.py --backend cupy --n2d 8192 --n3d 512  # on the GPU machine

*CPU rows*: a 5-point (2D heat, ``--n2d``\\ :sup:`2`) and a 7-point (3D diffusion, ``--n3d``\\ :sup:`3`)
stencil in float64, one sweep over the owned cells of a one-rank Field (``kernel.apply``, region
``owned``) against a hand-written Numba kernel (``njit(parallel=True)``, loops over the padded array,
the same arithmetic in the same order), with one thread and with all the threads Numba has.
``--sweeps`` sweeps per timing, ``--repeats`` timings, layer and hand-written alternating; the
median of each is reported, with cell updates per second and the ratio layer / hand-written (the
target is >= 90%). The two kernels' outputs are compared bit for bit first.

*GPU rows* (CuPy and a GPU present, else reported as pending): the same stencils at ``--gpu-n2d``
(8192) and ``--gpu-n3d`` (512), float64 and float32, and Gray-Scott at ``--gpu-n2d``, timed with CUDA
events around ``--sweeps`` launches; the effective bandwidth counts one read and one write of each
field per cell, compared with the device-to-device copy bandwidth measured in the same run on the same
GPU (:func:`hpcgpu.app.plausibility.measured_copy_bandwidth`, read + write bytes; ``--copy-tbps``
overrides it); the target is >= 80%. A row above the measured copy is marked IMPLAUSIBLE (a timing
or byte-count bug, not a result) and fails the program.

Prints a table; ``--json FILE`` writes the rows with the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hpcgpu  # noqa: E402
from hpcgpu.provenance import git_commit  # noqa: E402


@hpcgpu.stencil
def five_point(u, alpha):
    return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])


@hpcgpu.stencil
def seven_point(u, alpha):
    return u[0, 0, 0] + alpha * (u[-1, 0, 0] + u[1, 0, 0] + u[0, -1, 0] + u[0, 1, 0] + u[0, 0, -1] + u[0, 0, 1]
                                 - 6 * u[0, 0, 0])


@hpcgpu.stencil
def gray_scott(u, v, feed, kill, diffusion_u, diffusion_v, dt):
    laplacian_u = u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]
    laplacian_v = v[-1, 0] + v[1, 0] + v[0, -1] + v[0, 1] - 4 * v[0, 0]
    reaction = u[0, 0] * v[0, 0] * v[0, 0]
    return (u[0, 0] + dt * (diffusion_u * laplacian_u - reaction + feed * (1 - u[0, 0])),
            v[0, 0] + dt * (diffusion_v * laplacian_v + reaction - (feed + kill) * v[0, 0]))


def hand_written():
    """The hand-written Numba kernels (what a user writes without the layer), compiled on first call."""
    from numba import njit, prange

    @njit(parallel=True)
    def five(out, u, alpha):
        n0, n1 = u.shape
        for i in prange(1, n0 - 1):
            for j in range(1, n1 - 1):
                out[i, j] = u[i, j] + alpha * ((((u[i - 1, j] + u[i + 1, j]) + u[i, j - 1]) + u[i, j + 1])
                                               - 4.0 * u[i, j])

    @njit(parallel=True)
    def seven(out, u, alpha):
        n0, n1, n2 = u.shape
        for i in prange(1, n0 - 1):
            for j in range(1, n1 - 1):
                for k in range(1, n2 - 1):
                    out[i, j, k] = u[i, j, k] + alpha * ((((((u[i - 1, j, k] + u[i + 1, j, k]) + u[i, j - 1, k])
                                                            + u[i, j + 1, k]) + u[i, j, k - 1]) + u[i, j, k + 1])
                                                          - 6.0 * u[i, j, k])

    return five, seven


def cpu_rows(args, comm):
    import numba

    arch = hpcgpu.arch.CPU("benchmark")
    five, seven = hand_written()
    cases = [("5-point 2D", five_point, five, (args.n2d, args.n2d)),
             ("7-point 3D", seven_point, seven, (args.n3d, args.n3d, args.n3d))]
    all_threads = numba.config.NUMBA_NUM_THREADS
    rows = []
    for label, kernel, hand, shape in cases:
        grid = hpcgpu.Decomposition(comm, shape, periodic=True)
        u, out = (hpcgpu.Field(grid, arch, halo_width=1, name=n) for n in ("u", "out"))
        u.data[...] = np.random.default_rng(0).random(u.data.shape)
        expected = np.empty_like(out.data)
        binding = kernel.bind(out, {"u": u})
        values = binding.parameter_values({"alpha": 0.1})
        hand(expected, u.data, 0.1)
        binding.run("owned", values)
        identical = bool(np.array_equal(out.interior, expected[out.interior_slices]))
        for threads in sorted({1, all_threads}):
            numba.set_num_threads(threads)
            layer_fn = lambda: binding.run("owned", values)   # noqa: E731
            hand_fn = lambda: hand(expected, u.data, 0.1)      # noqa: E731
            layer_fn(), hand_fn()
            times = {"layer": [], "hand": []}
            for _ in range(args.repeats):
                for name, fn in (("layer", layer_fn), ("hand", hand_fn)):
                    started = time.perf_counter()
                    for _ in range(args.sweeps):
                        fn()
                    times[name].append((time.perf_counter() - started) / args.sweeps)
            layer, handt = statistics.median(times["layer"]), statistics.median(times["hand"])
            cells = float(np.prod(shape))
            rows.append({"device": "cpu", "stencil": label, "shape": list(shape), "dtype": "float64",
                         "threads": threads, "layer_s": layer, "hand_s": handt,
                         "layer_cells_per_s": cells / layer, "hand_cells_per_s": cells / handt,
                         "layer_over_hand": handt / layer, "bitwise_equal": identical,
                         "layer_min_s": min(times["layer"]), "hand_min_s": min(times["hand"])})
    numba.set_num_threads(all_threads)
    return rows


def gpu_rows(args, comm):
    from hpcgpu.runtime.device import probe_cupy

    usable, why = probe_cupy()
    labels = [("5-point 2D", (args.gpu_n2d,) * 2), ("7-point 3D", (args.gpu_n3d,) * 3),
              ("Gray-Scott 2D", (args.gpu_n2d,) * 2)]
    if not usable or args.backend == "numpy":
        reason = "no GPU" if args.backend != "numpy" else "--backend numpy"
        return [{"device": "gpu", "stencil": label, "shape": list(shape), "dtype": dtype, "status": f"pending ({reason}: {why})"}
                for label, shape in labels for dtype in ("float64", "float32")]
    import cupy

    from hpcgpu.app.plausibility import measured_copy_bandwidth

    arch = hpcgpu.arch.auto(comm, backend="cupy")
    copy_tbps = args.copy_tbps or measured_copy_bandwidth(cupy.cuda.Device().id) / 1e12
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    device = name.decode() if isinstance(name, bytes) else str(name)
    rows = []
    for label, shape in labels:
        for dtype in ("float64", "float32"):
            grid = hpcgpu.Decomposition(comm, shape, periodic=True)
            kernel = {"5-point 2D": five_point, "7-point 3D": seven_point, "Gray-Scott 2D": gray_scott}[label]
            names = kernel.fields
            inputs = {n: hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=n) for n in names}
            outputs = [hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=f"{n}_next") for n in names]
            for field in inputs.values():
                field.data[...] = cupy.random.default_rng(0).random(field.data.shape, dtype=np.float64).astype(dtype)
            params = {"alpha": 0.1} if kernel is not gray_scott else \
                dict(feed=0.037, kill=0.06, diffusion_u=0.2, diffusion_v=0.1, dt=1.0)
            binding = kernel.bind(outputs, inputs)
            values = binding.parameter_values(params)
            binding.run("owned", values)
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            samples = []
            for _ in range(args.repeats):
                start.record()
                for _ in range(args.sweeps):
                    binding.run("owned", values)
                stop.record()
                stop.synchronize()
                samples.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / args.sweeps)
            seconds = statistics.median(samples)
            cells = float(np.prod(shape))
            bytes_moved = 2 * len(names) * np.dtype(dtype).itemsize * cells
            rows.append({"device": "gpu", "stencil": label, "shape": list(shape), "dtype": dtype, "layer_s": seconds,
                         "layer_cells_per_s": cells / seconds, "effective_tbps": bytes_moved / seconds / 1e12,
                         "copy_tbps": copy_tbps, "copy_source": "given" if args.copy_tbps else "measured",
                         "gpu": device, "rows_per_thread": binding.rows_per_thread,
                         "of_copy_bandwidth": bytes_moved / seconds / 1e12 / copy_tbps,
                         "status": "measured" if bytes_moved / seconds / 1e12 <= copy_tbps else "IMPLAUSIBLE"})
    return rows


def print_table(rows):
    print(f"{'device':<6} {'stencil':<14} {'shape':<16} {'dtype':<8} {'threads':>7} {'layer':>12} {'hand':>12} "
          f"{'layer/hand':>10} {'bits':>5}")
    for row in rows:
        shape = "x".join(map(str, row["shape"]))
        if row["device"] == "cpu":
            print(f"{'cpu':<6} {row['stencil']:<14} {shape:<16} {row['dtype']:<8} {row['threads']:>7} "
                  f"{row['layer_cells_per_s'] / 1e9:>8.3f} GLU {row['hand_cells_per_s'] / 1e9:>8.3f} GLU "
                  f"{row['layer_over_hand']:>9.1%} {'same' if row['bitwise_equal'] else 'DIFF':>5}")
        elif row["status"] in ("measured", "IMPLAUSIBLE"):
            print(f"{'gpu':<6} {row['stencil']:<14} {shape:<16} {row['dtype']:<8} {'':>7} "
                  f"{row['layer_cells_per_s'] / 1e9:>8.1f} GLU {row['effective_tbps']:>8.2f} TB/s "
                  f"{row['of_copy_bandwidth']:>9.1%} of copy ({row['copy_tbps']:.2f} TB/s {row['copy_source']}, "
                  f"{row['gpu']}){'  IMPLAUSIBLE' if row['status'] == 'IMPLAUSIBLE' else ''}")
        else:
            print(f"{'gpu':<6} {row['stencil']:<14} {shape:<16} {row['dtype']:<8} {row['status']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n2d", type=int, default=2048, help="CPU 2D grid side [2048]")
    parser.add_argument("--n3d", type=int, default=160, help="CPU 3D grid side [160]")
    parser.add_argument("--gpu-n2d", type=int, default=8192, help="GPU 2D grid side [8192]")
    parser.add_argument("--gpu-n3d", type=int, default=512, help="GPU 3D grid side [512]")
    parser.add_argument("--sweeps", type=int, default=10, help="sweeps per timing [10]")
    parser.add_argument("--repeats", type=int, default=7, help="timings per kernel [7]")
    parser.add_argument("--copy-tbps", type=float, default=None,
                        help="device copy bandwidth in TB/s to compare with [measured in this run]")
    parser.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                        help="numpy: CPU rows only; cupy: GPU rows required [auto]")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    args = parser.parse_args(argv)
    comm = hpcgpu.Communicator()
    rows = cpu_rows(args, comm) if args.backend != "cupy" else []
    rows += gpu_rows(args, comm)
    print_table(rows)
    if args.json:
        record = {"benchmark": "kernel_layer", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "git_commit": git_commit(), "machine": platform.node(), "cpu": platform.processor(),
                  "cpus": len(os.sched_getaffinity(0)), "command": " ".join(sys.argv), "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 1 if any(row.get("status") == "IMPLAUSIBLE" for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
