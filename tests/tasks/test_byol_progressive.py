"""byol-vit and byol-r50-lars: their tiny presets, every Progressive Scaling form the paper uses
(Fig. 6's four arms, the waterfall, the smooth ramp), the momentum after a transition, both heads,
and a probe that cannot touch the run it measures."""

import json

import pytest
import torch
from typer.testing import CliRunner

from emarule.cli.main import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def run(tmp_path, name, *args):
    out = tmp_path / name
    res = runner.invoke(app, ["run", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "eval"], out


def per_epoch(rows, key):
    """{epoch in progress: the values `key` took during it} (a row's epoch is its step's end)."""
    out = {}
    for r in rows:
        e = int(r["epoch"] - 1e-9)
        out.setdefault(e, set()).add(round(r[key], 10))
    return out


VIT = ["byol-vit", "--preset", "tiny", "--set", "schedule.epochs=2"]  # step at epoch 1


@pytest.mark.parametrize("arm,extra,batches,rhos", [
    ("progressive+rule", [], [32, 64], [0.97, 0.97**2]),
    ("rule only", ["--progressive", "constant"], [64, 64], [0.97**2, 0.97**2]),
    ("progressive only", ["--no-ema-rule"], [32, 64], [0.97, 0.97]),
    ("neither", ["--progressive", "constant", "--no-ema-rule"], [64, 64], [0.97, 0.97]),
])
def test_fig6_four_arms(tmp_path, arm, extra, batches, rhos):
    train, evals, _ = run(tmp_path, "r", *VIT, "--kappa", "2", *extra)
    assert [per_epoch(train, "batch_size")[e] for e in (0, 1)] == [{b} for b in batches], arm
    got = per_epoch(train, "ema_momentum")
    assert [got[e] for e in (0, 1)] == [{round(r, 10)} for r in rhos], arm
    assert all(0.0 <= r["byol_loss"] <= 2.0 and r["probe_loss"] < 10 for r in train)
    assert [r["epoch"] for r in evals] == [1.0, 2.0] and all("probe_top1" in r for r in evals)


def test_waterfall_and_the_momentum_after_the_transition(tmp_path):
    """From 0.5 × 32 = 16, +16 every epoch from epoch 1, capped at κB = 64; after the first
    transition the teacher uses ema.momentum_after_transition as written."""
    train, _, out = run(tmp_path, "w", "byol-vit", "--preset", "tiny", "--kappa", "2", "--set",
                        "schedule.epochs=4", "--progressive", "incremental:1,16,1,0.5",
                        "--set", "ema.momentum_after_transition=0.9")
    b = per_epoch(train, "batch_size")
    assert [b[e] for e in range(4)] == [{16}, {32}, {48}, {64}]
    rho = per_epoch(train, "ema_momentum")
    assert rho[0] == {round(0.97**0.5, 10)} and all(rho[e] == {0.9} for e in (1, 2, 3))
    assert json.loads((out / "hparams.json").read_text())["progressive"]["from_kappa"] == 0.5
    ck = torch.load(out / "checkpoint.pt", weights_only=False)  # the probe resumes: weights and Adam state
    assert ck["task_state"]["steps"] == ck["clock"]["step"] and "probe.fc.weight" in ck["model"]
    assert ck["task_state"]["exp_avg"]["probe_grad/weight"].shape == ck["model"]["probe.fc.weight"].shape


def test_r50_lars_tiny_smooth_ramp_and_layernorm_heads(tmp_path):
    train, evals, out = run(tmp_path, "s", "byol-r50-lars", "--preset", "tiny", "--kappa", "4",
                            "--set", "model.head_norm=layernorm")
    b = per_epoch(train, "batch_size")
    assert [b[e] for e in range(4)] == [{32}, {32}, {80}, {128}]  # smooth from epoch 1 to 3
    k = per_epoch(train, "kappa")
    assert [k[e] for e in range(4)] == [{1}, {1}, {2.5}, {4}]
    base = [r["lr"] / r["kappa"] for r in train if r["epoch"] > 1]  # LARS lr linear in κ: the base
    assert base == sorted(base, reverse=True) and max(base) <= 2.0  # schedule's cosine, ≤ the peak 2
    h = json.loads((out / "hparams.json").read_text())
    assert h["task"]["arch"] == "resnet50" and h["task"]["feature_dim"] == 64 and h["task"]["head_norm"] == "layernorm"
    assert h["spec"]["optimizer"]["name"] == "lars" and evals and "probe_top1" in evals[-1]


def test_probe_lr_cannot_change_the_run_it_measures(tmp_path):
    """The probe trains outside the run's optimizer: its learning rate leaves BYOL's trajectory
    bitwise unchanged, and changes the probe."""
    a, ea, _ = run(tmp_path, "a", *VIT, "--kappa", "2")
    b, eb, _ = run(tmp_path, "b", *VIT, "--kappa", "2", "--set", "probe.lr=0.3")
    assert [r["byol_loss"] for r in a] == [r["byol_loss"] for r in b]
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    assert [r["probe_loss"] for r in a] != [r["probe_loss"] for r in b]
