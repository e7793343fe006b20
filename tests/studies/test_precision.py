"""The numerical-stability appendix: dtype runs of a regression with a Polyak-Ruppert EMA."""

import json

import pytest
import torch
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.studies.precision import Config, batches, max_abs_diff, problem, study, train
from emarule.scaling.limits import limits

SMALL = Config(features=8, samples=256, steps=200, batch=32, lr=0.05, noise=0.1,
               momenta=(0.9, 0.99, 0.999, 0.99999), repeats=2, seed=3)


@pytest.fixture(scope="module")
def runs():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield study(SMALL)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rho,gap", [(0.999, 1.0), (0.999, 4.0), (0.99, 0.125), (0.99, 1.0), (0.99999, 128.0),
                                     (0.9999, 128.0)])
def test_bf16_ema_step_is_lost_where_limits_says(rho, gap):
    """ζ = 1 (the bottom of its binade, where half an ulp is 2^-8), θ = 1 + r: the bf16 lerp keeps ζ
    exactly when (1 − ρ)·r < 2^-8, the bound `emarule limits --dtype bfloat16 --relative-gap r` uses."""
    zeta = torch.ones(1, dtype=torch.bfloat16)
    theta = torch.tensor([1.0 + gap], dtype=torch.bfloat16)
    assert theta.item() == 1.0 + gap  # exactly representable, so only the EMA step rounds
    moved = zeta.clone().lerp_(theta, 1.0 - rho).item() != 1.0
    lost_per_limits = limits(rho, 64, "bfloat16", relative_gap=gap).kappa_update > 1
    assert moved == (not lost_per_limits)
    assert moved == ((1 - rho) * gap > 2.0**-8)


def test_max_abs_diff_is_over_weights():
    a = torch.tensor([[0.0, 1.0, -2.0], [1.0, 1.0, 1.0]])
    b = torch.tensor([[0.5, 1.0, 1.0], [1.0, 1.0, 1.0]])
    assert max_abs_diff(a, b).tolist() == [3.0, 0.0]


def test_batches_cover_each_epoch_once():
    idx = batches(SMALL, 0)
    assert idx.shape == (SMALL.steps, SMALL.repeats, SMALL.batch)
    per_epoch = SMALL.samples // SMALL.batch
    epoch = idx[:per_epoch, 0].flatten()
    assert sorted(epoch.tolist()) == list(range(SMALL.samples))


def test_fp32_training_converges_and_is_deterministic():
    data, order = problem(SMALL), batches(SMALL, 1)
    first, again = train(SMALL, "fp32", order, data), train(SMALL, "fp32", order, data)
    assert torch.equal(first.theta, again.theta) and torch.equal(first.zeta, again.zeta)
    x, y, _ = data
    w = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
    assert max_abs_diff(first.theta, w).max() < 0.05  # SGD reached the least-squares weights
    assert first.lost.max() < 0.05  # fp32 loses (almost) no EMA update here


def test_precision_ordering_and_second_fp32_runs(runs):
    ref = runs["fp32"]
    diff = {name: max_abs_diff(r.zeta, ref.zeta).mean().item() for name, r in runs.items()}
    assert diff["fp32"] == 0.0
    assert 0.0 < diff["fp32_reorder"] < 1e-5  # rounding-level only
    assert diff["fp32_reorder"] < diff["fp32_seed"] < diff["fp16"] < diff["bf16"]
    assert diff["bf16_ema"] > diff["fp16_ema"]


def test_bf16_ema_loses_its_updates_where_limits_predicts(runs):
    """With the model in fp32, a bf16 EMA whose step (1 − ρ)·r (r from the fp32 run) is under 2^-9 loses
    most updates and settles where its step is half an ulp; above 2^-8 it keeps (almost) all of them."""
    fp32, held = runs["fp32"], runs["bf16_ema"]
    seen = set()
    for i, rho in enumerate(SMALL.momenta):
        step = (1 - rho) * fp32.gap[i].item()
        if step < 2.0**-9:
            seen.add("lost")
            assert held.lost[i] > 0.5
            assert 2.0**-10 < (1 - rho) * held.gap[i].item() < 2.0**-7
        elif step > 2.0**-8:
            seen.add("kept")
            assert held.lost[i] < 0.05
    assert seen == {"lost", "kept"}


def test_small_preset_end_to_end(tmp_path):
    r = CliRunner().invoke(app, ["run", "precision", "--preset", "small", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "results.json").read_text())
    runs = {rec["run"] for rec in d["records"]}
    assert runs == {"bf16", "fp16", "bf16_ema", "fp16_ema", "fp32_reorder", "fp32_seed"}
    assert {rec["momentum"] for rec in d["records"]} == {0.9, 0.99, 0.999, 0.9999, 0.99999}
    assert [b["momentum"] for b in d["bf16_limits"]] == [0.9, 0.99, 0.999, 0.9999, 0.99999]
    assert (tmp_path / "figures" / "precision.png").read_bytes()[:4] == b"\x89PNG"
    assert "MaxAbsDiff" in (tmp_path / "table.txt").read_text()


def test_tiny_preset_end_to_end(tmp_path):
    r = CliRunner().invoke(app, ["run", "precision", "--preset", "tiny", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "results.json").read_text())
    assert {rec["momentum"] for rec in d["records"]} == {0.9, 0.999}
    assert (tmp_path / "figures" / "precision.png").read_bytes()[:4] == b"\x89PNG"
