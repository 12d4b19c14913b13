"""The scaling model (python -m hpcgpu.bench model): recipes checked by hand, invariants, and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hpcgpu.bench.__main__ import main as bench_main
from hpcgpu.errors import ConfigurationError
from hpcgpu.bench.model import (Machine, default_recipes, halo_face_bytes, predict, predict_series,
                                ring_allreduce_seconds, split_neighbours, validate, with_measurement)


def test_halo_bytes_of_a_known_decomposition():
    """Shallow water 4096 x 8192 fp64 (h, u, v, halo 2) on 4 x 4 GPUs, a node tile of 4 x 2::

        axis 0 (rows, walls):   4 ranks; tile spans all 4  -> 2 neighbours, both in the node
        axis 1 (cols, periodic): 4 ranks; tile spans 2     -> corner rank: 1 in the node, 1 across
        local block 1024 x 2048; a message across axis 0 is 2048 cols x 2 x 3 x 8 B = 98,304 B,
        across axis 1 it is 1024 rows x 2 x 3 x 8 B = 49,152 B.
    """
    assert split_neighbours((4, 4), (4, 2), (False, True)) == [(2, 0), (1, 1)]
    assert halo_face_bytes((1024, 2048), 0, 2, 3, 8) == 2048 * 2 * 3 * 8
    assert halo_face_bytes((1024, 2048), 1, 2, 3, 8) == 1024 * 2 * 3 * 8
    swe = default_recipes()["swe"]
    p = predict(swe, 16, "strong", Machine(), dims=(4, 4))
    # The chosen tile for 4 x 4 is the one with the cheapest exchange; with 8 GPUs per node every
    # candidate puts some neighbours across nodes, so both kinds of traffic appear.
    assert p.inter_bytes > 0 and p.intra_bytes > 0
    per_exchange = {(4, 2): (2 * 98304 + 49152, 49152), (2, 4): (2 * 49152 + 98304, 98304)}[p.node_tile]
    assert p.intra_bytes == 3 * per_exchange[0] and p.inter_bytes == 3 * per_exchange[1]


def test_two_rank_wall_axis_has_one_neighbour_and_a_periodic_pair_two():
    assert split_neighbours((2, 1), (2, 1), (False, False)) == [(1, 0), (0, 0)]
    assert split_neighbours((2, 1), (2, 1), (True, False)) == [(2, 0), (0, 0)]
    assert split_neighbours((16, 1), (8, 1), (True, False)) == [(1, 1), (0, 0)]
    assert split_neighbours((16, 1), (1, 1), (True, False)) == [(0, 2), (0, 0)]


def test_jacobi_two_gpus_by_hand():
    """16384^2 fp32 split in two periodic row bands: two 64 KiB messages, one NVLink latency."""
    machine = Machine(overlap="none")
    p = predict(default_recipes()["jacobi"], 2, "strong", machine, dims=(2, 1))
    assert p.intra_bytes == 2 * 16384 * 4 and p.inter_bytes == 0
    assert p.communication == pytest.approx(machine.intra_latency + 2 * 16384 * 4 / machine.intra_bandwidth)
    assert p.seconds_per_step == pytest.approx(0.574e-3 / 2 + p.communication)


def test_ring_allreduce_formula():
    assert ring_allreduce_seconds(1e9, 1, 100e9, 5e-6) == 0.0
    assert ring_allreduce_seconds(1e9, 4, 100e9, 0.0) == pytest.approx(2 * 3 / 4 * 1e9 / 100e9)
    assert ring_allreduce_seconds(0.0, 4, 100e9, 5e-6) == pytest.approx(6 * 5e-6)
    # Two GPUs, 1 GiB at the measured 332 GB/s bus bandwidth: DEVICE.md's 3.24 ms.
    assert ring_allreduce_seconds(2 ** 30, 2, 332e9, 0.0) == pytest.approx(3.24e-3, rel=0.01)


def test_training_across_nodes_uses_the_slowest_link():
    recipe = default_recipes()["train-fp32"]
    machine = Machine(overlap="none")
    inside = predict(recipe, 8, "weak", machine)
    across = predict(recipe, 16, "weak", machine)
    assert inside.communication == pytest.approx(ring_allreduce_seconds(recipe.gradient_bytes, 8, 332e9, 6e-6))
    assert across.communication == pytest.approx(ring_allreduce_seconds(recipe.gradient_bytes, 16, 200e9, 10e-6))


@pytest.mark.parametrize("name", ["jacobi", "swe", "heat3d", "md", "train-fp32", "train-fp16"])
@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_one_gpu_prediction_is_the_measured_input(name, mode):
    recipe = default_recipes()[name]
    p = predict(recipe, 1, mode, Machine())
    assert p.seconds_per_step == recipe.seconds_per_step
    assert p.communication == 0 and p.efficiency == 1.0


@pytest.mark.parametrize("overlap", ["interior", "none"])
@pytest.mark.parametrize("name", ["jacobi", "swe", "heat3d"])
def test_weak_stencil_efficiency_is_non_increasing(name, overlap):
    series = predict_series(default_recipes()[name], [1, 2, 4, 8, 16, 64, 512], "weak", Machine(overlap=overlap))
    efficiencies = [p.efficiency for p in series]
    assert efficiencies[0] == 1.0
    assert all(later <= earlier + 1e-12 for earlier, later in zip(efficiencies, efficiencies[1:]))
    if overlap == "none":
        assert efficiencies[-1] < 1.0


def test_overlap_hides_at_most_the_interior():
    recipe = default_recipes()["jacobi"]
    none = predict(recipe, 512, "strong", Machine(overlap="none"))
    interior = predict(recipe, 512, "strong", Machine(overlap="interior"))
    full = predict(recipe, 512, "strong", Machine(overlap="full"))
    assert none.seconds_per_step >= interior.seconds_per_step >= full.seconds_per_step
    assert interior.hidden <= interior.compute


def test_validation_reports_every_measurement_with_an_error():
    rows = validate(default_recipes(), Machine())
    assert len(rows) == 8
    assert all(math.isfinite(row["error"]) for row in rows)


def test_measured_summary_replaces_the_input(tmp_path):
    summary = {"app": "apps.stencil", "model": "jacobi", "n_ranks": 1, "steps": 10, "wall_seconds": 2.0,
               "precision": "float64", "decomposition": {"global_shape": [1024, 512]},
               "timers": {"communication": {"mean": 0.0}, "compute": {"mean": 1.9}}}
    recipes, name = with_measurement(default_recipes(), summary)
    assert name == "jacobi" and recipes["jacobi"].shape == (1024, 512) and recipes["jacobi"].itemsize == 8
    assert predict(recipes["jacobi"], 1, "strong", Machine()).seconds_per_step == pytest.approx(0.2)
    with pytest.raises(ConfigurationError, match="one-rank"):
        with_measurement(default_recipes(), {**summary, "n_ranks": 2})


@pytest.mark.parametrize("argv, message", [(["--apps", "lbm"], "--apps"), (["--gpus", "0,2"], "--gpus"),
                                            (["--nic-gbits", "0"], "--nic-gbits"),
                                            (["--measured", "/nonexistent.json"], "--measured")])
def test_cli_bad_input_says_what_to_change(argv, message, capsys):
    assert bench_main(["model", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_prints_tables_and_writes_json(tmp_path, capsys):
    out = tmp_path / "model.json"
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"app": "apps.md", "n_ranks": 1, "steps": 100, "wall_seconds": 1.0,
                                   "throughput": 1e8, "timers": {}}))
    assert bench_main(["model", "--gpus", "1,2,16", "--json", str(out), "--measured", str(summary),
                       "--gpus-per-node", "4"]) == 0
    printed = capsys.readouterr().out
    assert "4 GPUs per node" in printed and "strong scaling" in printed and "Validation" in printed
    document = json.loads(out.read_text())
    assert set(document["predictions"]) == {"jacobi", "swe", "heat3d", "md", "train-fp32", "train-fp16"}
    md = document["predictions"]["md"]["weak"]
    assert [p["n_gpus"] for p in md] == [1, 2, 16] and md[2]["n_nodes"] == 4
    assert md[0]["seconds_per_step"] == pytest.approx(0.01)
    assert document["machine"]["gpus_per_node"] == 4 and len(document["validation"]) == 8


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "model.png"
    assert bench_main(["model", "--apps", "jacobi,md", "--gpus", "1,8", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recipe_change_is_local():
    """replace() on a frozen recipe leaves the defaults alone (the validation cases rely on it)."""
    recipes = default_recipes()
    changed = replace(recipes["md"], n_atoms=1.0)
    assert default_recipes()["md"].n_atoms == 2.048e6 and changed.n_atoms == 1.0
