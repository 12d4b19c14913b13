"""Train the MNIST-1D baselines on CPU with the app's default recipes; print one JSON line of results.

Run by test_train_quality.py in a subprocess with single-threaded BLAS (small
matrices run several times faster that way on 2 cores), or by hand:

    OPENBLAS_NUM_THREADS=1 python tests/apps/train/mnist1d_quality.py
"""

import json
import time

from apps.train.app import RECIPES
from apps.train.data import generate_mnist1d
from apps.train.models import mnist1d_cnn, mnist1d_mlp
from apps.train.trainer import TrainConfig, Trainer, fit, init_train_state

MODELS = {"mlp": mnist1d_mlp, "cnn": mnist1d_cnn}
SEEDS = (0, 1, 42)


def recipe_config(name, seed):
    """The ``TrainConfig`` that ``python -m apps.train --model NAME --seed SEED`` trains with."""
    recipe = RECIPES[name]
    return TrainConfig(optimizer=recipe["optimizer"], lr=recipe["lr"], weight_decay=recipe["weight_decay"],
                       warmup_steps=recipe["warmup"],
                       total_steps=recipe["steps"] if recipe["schedule"] == "cosine" else None,
                       global_batch_size=recipe["batch_size"], seed=seed)


def main():
    dataset = generate_mnist1d()
    results = {}
    for name, make_model in MODELS.items():
        runs = []
        for seed in SEEDS:
            trainer = Trainer(make_model(), recipe_config(name, seed))
            state = init_train_state(trainer)
            start = time.perf_counter()
            history = fit(trainer, state, dataset, RECIPES[name]["steps"])
            runs.append({"seed": seed, "test_accuracy": history["test_accuracy"][-1],
                         "wall_seconds": time.perf_counter() - start})
        results[name] = {"runs": runs, "n_params": trainer.model.n_params,
                         "mean_test_accuracy": sum(r["test_accuracy"] for r in runs) / len(runs)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
