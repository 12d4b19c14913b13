"""``apps.train``: data-parallel neural-network training (CuPy + NCCL, or NumPy + Numba + MPI).

The run loop, in order, on every rank::

    parse options (same on every rank) -> choose backend -> load data (rank 0 generates
    MNIST-1D once) -> model, optimiser, gradient sync (DDP buckets or ZeRO-1) -> restart?
    -> measure the bucketed allreduce alone (for the overlap report)
    repeat: next batch shard (prefetched) -> train step (forward, backward with bucket
            allreduces, optimiser) -> progress -> evaluation every N -> checkpoint / stop?
    final evaluation -> replica check -> checksum -> table, plot and JSON summary (rank 0)
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import hpcgpu
from hpcgpu.app.checksum import hash_arrays
from hpcgpu.app.cli import common_parser, non_negative_int, positive_int
from hpcgpu.app.environment import files_written, prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.progress import Progress, steps_text
from hpcgpu.app.summary import make_summary, write_json
from hpcgpu.app.timers import PhaseTimers, format_timers
from hpcgpu.errors import ConfigurationError, NumericalError

from ._backend import to_numpy
from .data import data_file_problem

MODELS = ("mlp", "cnn", "large-mlp")

#: Per-model defaults. mlp / cnn: the MNIST-1D reference models and batch, with AdamW, weight decay and
#: warm-up + cosine tuned so that every seed tried reaches the published accuracy (docs/train.md).
RECIPES = {
    "mlp": {"steps": 6000, "batch_size": 100, "lr": 2e-2, "optimizer": "adamw", "weight_decay": 0.3,
            "warmup": 100, "schedule": "cosine"},
    "cnn": {"steps": 6000, "batch_size": 100, "lr": 3e-2, "optimizer": "adamw", "weight_decay": 0.1,
            "warmup": 100, "schedule": "cosine"},
    "large-mlp": {"steps": 200, "batch_size": 256, "lr": 1e-3, "optimizer": "adamw",
                  "weight_decay": 0.01, "warmup": 20, "schedule": "cosine"},
}

DESCRIPTION = """\
Data-parallel training on many GPUs (one MPI rank per GPU, NCCL) or CPUs (NumPy + Numba, MPI).

Every rank reads its shard of each global batch (the order is a seeded shuffle per epoch,
independent of the rank count); gradients are summed in buckets that start during the
backward pass. Results match a one-process run on the whole batch.

models (data: MNIST-1D, generated offline, or --data FILE.h5):
  mlp        the MNIST-1D MLP baseline (15k parameters; ~71% test accuracy, published 68%) [default]
  cnn        the MNIST-1D CNN baseline (5k parameters; ~95% test accuracy, published 94%)
  large-mlp  a deep MLP (--depth blocks of --width), for scaling and benchmarks
"""


def build_parser(rank: int = 0):
    parser = common_parser("apps.train", DESCRIPTION, rank=rank)
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, default="mlp", help="which model to train [mlp]")
    model.add_argument("--depth", type=non_negative_int, default=4, help="large-mlp: hidden blocks [4]")
    model.add_argument("--width", type=positive_int, default=1024, help="large-mlp: hidden width [1024]")
    model.add_argument("--dropout", type=float, default=0.0, help="large-mlp: dropout probability [0]")
    model.add_argument("--recompute", action="store_true",
                       help="activation recomputation: keep block inputs only, recompute in backward")
    model.add_argument("--data", metavar="FILE.h5", default=None,
                       help="HDF5 file with datasets x, y (optional x_test, y_test) [MNIST-1D]")
    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--batch-size", type=positive_int, default=None,
                       help="GLOBAL batch size (all ranks, all micro-steps) [mlp/cnn 100, large-mlp 256]")
    optim.add_argument("--lr", type=float, default=None, help="peak learning rate [mlp 2e-2, cnn 3e-2, large-mlp 1e-3]")
    optim.add_argument("--optimizer", choices=("sgd", "adamw"), default=None, help="[adamw]")
    optim.add_argument("--weight-decay", type=float, default=None, help="[mlp 0.3, cnn 0.1, large-mlp 0.01]")
    optim.add_argument("--momentum", type=float, default=0.9, help="sgd momentum [0.9]")
    optim.add_argument("--warmup", type=non_negative_int, default=None, metavar="STEPS",
                       help="linear warm-up steps [mlp/cnn 100, large-mlp 20]")
    optim.add_argument("--schedule", choices=("cosine", "constant"), default=None,
                       help="after warm-up: cosine decay to 0 over --steps, or constant [cosine]")
    optim.add_argument("--reschedule", action="store_true",
                       help="on --restart: re-plan the learning-rate schedule with this run's --steps/--lr/--warmup "
                            "(default: continue the schedule the checkpoint's run planned; --steps past its cosine "
                            "end is refused)")
    optim.add_argument("--clip-norm", type=float, default=None, help="clip the global gradient norm [off]")
    optim.add_argument("--accum-steps", type=positive_int, default=1, metavar="K",
                       help="gradient accumulation: K micro-steps per optimiser step, no communication "
                            "before the last [1]")
    optim.add_argument("--precision", choices=("fp32", "fp16", "fp64"), default="fp32",
                       help="fp16: mixed precision (fp32 masters, dynamic loss scaling); fp64 for testing [fp32]")
    optim.add_argument("--loss-scale", type=float, default=2.0**16, help="fp16: initial loss scale [65536]")
    par = parser.add_argument_group("parallelism")
    par.add_argument("--zero", type=int, choices=(0, 1), default=0,
                     help="1: shard the optimiser state (reduce-scatter + all-gather) [0]")
    par.add_argument("--bucket-mb", type=float, default=25.0, help="gradient allreduce bucket size in MB [25]")
    par.add_argument("--nccl-channels", type=non_negative_int, default=0, metavar="N",
                     help="GPU: at most N NCCL channels (thread blocks) for the gradient collectives; few "
                          "channels keep the allreduce from slowing the backward GEMMs it overlaps, at "
                          "lower allreduce bandwidth. 0 = NCCL's default; NCCL_MAX_NCHANNELS in the "
                          "environment wins [0]")
    par.add_argument("--allreduce", choices=("nccl", "peer"), default="nccl",
                     help="GPU gradient bucket sum: nccl (NCCL allreduce), or peer: the GPUs' copy engines move "
                          "the halves of each bucket between CUDA-IPC-mapped buffers and one small add kernel "
                          "sums them, so no NCCL kernels take SMs from the backward GEMMs; bitwise NCCL's "
                          "result. peer needs GPUs, exactly 2 ranks on one node and --zero 0 [nccl]")
    par.add_argument("--blas-threads", type=non_negative_int, default=0, metavar="N",
                     help="CPU: BLAS threads per rank (0: 1 for mlp/cnn, cores per rank otherwise) [0]")
    out = parser.add_argument_group("evaluation and output")
    out.add_argument("--eval-every", type=non_negative_int, default=None, metavar="N",
                     help="evaluate on the test set every N steps (0: only at the end) [steps/10]")
    out.add_argument("--no-plot", action="store_true", help="do not write the loss-curve PNG")
    # the MNIST-1D reference seed
    parser.set_defaults(seed=42)
    for action in parser._actions:
        if action.dest == "seed":
            action.help = "random seed of initialisation, shuffle and dropout [42]"
    return parser


def fill_defaults(options):
    """Replace the options left at None by the model's recipe (``RECIPES``); returns None."""
    recipe = RECIPES[options.model]
    for key in ("steps", "batch_size", "lr", "optimizer", "weight_decay", "warmup", "schedule"):
        if getattr(options, key) is None:
            setattr(options, key, recipe[key])
    if options.eval_every is None:
        options.eval_every = max(1, options.steps // 10) if options.steps else 0


def validate(options, comm):
    """Check option values (replicated: every rank raises the same ConfigurationError)."""
    from .distributed import check_allreduce

    fill_defaults(options)
    if not options.lr > 0:
        raise ConfigurationError(f"--lr must be positive, got {options.lr}")
    if options.weight_decay < 0:
        raise ConfigurationError(f"--weight-decay must be >= 0, got {options.weight_decay}")
    if not 0.0 <= options.dropout < 1.0:
        raise ConfigurationError(f"--dropout must be in [0, 1), got {options.dropout}")
    if options.clip_norm is not None and not options.clip_norm > 0:
        raise ConfigurationError(f"--clip-norm must be positive, got {options.clip_norm}")
    if not options.bucket_mb > 0:
        raise ConfigurationError(f"--bucket-mb must be positive, got {options.bucket_mb}")
    if not options.loss_scale >= 1:
        raise ConfigurationError(f"--loss-scale must be >= 1, got {options.loss_scale}")
    # the backend is not chosen yet: "auto" leaves the GPU check to make_sync
    check_allreduce(comm, options.allreduce, is_gpu={"cupy": True, "numpy": False}.get(options.backend),
                    zero_stage=options.zero)
    smallest_share = options.batch_size // comm.size
    if smallest_share < options.accum_steps:
        raise ConfigurationError(
            f"--batch-size {options.batch_size} over {comm.size} ranks gives {smallest_share} "
            f"sample(s) on some rank, fewer than --accum-steps {options.accum_steps}; every micro-step "
            f"needs a sample: use --batch-size >= {comm.size * options.accum_steps} or fewer ranks")
    if options.data is not None:
        # Rank 0 looks at the file and every rank raises its answer: one message, not one per rank.
        problem = comm.broadcast(data_file_problem(options.data) if comm.rank == 0 else None)
        if problem is not None:
            raise ConfigurationError(problem)
    if options.checkpoint_dir is None:
        options.checkpoint_dir = str(Path(options.output) / "checkpoints")


def load_data(options, comm):
    """Collective: the training data (rank 0 generates and caches MNIST-1D first)."""
    from .loader import open_training_data

    data, problem = None, None
    if comm.rank == 0:
        try:
            data = open_training_data(options.data)
        except (OSError, ValueError, ImportError) as exc:
            problem = _data_error(options.data, exc)
    problem = comm.broadcast(problem, root=0)
    if problem is not None:
        raise ConfigurationError(problem)   # every rank raises the same message
    if comm.rank != 0:
        try:
            data = open_training_data(options.data)
        except (OSError, ValueError, ImportError) as exc:
            problem = _data_error(options.data, exc)
    # Rank 0 could read it: a failure now is local to some rank (a file not visible on its node).
    comm.check(problem is None, problem or "")
    return data


def _data_error(path, exc) -> str:
    """The message of a failure to open ``--data``, naming the file (h5py's own messages do not)."""
    text = f"{exc}"
    if path is not None and str(path) not in text:
        text = (f"--data {path}: {text}; expected an HDF5 file with datasets x, y (optional x_test, y_test), "
                "or omit --data for MNIST-1D")
    return text


def build_model(options, sample_shape, n_classes):
    from .models import large_mlp, mnist1d_cnn, mnist1d_mlp

    if len(sample_shape) != 1:
        raise ConfigurationError(f"the models expect samples of shape (features,), the data has "
                                 f"{sample_shape}; flatten x to (n, features)")
    n_inputs = sample_shape[0]
    if options.model == "mlp":
        return mnist1d_mlp(n_inputs=n_inputs, n_classes=n_classes, recompute=options.recompute)
    if options.model == "cnn":
        if n_inputs < 16:
            raise ConfigurationError(f"--model cnn needs signals of at least 16 samples, found {n_inputs}")
        return mnist1d_cnn(n_inputs=n_inputs, n_classes=n_classes, recompute=options.recompute)
    return large_mlp(n_inputs, n_classes, options.depth, options.width, dropout=options.dropout,
                     recompute=options.recompute)


def train_config(options):
    from .trainer import TrainConfig

    return TrainConfig(
        optimizer=options.optimizer, lr=options.lr, weight_decay=options.weight_decay,
        momentum=options.momentum, warmup_steps=options.warmup,
        total_steps=options.steps if options.schedule == "cosine" else None,
        global_batch_size=options.batch_size, accum_steps=options.accum_steps,
        clip_norm=options.clip_norm, precision=options.precision,
        init_loss_scale=options.loss_scale, seed=options.seed)


@contextlib.contextmanager
def cpu_thread_limits(options, comm, arch):
    """CPU: cap BLAS threads per rank (small matmuls are 4-30x slower multithreaded on 2 cores)."""
    if arch.is_gpu:
        yield "GPU"
        return
    threads = options.blas_threads
    if threads == 0:
        threads = 1 if options.model in ("mlp", "cnn") else hpcgpu.arch.cpu_threads_per_rank(comm)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield f"not capped (pip install threadpoolctl, or set OPENBLAS_NUM_THREADS={threads})"
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield f"{threads} BLAS thread(s) per rank"


def run(options, comm) -> dict:
    """Train as configured; returns the summary record (on every rank)."""
    from hpcgpu.app.checkpointing import RunControl

    from .checkpointing import restore_training_checkpoint, training_checkpoint_payload
    from .distributed import check_allreduce, evaluate_distributed, make_sync, replicas_identical
    from .loader import ShardedLoader
    from .trainer import Trainer, init_train_state, train_step

    validate(options, comm)
    arch = hpcgpu.arch.auto(comm, backend=options.backend, bind_cpus=options.bind_cpus)
    check_allreduce(comm, options.allreduce, is_gpu=arch.is_gpu, zero_stage=options.zero)   # --backend auto
    output = prepare_output(comm, arch, options)   # checks every output path first; OUTPUT/environment.json
    data = load_data(options, comm)
    if options.batch_size > data.source.n_samples:
        raise ConfigurationError(f"--batch-size {options.batch_size} exceeds the {data.source.n_samples} "
                                 "training samples; use a smaller global batch")
    model = build_model(options, data.source.sample_shape, data.n_classes)
    trainer = Trainer(model, train_config(options))
    sync = make_sync(comm, arch, options.zero, options.bucket_mb, options.nccl_channels, options.allreduce)
    state = init_train_state(trainer, arch.xp, sync)
    loud = comm.rank == 0 and not options.quiet
    # Training steps are long: the ranks agree on stopping (signal, wall-time limit) after every step.
    control = RunControl(comm, options, app="apps.train", output=output, quiet=options.quiet, stop_check_every=1)
    history = {"step": [], "loss": [], "eval_step": [], "test_loss": [], "test_accuracy": []}

    def load(manager, which):
        history.update(restore_training_checkpoint(manager, which, trainer, state, sync, options.model,
                                                   steps=options.steps, reschedule=options.reschedule,
                                                   note_fn=print if loud else None))
        return state.step

    def checkpoint_state():
        return training_checkpoint_payload(trainer, state, sync, history, options.model)

    control.restore_with(load)
    first_step = state.step
    with cpu_thread_limits(options, comm, arch) as threads_note:
        sync.measure_allreduce_alone()
        if loud:
            _print_header(options, comm, arch, trainer, data, sync, threads_note, first_step)
        timers = PhaseTimers(arch)
        progress = Progress(comm, options.steps, unit="steps", enabled=not options.quiet, first=first_step)
        loader = ShardedLoader(data.source, options.batch_size, options.seed, comm.rank, comm.size,
                               start_step=first_step, arch=arch)
        x_test = y_test = None
        if data.test is not None:
            x_test, y_test = arch.from_host(data.test[0]), arch.from_host(data.test[1])
        comm.barrier()
        arch.synchronize()
        started = time.perf_counter()
        try:
            while state.step < options.steps:
                batch = loader.next()
                metrics = train_step(trainer, state, batch.x, batch.y, batch.sample_index, sync, timers)
                if not math.isfinite(metrics.loss) and options.precision != "fp16":
                    error = NumericalError(
                        f"the loss became {metrics.loss} at step {state.step}; expected a finite value. "
                        "Lower --lr, add --clip-norm or use --warmup.")
                    error.replicated = True   # the loss is allreduced: every rank sees it
                    raise error
                history["step"].append(state.step)
                history["loss"].append(metrics.loss)
                if x_test is not None and options.eval_every and state.step % options.eval_every == 0 \
                        and state.step < options.steps:
                    _evaluate_into(history, trainer, state, x_test, y_test, comm, evaluate_distributed)
                # samples/s after the warm-up step, like the progress line's steps/s ("-" until timed)
                steps_per_second = progress.rate(state.step, time.perf_counter())
                rate = f"{options.batch_size * steps_per_second:,.0f}" if steps_per_second else "-"
                progress.update(state.step, f"loss {metrics.loss:.4f}  {rate} samples/s")
                control.after_step(state.step, checkpoint_state, timers)   # periodic save; stop on request
            finishing = time.perf_counter()
            control.finish(state.step, checkpoint_state)   # the end of the run is a checkpoint too
            finish_seconds = time.perf_counter() - finishing
            arch.synchronize()
            wall = time.perf_counter() - started
        finally:
            loader.close()
            control.close()   # after an error too: no writer thread or signal handler left behind
        timers.add("io", loader.io_seconds + finish_seconds)
        if x_test is not None and (not history["eval_step"] or history["eval_step"][-1] != state.step):
            _evaluate_into(history, trainer, state, x_test, y_test, comm, evaluate_distributed)
    params = to_numpy(state.precision.master_params)
    identical = replicas_identical(comm, params)
    checksum = comm.broadcast(hash_arrays([("params", params)]) if comm.rank == 0 else None, root=0)
    timer_summary = timers.summary(comm, wall)
    done = state.step - first_step
    throughput = options.batch_size * done / wall if wall > 0 else 0.0
    diagnostics = _diagnostics(history, state, trainer, sync, identical)
    summary = make_summary(
        app="apps.train", backend=arch.name, comm=comm,
        decomposition=_decomposition(options, comm, sync),
        steps=done, wall_seconds=wall, throughput=throughput, unit="samples/s", timers=timer_summary,
        diagnostics=diagnostics, checksum=checksum,
        extra={"model": options.model, "n_params": trainer.model.n_params, "precision": options.precision,
               "first_step": first_step, "final_step": state.step,
               "data": data.description, "optimizer": options.optimizer},
    )
    if comm.rank == 0 and not options.no_plot:
        from .report import plot_history

        plot_history(history, output / "loss_curve.png", title=f"apps.train {options.model}")
    if loud:
        _print_table(done, wall, throughput, comm, timer_summary, diagnostics, checksum)
    if comm.rank == 0 and options.summary:
        write_json(options.summary, summary)
    if loud:
        for line in files_written(output, options.summary, control.manager.directory,
                                  control.last_saved_step is not None and control.last_saved_step > first_step):
            print(line)
    return summary


def _evaluate_into(history, trainer, state, x_test, y_test, comm, evaluate_fn):
    test_loss, accuracy = evaluate_fn(trainer, state, x_test, y_test, comm)
    history["eval_step"].append(state.step)
    history["test_loss"].append(test_loss)
    history["test_accuracy"].append(accuracy)


def _decomposition(options, comm, sync):
    from .data import shard_bounds

    shares = [hi - lo for lo, hi in (shard_bounds(options.batch_size, r, comm.size) for r in range(comm.size))]
    return {"kind": "data-parallel", "replicas": comm.size, "global_batch_size": options.batch_size,
            "local_batch_sizes": shares, "accum_steps": options.accum_steps, "zero_stage": options.zero,
            "buckets": len(sync.buckets), "bucket_mb": options.bucket_mb if options.zero == 0 else None,
            "allreduce": options.allreduce if options.zero == 0 else None}


def _diagnostics(history, state, trainer, sync, identical):
    losses = history["loss"]
    scaler = getattr(state.precision, "scaler", None)
    result = {
        "final_loss": losses[-1] if losses else None,
        "loss_curve": losses,
        "loss_curve_first_step": int(history["step"][0]) if history["step"] else None,
        "test_accuracy": history["test_accuracy"][-1] if history["test_accuracy"] else None,
        "test_loss": history["test_loss"][-1] if history["test_loss"] else None,
        "evaluations": {"step": history["eval_step"], "test_loss": history["test_loss"],
                        "test_accuracy": history["test_accuracy"]},
        "skipped_steps": int(scaler.skipped_steps) if scaler is not None else 0,
        "loss_scale": float(scaler.scale) if scaler is not None else None,
        "overlap": sync.overlap_stats(),
        "replicas_identical": bool(identical),
        "n_params": int(trainer.model.n_params),
    }
    return result


#: Below this many parameters a GPU step is bound by kernel launches (docs/train.md: the MNIST-1D
#: models run at 1.9-3 ms per step on an H200, 3-5x slower than on two CPU cores).
LAUNCH_BOUND_PARAMETERS = 1_000_000


def launch_bound_note(is_gpu, n_params, backend_option):
    """A hint for a small model that the GPU was picked for automatically, else ``None``."""
    if is_gpu and n_params < LAUNCH_BOUND_PARAMETERS and backend_option == "auto":
        return (f"note: {n_params:,} parameters is too few to keep a GPU busy (each step is a few dozen "
                "tiny kernel launches); --backend numpy runs this model faster")
    return None


def _print_header(options, comm, arch, trainer, data, sync, threads_note, first_step):
    from .data import shard_bounds

    shares = sorted({hi - lo for lo, hi in (shard_bounds(options.batch_size, r, comm.size)
                                           for r in range(comm.size))})
    share_text = "/".join(str(s) for s in shares)
    sync_text = ("ZeRO-1 (optimiser state sharded, reduce-scatter + all-gather)" if options.zero
                 else f"{len(sync.buckets)} allreduce bucket(s) of <= {options.bucket_mb:g} MB"
                 + (" (copy engines, CUDA IPC)" if options.allreduce == "peer" else ""))
    print(f"apps.train {hpcgpu.__version__}: {options.model}, {trainer.model.n_params:,} parameters, "
          f"{options.precision}, {options.optimizer} lr {options.lr:g}"
          + (", recompute" if options.recompute else ""))
    print(f"data: {data.description}")
    print(f"backend: {arch.name} ({arch.reason}); {threads_note}")
    note = launch_bound_note(arch.is_gpu, trainer.model.n_params, options.backend)
    if note:
        print(note)
    print(f"ranks: {comm.size} on {comm.n_nodes} node(s); data parallel: global batch {options.batch_size} = "
          f"{comm.size} x {share_text} (accumulation {options.accum_steps}); {sync_text}")
    print(f"steps: {steps_text(first_step, options.steps)}", flush=True)


def _print_table(done, wall, throughput, comm, timer_summary, diagnostics, checksum):
    print()
    print(f"{done} steps in {wall:.3f} s: {throughput:,.1f} samples/s ({throughput / comm.size:,.1f} per rank)")
    print(format_timers(timer_summary, wall))
    for key in ("final_loss", "test_loss", "test_accuracy", "skipped_steps", "loss_scale",
                "replicas_identical", "n_params"):
        value = diagnostics[key]
        if isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key:<24} {value}")
    overlap = diagnostics["overlap"]
    if overlap.get("hidden_fraction") is not None:
        print(f"{'allreduce hidden':<24} {100 * overlap['hidden_fraction']:.1f}% "
              f"(alone {overlap['allreduce_alone_ms']:.3f} ms/step, exposed {overlap['exposed_wait_ms']:.3f} ms/step, "
              f"backward {overlap['backward_ms']:.3f} ms/step)")
    print(f"checksum {checksum}", flush=True)


def main(argv=None) -> int:
    return run_app("apps.train", build_parser, run, argv)
