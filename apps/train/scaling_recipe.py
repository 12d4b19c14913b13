"""The training app's scaling recipe for ``python -m hpcgpu.bench scaling --app train``.

Data parallel: strong keeps the global ``--batch-size``; weak multiplies it by N / N0 so each rank keeps
the baseline's samples per step. Registered when :func:`hpcgpu.bench.recipes.scaling_recipes` imports it.
"""

from __future__ import annotations

from hpcgpu.bench.recipes import RunPlan, ScalingRecipe, register_scaling_recipe, split_known

DEFAULT_ARGS = ("--model", "mlp", "--steps", "50", "--batch-size", "128", "--eval-every", "0", "--no-plot")


def plan_train(ranks: list[int], mode: str, args: list[str]) -> list[RunPlan]:
    """Runs of a ``mode`` series over ``ranks`` for the training flags ``args``."""
    known, rest = split_known(args, ["--batch-size"])
    batch = int(known.batch_size)
    plans = []
    for n in ranks:
        global_batch = batch * n // ranks[0] if mode == "weak" else batch
        plans.append(RunPlan(n, ["--batch-size", str(global_batch)] + rest, global_batch, "samples/step",
                             f"global batch {global_batch}"))
    return plans


register_scaling_recipe("train", ScalingRecipe(module="apps.train", default_args=DEFAULT_ARGS, plan_fn=plan_train))
