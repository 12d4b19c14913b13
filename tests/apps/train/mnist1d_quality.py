"""Train the MNIST-1D baselines on CPU with the app's default recipes; print one JSON line of results.

Run by test_train_quality.py in a subprocess with single-threaded BLAS (small
matrices run several times faster that way on 2 cores), or by hand:

    OPENBLAS_NUM_THREADS=1 python tests/apps/train/mnist1d_quality.py
"""

import json
import time

import numpy as np

from apps.train.app import build_parser, recipe_defaults, train_config
from apps.train.data.dataset import generate_mnist1d, global_batches
from apps.train.nn.models import mnist1d_cnn, mnist1d_mlp
from apps.train.training.trainer import Trainer, evaluate, init_train_state, train_step
from hpcgpu.app.cli import FrozenOptions, parse_args

MODELS = {"mlp": mnist1d_mlp, "cnn": mnist1d_cnn}
SEEDS = (0, 1, 42)


def recipe(name, seed):
    """``(TrainConfig, steps)`` of ``python -m apps.train --model NAME --seed SEED``."""
    options = parse_args(build_parser(), ["--model", name, "--seed", str(seed)])
    options = FrozenOptions(options, **recipe_defaults(options))
    return train_config(options), options.steps


def train_and_evaluate(trainer, state, dataset, n_steps):
    """Train one process for ``n_steps`` on a :class:`apps.train.data.dataset.Dataset`; the final test accuracy.

    The batches of the app on one rank: a global shuffle per epoch from ``(seed, epoch)``, the
    incomplete last batch dropped, epochs rolling over.
    """
    config = trainer.config
    n_train = int(dataset.x.shape[0])
    batches_per_epoch = n_train // config.global_batch_size
    sample_index = np.arange(config.global_batch_size, dtype=np.int64)
    epoch_cache = (None, None)
    for _ in range(n_steps):
        epoch, batch_number = divmod(state.step, batches_per_epoch)
        if epoch_cache[0] != epoch:
            epoch_cache = (epoch, global_batches(n_train, config.global_batch_size, config.seed, epoch))
        indices = np.asarray(epoch_cache[1][batch_number])
        train_step(trainer, state, dataset.x[indices], dataset.y[indices], sample_index)
    return evaluate(trainer, state, dataset.x_test, dataset.y_test)[1]


def main():
    dataset = generate_mnist1d()
    results = {}
    for name, make_model in MODELS.items():
        runs = []
        for seed in SEEDS:
            config, steps = recipe(name, seed)
            trainer = Trainer(make_model(), config)
            state = init_train_state(trainer)
            start = time.perf_counter()
            accuracy = train_and_evaluate(trainer, state, dataset, steps)
            runs.append({"seed": seed, "test_accuracy": accuracy,
                         "wall_seconds": time.perf_counter() - start})
        results[name] = {"runs": runs, "n_params": trainer.model.n_params,
                         "mean_test_accuracy": sum(r["test_accuracy"] for r in runs) / len(runs)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
