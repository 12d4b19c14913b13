"""``apps.train``: data-parallel neural-network training (CuPy + NCCL, or NumPy + Numba + MPI).

This module is the app's configuration: the command line, each model's recipe of defaults
(:func:`resolve_options`), the data (rank 0 generates MNIST-1D once) and the network, optimiser and
gradient synchroniser (DDP buckets or ZeRO-1). The run loop is :class:`hpcgpu.simulation.Simulation`'s;
:mod:`apps.train.run.simulation_model` adapts training to it (a step: next batch shard, prefetched ->
forward, backward with bucket allreduces, optimiser; evaluation every ``--eval-every`` steps; final
evaluation, replica check and the checksum of the weights). ``--model residual-mlp`` trains on a
D x T x P grid instead (``--tensor-parallel``, ``--pipeline-parallel``, ``--micro-batches``:
:mod:`apps.train.parallel.trainer`), run by :class:`apps.train.run.parallel_model.ParallelTrainingModel`;
:func:`check_split_model` refuses what that path cannot do yet (docs/parallelism.md).
"""

from __future__ import annotations

from pathlib import Path

from hpcgpu.app.checkpointing import fingerprinted_options
from hpcgpu.app.cli import FrozenOptions, common_parser, non_negative_int, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.memory import MemoryEstimate, refuse_if_too_large
from hpcgpu.errors import ConfigurationError
from hpcgpu.observe.monitor import add_monitor_arguments
from hpcgpu.simulation import AtEnd, Periodic, Simulation, nccl_channel_limit, setup_architecture
from hpcgpu.simulation.operations import rate_note
from hpcgpu.simulation.triggers import Always

from apps.train.data.dataset import data_file_problem
from apps.train.parallel.distributed import check_allreduce, make_sync
from apps.train.data.loader import open_training_data
from apps.train.nn.models import large_mlp, mnist1d_cnn, mnist1d_mlp
from apps.train.parallel.grid import make_grid
from apps.train.run.parallel_model import ParallelTrainingModel
from apps.train.parallel.trainer import ParallelTrainer
from apps.train.training.precision import PRECISIONS
from apps.train.run.simulation_model import Evaluation, TrainingModel
from apps.train.run.training_run import launch_bound_note  # noqa: F401 - re-exported (tests import it from here)
from apps.train.parallel.tensor_parallel import MLPSpec
from apps.train.training.trainer import TrainConfig, Trainer, init_train_state

MODELS = ("mlp", "cnn", "large-mlp", "residual-mlp")

#: The options of the split model (issue 27); left out of the checkpoint fingerprint of the other
#: models, whose checkpoints must stay restartable.
SPLIT_OPTIONS = ("tensor_parallel", "pipeline_parallel", "micro_batches", "pipeline_schedule", "hidden")

#: The options that choose the split model's rank grid and schedule, not the model: a checkpoint of the
#: split model restarts under other values of them (resharding).
GRID_OPTIONS = ("tensor_parallel", "pipeline_parallel", "micro_batches", "pipeline_schedule")

#: Per-model defaults. mlp / cnn: the MNIST-1D reference models and batch, with AdamW, weight decay and
#: warm-up + cosine tuned so that every seed tried reaches the published accuracy (docs/train.md).
RECIPES = {
    "mlp": {"steps": 6000, "batch_size": 100, "lr": 2e-2, "optimizer": "adamw", "weight_decay": 0.3,
            "warmup": 100, "schedule": "cosine"},
    "cnn": {"steps": 6000, "batch_size": 100, "lr": 3e-2, "optimizer": "adamw", "weight_decay": 0.1,
            "warmup": 100, "schedule": "cosine"},
    "large-mlp": {"steps": 200, "batch_size": 256, "lr": 1e-3, "optimizer": "adamw",
                  "weight_decay": 0.01, "warmup": 20, "schedule": "cosine"},
    "residual-mlp": {"steps": 200, "batch_size": 256, "lr": 1e-3, "optimizer": "adamw",
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
  residual-mlp  --depth residual blocks h + Linear(GELU(Linear(LayerNorm(h)))) of --width and
             --hidden: the model that --tensor-parallel T and --pipeline-parallel P split
             (ranks = D x T x P; D, the data-parallel size, is the rest)
"""


def build_parser(rank: int = 0):
    parser = common_parser("apps.train", DESCRIPTION, rank=rank)
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, default="mlp", help="which model to train [mlp]")
    model.add_argument("--depth", type=non_negative_int, default=4, help="large-mlp, residual-mlp: hidden blocks [4]")
    model.add_argument("--width", type=positive_int, default=1024, help="large-mlp, residual-mlp: hidden width [1024]")
    model.add_argument("--hidden", type=positive_int, default=None,
                       help="residual-mlp: inner width of each block's MLP [4 x --width]")
    model.add_argument("--dropout", type=float, default=0.0, help="large-mlp, residual-mlp: dropout probability [0]")
    model.add_argument("--recompute", action="store_true",
                       help="activation recomputation: keep block inputs only, recompute in backward "
                            "(residual-mlp: on every stage of any grid; one more tensor allreduce per block)")
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
    optim.add_argument("--precision", choices=PRECISIONS, default="fp32",
                       help="fp16: mixed precision (fp32 masters, dynamic loss scaling); bf16: mixed precision "
                            "(fp32 masters, no loss scaling; on GPUs not with --model cnn or --allreduce peer); both "
                            "with any --tensor-parallel / --pipeline-parallel grid (activations, tensor allreduces and pipeline messages in "
                            "16 bits; data-parallel gradients summed in fp32 for bf16); fp64 for testing [fp32]")
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
                     help="GPU gradient bucket sum: nccl (the job's transport's allreduce: NCCL unless --transport "
                          "names an MPI one), or peer: the GPUs' copy engines move "
                          "the halves of each bucket between CUDA-IPC-mapped buffers and one small add kernel "
                          "sums them, so no NCCL kernels take SMs from the backward GEMMs; bitwise NCCL's "
                          "result. peer needs GPUs, exactly 2 ranks on one node and --zero 0 [nccl]")
    par.add_argument("--tensor-parallel", type=positive_int, default=1, metavar="T",
                     help="split each residual-mlp block's two Linears over T ranks (Megatron; one allreduce "
                          "per block and direction: keep T inside a node) [1]")
    par.add_argument("--pipeline-parallel", type=positive_int, default=1, metavar="P",
                     help="cut the residual-mlp layers into P stages on P ranks (point to point between "
                          "stages) [1]")
    par.add_argument("--micro-batches", type=positive_int, default=None, metavar="M",
                     help="residual-mlp: micro-batches per step; the pipeline bubble is (P-1)/(M+P-1) [P]")
    par.add_argument("--pipeline-schedule", choices=("1f1b", "gpipe"), default="1f1b",
                     help="order of the micro-batches' forwards and backwards on each stage; the same "
                          "results, 1f1b holds at most P - stage micro-batches' activations [1f1b]")
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
    add_monitor_arguments(parser)  # --monitor, --monitor-interval, --profile
    return parser


def recipe_defaults(options) -> dict:
    """The values of the options left at None, from the model's recipe (``RECIPES``)."""
    recipe = RECIPES[options.model]
    values = {key: recipe[key] for key in ("steps", "batch_size", "lr", "optimizer", "weight_decay", "warmup",
                                           "schedule") if getattr(options, key) is None}
    if options.hidden is None:
        values["hidden"] = 4 * options.width
    if options.micro_batches is None:
        values["micro_batches"] = options.pipeline_parallel
    steps = values.get("steps", options.steps)
    if options.eval_every is None:
        values["eval_every"] = max(1, steps // 10) if steps else 0
    return values


def resolve_options(options, comm) -> FrozenOptions:
    """The options with the recipe's defaults filled in, checked (every rank raises the same
    ConfigurationError); ``options`` itself is left as parsed."""
    options = FrozenOptions(options, **recipe_defaults(options),
                            checkpoint_dir=options.checkpoint_dir or str(Path(options.output) / "checkpoints"))
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
    check_bf16(options, is_gpu=options.backend == "cupy")
    check_split_model(options, comm.size)
    # the backend is not chosen yet: "auto" leaves the GPU check to make_sync
    check_allreduce(comm, options.allreduce, is_gpu={"cupy": True, "numpy": False}.get(options.backend),
                    zero_stage=options.zero)
    smallest_share = options.batch_size // comm.size
    if not uses_split_model(options) and smallest_share < options.accum_steps:
        raise ConfigurationError(
            f"--batch-size {options.batch_size} over {comm.size} ranks gives {smallest_share} "
            f"sample(s) on some rank, fewer than --accum-steps {options.accum_steps}; every micro-step "
            f"needs a sample: use --batch-size >= {comm.size * options.accum_steps} or fewer ranks")
    if options.data is not None:
        # Rank 0 looks at the file and every rank raises its answer: one message, not one per rank.
        problem = comm.broadcast(data_file_problem(options.data) if comm.rank == 0 else None)
        if problem is not None:
            raise ConfigurationError(problem)
    return options


def check_bf16(options, is_gpu) -> None:
    """Refuse what ``--precision bf16`` cannot do yet (the same ConfigurationError on every rank)."""
    if options.precision != "bf16" or not is_gpu:
        return
    gpu_problems = (
        (options.model == "cnn", "--model cnn (its convolutions have no bfloat16 GPU kernels yet)"),
        (options.allreduce == "peer", "--allreduce peer (its add kernel takes no bfloat16)"),
    )
    for found, what in gpu_problems:
        if found:
            raise ConfigurationError(
                f"--precision bf16 on the GPU does not support {what} yet; use --precision fp16 for it, "
                "or --backend numpy")


def uses_split_model(options) -> bool:
    """True when the run goes through the D x T x P trainer (:mod:`apps.train.run.parallel_model`)."""
    return options.model == "residual-mlp"


def check_split_model(options, n_ranks: int) -> None:
    """Refuse what the split model (``--tensor-parallel``, ``--pipeline-parallel``) cannot do yet.

    Reads only replicated values (options and the rank count), so every rank raises the same
    ConfigurationError before any collective.
    """
    tensor, pipeline = options.tensor_parallel, options.pipeline_parallel
    split = tensor * pipeline > 1
    if not uses_split_model(options):
        if split:
            raise ConfigurationError(
                f"--tensor-parallel {tensor} --pipeline-parallel {pipeline}: only --model residual-mlp "
                f"is split over ranks (blocks h + Linear(GELU(Linear(LayerNorm(h))))); --model "
                f"{options.model} trains data-parallel only. Use --model residual-mlp, or drop the flags")
        if options.micro_batches != 1:
            raise ConfigurationError(
                f"--micro-batches {options.micro_batches} applies to --model residual-mlp; for "
                f"--model {options.model} use --accum-steps for gradient accumulation")
        return
    what = (f"--model residual-mlp (D x T x P = {max(1, n_ranks // (tensor * pipeline))} x {tensor} x "
            f"{pipeline})")
    if n_ranks % (tensor * pipeline):
        raise ConfigurationError(
            f"--tensor-parallel {tensor} x --pipeline-parallel {pipeline} = {tensor * pipeline} ranks per "
            f"model replica does not divide the job's {n_ranks} ranks; the data-parallel size D = ranks / "
            f"(T x P) must be a whole number: run on a multiple of {tensor * pipeline} ranks")
    if options.accum_steps != 1:
        raise ConfigurationError(
            f"--accum-steps {options.accum_steps} is not supported with {what}: use --micro-batches "
            f"{options.accum_steps * max(1, options.micro_batches)} (micro-batches are the pipeline's "
            "gradient accumulation)")
    if options.allreduce != "nccl":
        raise ConfigurationError(
            f"--allreduce {options.allreduce} is not supported with {what}: the copy-engine allreduce "
            "sums the gradients of exactly 2 ranks holding the whole model. Use --allreduce nccl")
    if options.hidden % tensor:
        raise ConfigurationError(
            f"--hidden {options.hidden} cannot be split over --tensor-parallel {tensor} ranks; choose "
            f"--hidden (default 4 x --width) as a multiple of {tensor}")
    if pipeline > options.depth + 3:
        raise ConfigurationError(
            f"--pipeline-parallel {pipeline} needs at least {pipeline} layers to cut into stages; "
            f"residual-mlp has --depth + 3 = {options.depth + 3}: raise --depth or lower P")
    data_size = n_ranks // (tensor * pipeline)
    if options.batch_size // data_size < options.micro_batches:
        raise ConfigurationError(
            f"--batch-size {options.batch_size} over {data_size} data replica(s) gives "
            f"{options.batch_size // data_size} sample(s) on some replica, fewer than --micro-batches "
            f"{options.micro_batches}; use --batch-size >= {data_size * options.micro_batches}")


def load_data(options, comm):
    """Collective: the training data (rank 0 generates and caches MNIST-1D first)."""
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


def memory_estimate(config, on_gpu: bool) -> MemoryEstimate | None:
    """A lower bound of the bytes each rank's weights and gradients take; None for the small fixed models.

    large-mlp: ``depth x width**2`` hidden weights; residual-mlp: ``depth x 2 x width x hidden``, split
    over the tensor- and pipeline-parallel ranks. Each weight is held in float32 and its gradient in the
    run's precision; optimizer moments, activations and the input and output layers only add to it.
    """
    if config.model == "large-mlp":
        n_weights = config.depth * config.width**2
    elif config.model == "residual-mlp":
        n_weights = config.depth * 2 * config.width * config.hidden
    else:
        return None
    shards = config.tensor_parallel * config.pipeline_parallel
    per_rank = -(-n_weights // shards)
    per_weight = 4 + (4 if config.precision == "fp32" else 2)
    return MemoryEstimate(per_rank * per_weight, "gpu" if on_gpu else "host",
                          f"{config.model} of {n_weights:.3g} hidden weights, {per_rank:.3g} per rank x "
                          f"{per_weight} bytes (weight and gradient)")


def build_model(options, sample_shape, n_classes):
    """The network of ``--model`` for samples of ``sample_shape`` and ``n_classes`` classes."""
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


def mlp_spec(options, sample_shape, n_classes) -> MLPSpec:
    """The :class:`~apps.train.parallel.tensor_parallel.MLPSpec` of ``--model residual-mlp``."""
    if len(sample_shape) != 1:
        raise ConfigurationError(f"the models expect samples of shape (features,), the data has "
                                 f"{sample_shape}; flatten x to (n, features)")
    return MLPSpec(n_inputs=int(sample_shape[0]), n_classes=int(n_classes), width=options.width,
                   hidden=options.hidden, depth=options.depth, dropout=options.dropout)


def build_split_model(options, comm, arch, data) -> ParallelTrainingModel:
    """Collective: the D x T x P grid, the :class:`ParallelTrainer` and its driver model."""
    spec = mlp_spec(options, data.source.sample_shape, data.n_classes)
    grid = make_grid(comm, tensor_size=options.tensor_parallel, pipeline_size=options.pipeline_parallel)
    runner = ParallelTrainer(grid, spec, train_config(options), arch, micro_batches=options.micro_batches,
                             schedule=options.pipeline_schedule, bucket_mb=options.bucket_mb,
                             zero_stage=options.zero, recompute=options.recompute)
    return ParallelTrainingModel(comm, arch, options, data, grid, runner)


def train_config(options):
    """The :class:`~apps.train.training.trainer.TrainConfig` of the resolved options."""
    return TrainConfig(
        optimizer=options.optimizer, lr=options.lr, weight_decay=options.weight_decay,
        momentum=options.momentum, warmup_steps=options.warmup,
        total_steps=options.steps if options.schedule == "cosine" else None,
        global_batch_size=options.batch_size, accum_steps=options.accum_steps,
        clip_norm=options.clip_norm, precision=options.precision,
        init_loss_scale=options.loss_scale, seed=options.seed)


def run(options, comm) -> dict:
    """Train as configured; returns the summary record (on every rank)."""
    config = resolve_options(options, comm)
    # NCCL_MAX_NCHANNELS for the gradient collectives: the communicator is created inside this block.
    with nccl_channel_limit(config.nccl_channels):
        arch = setup_architecture(comm, config)   # arch.auto, then the job's transport (--transport)
        check_allreduce(comm, config.allreduce, is_gpu=arch.is_gpu, zero_stage=config.zero)   # --backend auto
        # arch.auto chose the backend on every rank together: every rank raises the same message
        check_bf16(config, is_gpu=arch.is_gpu)
        estimate = memory_estimate(config, arch.is_gpu)
        if estimate is not None:
            refuse_if_too_large(comm, "apps.train", estimate, "use a smaller --width, --depth or --hidden, or split "
                                "the model over more ranks (--tensor-parallel, --pipeline-parallel)")
        data = load_data(config, comm)
        if config.batch_size > data.source.n_samples:
            raise ConfigurationError(f"--batch-size {config.batch_size} exceeds the {data.source.n_samples} "
                                     "training samples; use a smaller global batch")
        # Every option accepted: check the output paths and lock the directories (environment.json
        # follows in Simulation.run).
        output = prepare_output(comm, arch, config)
        if uses_split_model(config):
            model = build_split_model(config, comm, arch, data)
            # The grid is left out: a checkpoint holds the unsplit model and restarts on any D x T x P
            # (apps/train/parallel/sharded_checkpoint.py); --hidden and the rest of the model stay in.
            fingerprint = fingerprinted_options({key: value for key, value in config.as_dict().items()
                                                 if key not in GRID_OPTIONS})
        else:
            network = build_model(config, data.source.sample_shape, data.n_classes)
            trainer = Trainer(network, train_config(config))
            sync = make_sync(comm, arch, config.zero, config.bucket_mb, config.nccl_channels, config.allreduce)
            state = init_train_state(trainer, arch.xp, sync)
            model = TrainingModel(comm, arch, config, data, trainer, sync, state)
            fingerprint = fingerprinted_options({key: value for key, value in config.as_dict().items()
                                                 if key not in SPLIT_OPTIONS})
        operations = []
        if data.test is not None:   # evaluations every --eval-every steps; the last one is in the diagnostics
            operations.append(Evaluation(model, Periodic(config.eval_every) & ~AtEnd()))
        simulation = Simulation(
            comm, arch, model, config, app="apps.train", output=output, final_step=config.steps,
            operations=operations, nan_check=None if config.precision == "fp16" else Always(),
            progress_note_fn=rate_note(config.batch_size), plot=not config.no_plot,
            fingerprint=fingerprint)
        return simulation.run()


def main(argv=None) -> int:
    return run_app("apps.train", build_parser, run, argv)
