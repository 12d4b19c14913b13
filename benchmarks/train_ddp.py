"""Data-parallel training throughput: hpcgpu (CuPy + NCCL) side by side with PyTorch DDP.

The same large MLP (``Linear(n_in, W)``, ``depth`` x ``[LayerNorm, GELU(tanh), Linear(W, W)]``,
``GELU, Linear(W, classes)``; 143M parameters by default), the same per-GPU batch of synthetic data
and the same optimiser (AdamW), at fp32 and fp16:

* hpcgpu fp16 = fp16 compute copy, fp32 master weights, dynamic loss scaling, fp16 gradients
  allreduced in 25 MB buckets during backward; hpcgpu bf16 = the same in bf16 without loss scaling;
* PyTorch ``fp32`` = plain fp32 (TF32 off, as CuPy's GEMMs); ``fp16`` = ``torch.autocast(float16)`` +
  ``GradScaler`` (fp32 weights; DDP allreduces fp32 gradients in 25 MB buckets during backward),
  PyTorch's standard mixed-precision recipe; ``bf16`` = ``torch.autocast(bfloat16)``, no scaler;
  ``fp16-pure`` = the like-for-like of ours: the model in fp16 (DDP allreduces fp16 gradients),
  fp32 master weights under the fused AdamW, a loss scale of 2^12 (apex's "O2" recipe, by hand);
* framework ``torch-compile`` = the same PyTorch runs with ``torch.compile`` of the model (the
  compilation happens in the warm-up steps and is not timed).

The pairings printed last: ours at fp32 / bf16 / fp16 against PyTorch at the same name, and ours
fp16 against PyTorch ``fp16-pure`` (ours runs once per precision; ``fp16-pure`` reuses its fp16 run).

Both loops read the loss on the host every step (``float(loss)`` / ``loss.item()``), so they
synchronise alike. Per configuration: warm-up steps, then timed steps -> samples/s (global);
then the same steps without communication (hpcgpu: one-process sync; PyTorch: ``no_sync()``)
-> the exposed communication cost per step = t(step) - t(no comm); and the bucketed allreduce
of the whole gradient buffer alone. Hidden fraction = 1 - exposed / alone. hpcgpu also reports
its own CUDA-event measurement (time the compute stream waited for the last bucket).

Run (one rank per GPU; torch.distributed is initialised from MPI, no torchrun)::

    mpirun -np 1 python3 benchmarks/train_ddp.py --json train_ddp_1gpu.json
    mpirun -np 2 python3 benchmarks/train_ddp.py --json train_ddp_2gpu.json
    mpirun -np 2 python3 benchmarks/train_ddp.py --frameworks hpcgpu --allreduce peer   # copy engines
    mpirun -np 1 python3 benchmarks/train_ddp.py --precisions fp32,bf16,fp16,fp16-pure \
        --frameworks hpcgpu,torch,torch-compile                                          # every pairing

A part that fails (PyTorch missing, out of memory, ...) is reported in the table and the JSON
and the other parts still run. Takes about a minute on H200s with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=8, help="hidden blocks [8]")
    parser.add_argument("--width", type=int, default=4096, help="hidden width [4096]")
    parser.add_argument("--inputs", type=int, default=1024, help="input features [1024]")
    parser.add_argument("--classes", type=int, default=1000, help="classes [1000]")
    parser.add_argument("--batch-per-gpu", type=int, default=2048, help="samples per GPU per step [2048]")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per measurement [15]")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first [3]")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="allreduce bucket size, both frameworks [25]")
    parser.add_argument("--nccl-channels", type=int, default=0, metavar="N",
                        help="hpcgpu: at most N NCCL channels for its communicator (NCCL_MAX_NCHANNELS around "
                             "its creation); 0 = NCCL's default. Measure PyTorch in a separate process then "
                             "(NCCL may keep the setting for the whole process) [0]")
    parser.add_argument("--allreduce", choices=("nccl", "peer"), default="nccl",
                        help="hpcgpu's gradient bucket sum: NCCL allreduce, or peer: copy-engine copies between "
                             "CUDA-IPC-mapped buffers plus one add kernel (2 GPUs of one node; one rank runs "
                             "nccl, which has nothing to reduce) [nccl]")
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="with several ranks: R pairs of timed runs, data-parallel and the same "
                             "steps without communication, alternately first (each rank alone: a one-GPU run on the same GPUs at the "
                             "same moment); reports each pair's scaling efficiency t(alone) / t(data-parallel) and "
                             "their median, immune to the host's drift between separate jobs [1]")
    parser.add_argument("--clocks", action="store_true",
                        help="sample this rank's GPU (NVML, every 20 ms) during the in-process pairs: mean SM "
                             "clock, power and how often the power cap held the clocks, with and without "
                             "communication (needs nvidia-ml-py)")
    parser.add_argument("--precisions", default="fp32,fp16",
                        help="comma-separated: fp32, bf16, fp16, fp16-pure (PyTorch only; ours runs fp16) [fp32,fp16]")
    parser.add_argument("--frameworks", default="hpcgpu,torch",
                        help="comma-separated: hpcgpu, torch, torch-compile [hpcgpu,torch]")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    parser.add_argument("--backend", choices=("cupy", "numpy"), default="cupy",
                        help="numpy: a CPU smoke test of this script (use a tiny --width) [cupy]")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------ clocks
class PhaseClocks:
    """``--clocks``: NVML samples of this rank's GPU every ``interval`` s, filed under the phase running
    (``phase`` is set by the timing loop; None files nothing). Mean SM clock, power and the fraction of
    samples with each clock-event reason, per phase."""

    def __init__(self, arch, interval=0.02):
        import threading

        import pynvml

        self.nvml, self.phase, self.samples = pynvml, None, {}
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(arch.identity.pci_bus_id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def _loop(self, interval):
        nvml, handle = self.nvml, self.handle
        while not self._stop.wait(interval):
            phase = self.phase
            if phase is None:
                continue
            try:
                clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
                power = nvml.nvmlDeviceGetPowerUsage(handle) * 1e-3
                reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except Exception:   # noqa: BLE001 - a missed sample
                continue
            self.samples.setdefault(phase, []).append((clock, power, reasons))

    def summary(self):
        from hpcgpu.observe.nvml_sample import decode_throttle_reasons

        self._stop.set()
        self._thread.join(timeout=5)
        table = {}
        for phase, rows in self.samples.items():
            reasons = {}
            for *_, mask in rows:
                for name in decode_throttle_reasons(mask):
                    reasons[name] = reasons.get(name, 0) + 1 / len(rows)
            table[phase] = {"n": len(rows), "sm_clock_mhz": float(np.mean([r[0] for r in rows])),
                            "power_w": float(np.mean([r[1] for r in rows])),
                            "reasons": {k: round(v, 3) for k, v in sorted(reasons.items())}}
        return table


def _set_phase(clocks, phase):
    if clocks is not None:
        clocks.phase = phase


# ------------------------------------------------------------------------------------------ hpcgpu
def run_hpcgpu(comm, arch, options, precision):
    from apps.train.parallel.distributed import DataParallel, create_nccl_communicator
    from apps.train.nn.models import large_mlp
    from apps.train.training.trainer import LocalSync, TrainConfig, Trainer, init_train_state, train_step

    batch = options.batch_per_gpu
    config = TrainConfig(optimizer="adamw", lr=1e-4, weight_decay=0.01, precision=precision,
                         global_batch_size=batch * comm.size, init_loss_scale=2.0**12, seed=0)
    model = large_mlp(options.inputs, options.classes, options.depth, options.width)
    trainer = Trainer(model, config)
    # one rank reduces nothing: --allreduce peer (exactly 2 ranks) falls back to the no-op path there
    allreduce = options.allreduce if comm.size > 1 else "nccl"
    if allreduce == "nccl":
        create_nccl_communicator(comm, arch, options.nccl_channels)   # no-op once it exists
    sync = DataParallel(comm, arch, options.bucket_mb, allreduce=allreduce)
    xp = arch.xp
    state = init_train_state(trainer, xp, sync)
    rng = np.random.default_rng(comm.rank)
    x = xp.asarray(rng.standard_normal((batch, options.inputs), dtype=np.float32))
    y = xp.asarray(rng.integers(0, options.classes, size=batch).astype(np.int64))
    index = xp.arange(comm.rank * batch, (comm.rank + 1) * batch, dtype=xp.int64)

    clocks = PhaseClocks(arch) if options.clocks and comm.size > 1 else None

    def timed(step_sync, n_steps, phase=None):
        comm.barrier()
        arch.synchronize()
        _set_phase(clocks, phase)
        started = time.perf_counter()
        for _ in range(n_steps):
            metrics = train_step(trainer, state, x, y, index, step_sync)
        arch.synchronize()
        _set_phase(clocks, None)
        return (time.perf_counter() - started) / n_steps, metrics

    timed(sync, options.warmup)
    seconds, metrics = timed(sync, options.steps)
    result = {"step_ms": 1e3 * seconds, "samples_per_second": batch * comm.size / seconds,
              "n_params": model.n_params, "final_loss": metrics.loss,
              "applied_last_step": bool(metrics.applied), "nccl_channels": options.nccl_channels,
              "allreduce": allreduce}
    if comm.size > 1:
        alone = sync.measure_allreduce_alone()
        stats = sync.overlap_stats()
        local_seconds, _ = timed(LocalSync(), options.steps)
        pairs = [(seconds, local_seconds)]
        for number in range(1, options.rounds):
            pairs.append(_pair(lambda: timed(sync, options.steps, "comm")[0],
                               lambda: timed(LocalSync(), options.steps, "local")[0], number))
        if len(pairs) > 1:
            efficiencies = [local / together for together, local in pairs]
            result.update(round_efficiencies=efficiencies, median_efficiency=float(np.median(efficiencies)),
                          round_step_ms=[[1e3 * t for t in pair] for pair in pairs])
        exposed = max(0.0, seconds - local_seconds)
        result.update(
            step_without_comm_ms=1e3 * local_seconds, allreduce_alone_ms=1e3 * alone,
            exposed_ms=1e3 * exposed, hidden_fraction=_hidden(exposed, alone),
            events_exposed_wait_ms=stats["exposed_wait_ms"], events_backward_ms=stats["backward_ms"],
            events_allreduce_busy_ms=stats.get("allreduce_busy_ms"),
            events_hidden_fraction=stats["hidden_fraction"], buckets=stats["buckets"])
        if clocks is not None:
            result["clocks"] = comm.mpi.allgather(clocks.summary())
    return result   # the arrays are freed on return; the driver then empties CuPy's pool


def _pair(together, alone, number):
    """(t data-parallel, t alone) of round ``number``: odd rounds time the communication-free run first, so
    a drift of the host's speed over a pair (clocks under the power cap) does not always favour one side."""
    if number % 2:
        seconds_alone = alone()
        return together(), seconds_alone
    seconds_together = together()
    return seconds_together, alone()


def _hidden(exposed, alone):
    return None if not alone else float(min(1.0, max(0.0, 1.0 - exposed / alone)))


# ------------------------------------------------------------------------------------------ torch
_TORCH_GROUP = {}


def torch_group(comm, device_id):
    """Initialise torch.distributed (NCCL) from the MPI job, once."""
    import torch
    import torch.distributed as dist

    if "ready" in _TORCH_GROUP:
        return
    torch.cuda.set_device(device_id)
    if comm.rank == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        address = (socket.gethostbyname(socket.gethostname()) if comm.n_nodes > 1 else "127.0.0.1", port)
    else:
        address = None
    host, port = comm.mpi.bcast(address, root=0)
    arguments = dict(backend="nccl", init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size)
    try:   # device_id (PyTorch >= 2.3) binds the NCCL communicator to this GPU eagerly
        dist.init_process_group(**arguments, device_id=torch.device("cuda", device_id))
    except TypeError:
        dist.init_process_group(**arguments)
    _TORCH_GROUP["ready"] = True


def run_torch(comm, arch, options, precision, compiled=False):
    import torch
    import torch.distributed as dist
    from torch import nn

    if not arch.is_gpu:
        raise RuntimeError("the PyTorch DDP part needs GPUs (NCCL); run with --backend cupy")
    torch_group(comm, arch.device_id)
    device = torch.device("cuda", arch.device_id)
    allow_tf32_default = torch.backends.cuda.matmul.allow_tf32   # False since PyTorch 1.12
    torch.backends.cuda.matmul.allow_tf32 = False    # the CuPy side uses plain fp32 GEMMs too
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    layers = [nn.Linear(options.inputs, options.width)]
    for _ in range(options.depth):
        layers += [nn.LayerNorm(options.width), nn.GELU(approximate="tanh"), nn.Linear(options.width, options.width)]
    layers += [nn.GELU(approximate="tanh"), nn.Linear(options.width, options.classes)]
    model = nn.Sequential(*layers).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if precision == "fp16-pure":
        model = model.half()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[arch.device_id],
                                              bucket_cap_mb=options.bucket_mb * 1e6 / 2**20)
    network = torch.compile(ddp) if compiled else ddp
    params = list(model.parameters())
    # fp16-pure: the optimiser updates fp32 masters; the fp16 model is their compute copy.
    masters = [p.detach().float().clone().requires_grad_(True) for p in params] if precision == "fp16-pure" else params
    try:
        optimizer = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.01, fused=True)
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.01)
    loss_scale = 2.0**12

    def pure_fp16_step(communicate):
        for p in params:
            p.grad = None
        loss = loss_fn(network(x.half()).float(), y)
        if communicate:
            (loss * loss_scale).backward()
        else:
            with ddp.no_sync():
                (loss * loss_scale).backward()
        grads = [p.grad.float() for p in params]
        torch._foreach_mul_(grads, 1.0 / loss_scale)
        for master, grad in zip(masters, grads):
            master.grad = grad
        optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(params, masters)
        return loss.item()
    if precision not in ("fp32", "fp16", "bf16", "fp16-pure"):
        raise ValueError(f"unknown precision {precision!r} for PyTorch (fp32, bf16, fp16, fp16-pure)")
    autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12, enabled=precision == "fp16")
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator(device=device).manual_seed(comm.rank)
    batch = options.batch_per_gpu
    x = torch.randn(batch, options.inputs, device=device, generator=generator)
    y = torch.randint(0, options.classes, (batch,), device=device, generator=generator)

    def step(communicate):
        if precision == "fp16-pure":
            return pure_fp16_step(communicate)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None):
            loss = loss_fn(network(x), y)
        if communicate:
            scaler.scale(loss).backward()
        else:
            with ddp.no_sync():
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    clocks = PhaseClocks(arch) if options.clocks and comm.size > 1 else None

    def timed(communicate, n_steps, phase=None):
        comm.barrier()
        torch.cuda.synchronize()
        _set_phase(clocks, phase)
        started = time.perf_counter()
        for _ in range(n_steps):
            loss = step(communicate)
        torch.cuda.synchronize()
        _set_phase(clocks, None)
        return (time.perf_counter() - started) / n_steps, loss

    timed(True, options.warmup)
    seconds, loss = timed(True, options.steps)
    result = {"step_ms": 1e3 * seconds, "samples_per_second": batch * comm.size / seconds,
              "n_params": n_params, "final_loss": loss, "allow_tf32_default": allow_tf32_default}
    if comm.size > 1:
        local_seconds, _ = timed(False, options.steps)
        # DDP reduces gradients in the parameters' dtype: fp32 (autocast keeps fp32 weights), fp16 for fp16-pure
        grads = torch.zeros(n_params, device=device, dtype=torch.float16 if precision == "fp16-pure" else torch.float32)
        per_bucket = max(1, int(options.bucket_mb * 1e6) // grads.element_size())
        rounds = []
        for _ in range(6):
            comm.barrier()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for lo in range(0, n_params, per_bucket):
                dist.all_reduce(grads[lo:lo + per_bucket])
            torch.cuda.synchronize()
            rounds.append(time.perf_counter() - started)
        alone = comm.allreduce(float(np.median(rounds[1:])), op="max")
        pairs = [(seconds, local_seconds)]
        for number in range(1, options.rounds):
            pairs.append(_pair(lambda: timed(True, options.steps, "comm")[0],
                               lambda: timed(False, options.steps, "local")[0], number))
        if len(pairs) > 1:
            efficiencies = [local / together for together, local in pairs]
            result.update(round_efficiencies=efficiencies, median_efficiency=float(np.median(efficiencies)),
                          round_step_ms=[[1e3 * t for t in pair] for pair in pairs])
        exposed = max(0.0, seconds - local_seconds)
        result.update(step_without_comm_ms=1e3 * local_seconds, allreduce_alone_ms=1e3 * alone,
                      exposed_ms=1e3 * exposed, hidden_fraction=_hidden(exposed, alone))
        if clocks is not None:
            result["clocks"] = comm.mpi.allgather(clocks.summary())
    return result


# ------------------------------------------------------------------------------------------ driver
#: PyTorch recipe -> the precision of ours it is compared with.
OURS_PRECISION = {"fp16-pure": "fp16"}
RUNNERS = {"hpcgpu": run_hpcgpu, "torch": run_torch,
           "torch-compile": lambda comm, arch, options, precision: run_torch(comm, arch, options, precision, compiled=True)}


def main(argv=None):
    import hpcgpu

    options = parse_arguments(argv)
    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):   # an unexpected error on one rank ends the job, no hang
        return _main(options, comm)


def _main(options, comm):
    import hpcgpu
    arch = hpcgpu.arch.auto(comm, backend=options.backend)
    if comm.rank == 0:
        print(f"train_ddp: {comm.size} rank(s), {arch.describe()}, model depth {options.depth} width "
              f"{options.width}, batch {options.batch_per_gpu}/GPU, {options.steps} timed steps, "
              f"hpcgpu allreduce {options.allreduce}, NCCL channels {options.nccl_channels or 'default'}",
              flush=True)
        if options.nccl_channels and comm.size > 1 and "torch" in options.frameworks.split(","):
            print("  note: --nccl-channels with PyTorch in the same process; NCCL may apply the limit to "
                  "PyTorch's communicator too -- run --frameworks torch separately for a clean baseline",
                  flush=True)
    results = []
    ours_done = set()
    for requested in options.precisions.split(","):
        for framework in options.frameworks.split(","):
            precision = OURS_PRECISION.get(requested, requested) if framework == "hpcgpu" else requested
            if framework == "hpcgpu" and precision in ours_done:
                continue   # fp16-pure pairs with ours at fp16, measured once
            ours_done.add(precision if framework == "hpcgpu" else None)
            started = time.perf_counter()
            try:
                record = RUNNERS[framework](comm, arch, options, precision)
                error = None
            except Exception as exc:   # noqa: BLE001 - report and continue with the other parts
                record = {}
                error = f"{type(exc).__name__}: {exc}"
                if os.environ.get("TRAIN_DDP_TRACEBACK"):
                    traceback.print_exc()
            # every rank must agree before the next part's collectives
            errors = comm.mpi.allgather(error)
            failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
            record.update(framework=framework, precision=precision, n_ranks=comm.size,
                          error="; ".join(failed) or None, seconds=time.perf_counter() - started)
            results.append(record)
            if comm.rank == 0:
                print(f"  {framework:<7} {precision}: " + (record["error"] if record["error"] else
                      f"{record['samples_per_second']:,.0f} samples/s"), flush=True)
            _recover(arch)
    if comm.rank == 0:
        print_table(results)
    env = None
    try:
        from hpcgpu.app.environment import environment

        env = environment(comm, arch)
    except Exception as exc:   # noqa: BLE001
        env = {"error": str(exc)}
    if _TORCH_GROUP.pop("ready", None):      # PyTorch warns at exit otherwise
        sys.modules["torch"].distributed.destroy_process_group()
    if comm.rank == 0 and options.json:
        record = {"benchmark": "train_ddp", "options": vars(options), "n_ranks": comm.size,
                  "device": arch.describe(), "torch": _torch_version(), "environment": env, "results": results}
        Path(options.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {options.json}")
    return 0


def _recover(arch):
    if not arch.is_gpu:
        return
    try:
        import cupy

        arch.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        if "torch" in sys.modules:
            sys.modules["torch"].cuda.empty_cache()
    except Exception:   # noqa: BLE001 - best effort between parts
        pass


def _torch_version():
    try:
        import torch

        return torch.__version__
    except Exception:   # noqa: BLE001
        return None


def print_table(results):
    header = (f"{'framework':<8} {'prec':<5} {'ranks':>5} {'step ms':>9} {'samples/s':>11} {'no-comm ms':>10} "
              f"{'AR alone ms':>11} {'exposed ms':>10} {'hidden':>7}  note")
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        if r.get("error"):
            print(f"{r['framework']:<8} {r['precision']:<5} {r['n_ranks']:>5}  FAILED: {r['error']}")
            continue

        def number(key, fmt):
            value = r.get(key)
            width = int(fmt.split(".")[0].replace(",", ""))
            return format(value, fmt) if isinstance(value, (int, float)) else "-".rjust(width)

        hidden = r.get("hidden_fraction")
        note = ""
        if r.get("events_hidden_fraction") is not None and r.get("events_allreduce_busy_ms") is not None:
            note = (f"events: waited {r['events_exposed_wait_ms']:.2f} ms of {r['events_allreduce_busy_ms']:.2f} ms "
                    f"busy, backward {r['events_backward_ms']:.2f} ms, hidden {100 * r['events_hidden_fraction']:.0f}%")
        if r.get("allreduce") == "peer":
            note = "allreduce peer (copy engines); " + note
        print(f"{r['framework']:<8} {r['precision']:<5} {r['n_ranks']:>5} {number('step_ms', '9.2f')} "
              f"{number('samples_per_second', '11,.0f')} {number('step_without_comm_ms', '10.2f')} "
              f"{number('allreduce_alone_ms', '11.2f')} {number('exposed_ms', '10.2f')} "
              f"{'-' if hidden is None else format(100 * hidden, '6.0f') + '%'}  {note}")
    for r in results:
        if r.get("round_efficiencies"):
            rounds = " ".join(f"{100 * e:.1f}%" for e in r["round_efficiencies"])
            print(f"{r['framework']} {r['precision']} {r.get('allreduce', '')}: in-process scaling per round {rounds}; "
                  f"median {100 * r['median_efficiency']:.1f}% (step ms pairs {r['round_step_ms']})")
        for rank, table in enumerate(r.get("clocks") or []):
            text = "; ".join(f"{phase}: {v['sm_clock_mhz']:.0f} MHz {v['power_w']:.0f} W (n={v['n']}) {v['reasons']}"
                             for phase, v in sorted(table.items()))
            print(f"  clocks rank {rank}: {text}")
    by_key = {(r["framework"], r["precision"]): r for r in results if not r.get("error")}
    tf32 = {r["allow_tf32_default"] for r in results if "allow_tf32_default" in r}
    if tf32:
        print(f"PyTorch torch.backends.cuda.matmul.allow_tf32 default: {sorted(tf32)} (run with False: plain fp32 GEMMs, as CuPy)")
    for precision in sorted({r["precision"] for r in results}):
        ours = by_key.get(("hpcgpu", OURS_PRECISION.get(precision, precision)))
        for framework in ("torch", "torch-compile"):
            theirs = by_key.get((framework, precision))
            if ours and theirs:
                print(f"hpcgpu {ours['precision']} / PyTorch {precision}{' + torch.compile' if framework != 'torch' else ''}"
                      f": {ours['samples_per_second'] / theirs['samples_per_second']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
