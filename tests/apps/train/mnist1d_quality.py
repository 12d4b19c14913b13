"""Train the MNIST-1D baselines on CPU with the app's default recipes; print one JSON line of results.

Run by test_train_quality.py in a subprocess with single-threaded BLAS (small
matrices run several times faster that way on 2 cores), or by hand:

    OPENBLAS_NUM_THREADS=1 python tests/apps/train/mnist1d_quality.py
"""

import json
import time

from apps.train.app import build_parser, recipe_defaults, train_config
from apps.train.data import generate_mnist1d
from apps.train.models import mnist1d_cnn, mnist1d_mlp
from apps.train.trainer import Trainer, fit, init_train_state
from hpcgpu.app.cli import FrozenOptions, parse_args

MODELS = {"mlp": mnist1d_mlp, "cnn": mnist1d_cnn}
SEEDS = (0, 1, 42)


def recipe(name, seed):
    """``(TrainConfig, steps)`` of ``python -m apps.train --model NAME --seed SEED``."""
    options = parse_args(build_parser(), ["--model", name, "--seed", str(seed)])
    options = FrozenOptions(options, **recipe_defaults(options))
    return train_config(options), options.steps


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
            history = fit(trainer, state, dataset, steps)
            runs.append({"seed": seed, "test_accuracy": history["test_accuracy"][-1],
                         "wall_seconds": time.perf_counter() - start})
        results[name] = {"runs": runs, "n_params": trainer.model.n_params,
                         "mean_test_accuracy": sum(r["test_accuracy"] for r in runs) / len(runs)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
