"""The loop: Progressive Scaling at the right samples seen, EMA placement, optimizers, precision, logs."""

import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from emarule.engine import optimizers
from emarule.errors import UserError
from emarule.scaling import scale
from emarule.engine.schedules import from_spec
from emarule.engine.interface import TaskParts
from emarule.engine.loop import train
from engine_util import ROOT, load_checkpoint, make_ctx, run_toy, toy_spec


def rows_of(run_dir, kind="train"):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_progressive_scaling_changes_batch_lr_and_momentum_at_the_right_samples_seen(tmp_path):
    """step:2 at κ=4 with AdamW: B, √κ·η, β̂ and ρ^κ switch at exactly 2 epochs (256 samples)."""
    spec = toy_spec(**{"optimizer": {"name": "adamw", "lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8,
                                     "weight_decay": 0.01, "weight_decay_skip_bias": True},
                       "ema.momentum": 0.9})
    prog = {"kind": "step", "epoch": 2}
    _, ctx = run_toy(tmp_path, spec, kappa=4, progressive=prog)
    sched = from_spec(ctx.spec, 128)
    base, big = scale(ctx.spec, 1), scale(ctx.spec, 4)
    rows = rows_of(ctx.out)
    assert [r["samples_seen"] for r in rows] == list(range(16, 257, 16)) + list(range(320, 513, 64))
    for r in rows:
        p, b, k = (base, 16, 1.0) if r["samples_seen"] <= 256 else (big, 64, 4.0)
        assert (r["batch_size"], r["kappa"]) == (b, k)
        start = (r["samples_seen"] - b) / 128  # the lr of a step: its start, and in the warm-up its end
        assert r["lr"] == pytest.approx(sched.lr(start, p, b / 128), rel=1e-12)
        assert r["ema_momentum"] == pytest.approx(p["ema.momentum"])
    assert rows[-1]["ema_momentum"] == pytest.approx(0.9**4)
    assert rows[0]["lr"] == pytest.approx(0.01 / 8)  # warm-up step 1 of 8 (1 epoch of 128 / 16), not 0
    # optimizer state at the end: the plan's values for κ = 4, re-derived from the base spec
    groups = load_checkpoint(ctx.out)["optimizer"]["param_groups"]
    assert all(tuple(g["betas"]) == pytest.approx(tuple(big["optimizer.betas"])) for g in groups)
    assert all(g["eps"] == pytest.approx(big["optimizer.eps"]) for g in groups)
    assert sorted(g["weight_decay"] for g in groups) == [0.0, pytest.approx(big["optimizer.weight_decay"])]
    hp = json.loads((ctx.out / "hparams.json").read_text())
    assert [(s["start_epoch"], s["batch_size"], s["kappa"]) for s in hp["layout"]] == [(0.0, 16, 1.0), (2.0, 64, 4.0)]
    assert hp["kappa"] == 4 and len(hp["stages"]) == 2 and hp["world_size"] == 1
    # evaluation once per epoch (eval.every_epochs = 1), on the same time axis
    assert [r["epoch"] for r in rows_of(ctx.out, "eval")] == [1.0, 2.0, 3.0, 4.0]


def test_remainder_is_dropped_and_epochs_end_on_whole_numbers(tmp_path):
    spec = toy_spec(**{"toy.samples": 100, "schedule.epochs": 2})  # 100 = 6 × 16 + 4
    _, ctx = run_toy(tmp_path, spec)
    assert [r["samples_seen"] for r in rows_of(ctx.out)] == [16, 32, 48, 64, 80, 100, 116, 132, 148, 164, 180, 200]


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)


def linear_parts(seen: list):
    torch.manual_seed(0)
    model = Linear()
    x, y = torch.randn(32, 3), torch.randn(32, 1)

    def loss(m, teacher, batch, now=None):
        seen.append([p.detach().clone() for p in m.parameters()])
        xb, yb = batch
        return nn.functional.mse_loss(m.lin(xb), yb), {}

    return TaskParts(model=model, ema_source=model, train_set=list(zip(x, y, strict=True)), loss=loss)


class SlowItems(torch.utils.data.Dataset):
    """linear_parts' items, each taking 20 ms to make: a loader far slower than the step."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import time

        time.sleep(0.02)
        return self.items[i]


def test_each_train_row_logs_the_time_spent_waiting_for_batches(tmp_path):
    spec = toy_spec(**{"optimizer": {"name": "sgd", "lr": 0.1}, "schedule": {"kind": "constant", "epochs": 2},
                       "batch.size": 8})  # 4 steps an epoch: with 50 or fewer, every step is logged
    ctx = make_ctx(tmp_path, spec)
    parts = linear_parts([])
    parts.train_set = SlowItems(parts.train_set)
    train(ctx, parts)
    got = [(r["data_wait_s"], r["wall_s"]) for r in rows_of(ctx.out)]
    assert len(got) == 8  # 4 steps an epoch, a row each
    waits = [w for w, _ in got]
    assert waits == sorted(waits) and waits[0] >= 8 * 0.02  # cumulative; the first batch alone is 8 items
    assert waits[-1] >= 32 * 2 * 0.02 and all(w <= wall for w, wall in got)
    assert waits[-1] > 0.8 * got[-1][1]  # the sleeps are nearly all of this loop's time


@pytest.mark.parametrize("update_from", ["pre", "post"])
def test_ema_averages_theta_t_for_pre_and_theta_t_plus_1_for_post(tmp_path, update_from):
    spec = toy_spec(**{"optimizer": {"name": "sgd", "lr": 0.1}, "schedule": {"kind": "constant", "epochs": 1},
                       "ema.momentum": 0.5, "ema.update_from": update_from, "batch.size": 16})
    ctx = make_ctx(tmp_path, spec)
    seen: list = []
    train(ctx, linear_parts(seen))
    ck = load_checkpoint(ctx.out)
    theta0, theta1 = seen
    theta2 = list(ck["model"].values())
    zeta = list(ck["emas"]["ema"]["module"].values())
    rho = 0.5
    for i in range(2):
        want = (rho * theta0[i] + (1 - rho) * theta1[i]) if update_from == "pre" else \
            (rho * (rho * theta0[i] + (1 - rho) * theta1[i]) + (1 - rho) * theta2[i])
        torch.testing.assert_close(zeta[i], want)


def test_teacher_is_the_ema_copy_in_the_loss(tmp_path):
    spec = toy_spec(**{"schedule.epochs": 1})
    ctx = make_ctx(tmp_path, spec)
    from emarule.tasks import toy

    parts = toy.make_parts(ctx)
    inner, teachers, weights = parts.loss, [], []

    def loss(model, teacher, batch, now=None):
        teachers.append(teacher)
        weights.append([p.detach().clone() for p in teacher.parameters()])
        assert teacher is not model and not any(p.requires_grad for p in teacher.parameters())
        return inner(model, teacher, batch, now)

    parts.loss = loss
    initial = [p.detach().clone() for p in parts.model.parameters()]
    train(ctx, parts)
    assert len({id(t) for t in teachers}) == 1 and len(weights) >= 3
    # the live EMA: it starts as the model's copy, moves at every step, and ends as the saved EMA
    for got, want in zip(weights[0], initial, strict=True):
        torch.testing.assert_close(got, want)
    assert all(any(not torch.equal(a, b) for a, b in zip(w0, w1, strict=True))
               for w0, w1 in zip(weights, weights[1:], strict=False))
    saved = list(load_checkpoint(ctx.out)["emas"][parts.teacher]["module"].values())
    for got, want in zip(teachers[0].parameters(), saved, strict=True):
        torch.testing.assert_close(got.detach(), want)


@pytest.mark.parametrize("name,extra", [
    ("sgd", {"momentum": 0.9, "nesterov": True}),
    ("adam", {"betas": [0.9, 0.999], "eps": 1e-8}),
    ("adamw", {"betas": [0.9, 0.999], "eps": 1e-8}),
    ("rmsprop", {"alpha": 0.99, "eps": 1e-8}),
    ("lars", {"momentum": 0.9, "trust_coefficient": 0.001}),
    ("lamb", {"betas": [0.9, 0.999], "eps": 1e-6}),
])
def test_every_optimizer_trains_with_no_decay_groups(tmp_path, name, extra):
    spec = toy_spec(**{"optimizer": {"name": name, "lr": 0.01, "weight_decay": 0.01, "weight_decay_skip_bias": True,
                                     **extra}, "schedule.epochs": 1})
    result, ctx = run_toy(tmp_path, spec, kappa=2)
    assert math.isfinite(result["val_mse"])
    groups = load_checkpoint(ctx.out)["optimizer"]["param_groups"]
    decay = [g for g in groups if not g["no_decay"]][0]
    plain = [g for g in groups if g["no_decay"]][0]
    assert plain["weight_decay"] == 0.0 and decay["weight_decay"] == pytest.approx(ctx.plan["optimizer.weight_decay"])
    if name in ("lars", "lamb"):
        assert decay["lars_adapt"] and not plain["lars_adapt"]


def test_lars_step_matches_its_formula():
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(4, 3))
    p.grad = torch.randn(4, 3)
    p0, g0 = p.detach().clone(), p.grad.clone()
    opt = optimizers.LARS([{"params": [p]}], lr=0.5, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01)
    opt.step()
    g = g0 + 0.1 * p0
    want = p0 - 0.5 * (0.01 * p0.norm() / g.norm()) * g
    torch.testing.assert_close(p.detach(), want)


def test_optimizer_none_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="optimizer.name"):
        run_toy(tmp_path, toy_spec(**{"optimizer": {"name": "none"}, "schedule.epochs": 1}))


def test_bf16_autocast_trains_on_cpu_with_fp32_ema(tmp_path):
    from emarule.tasks import toy

    ctx = make_ctx(tmp_path, toy_spec(**{"precision": "bf16", "schedule.epochs": 1}))
    parts = toy.make_parts(ctx)
    dtypes = []
    inner = parts.loss

    def loss(model, teacher, batch, now=None):
        value, m = inner(model, teacher, batch, now)
        dtypes.append(model(batch[0]).dtype)
        return value, m

    parts.loss = loss
    result = train(ctx, parts)
    assert math.isfinite(result["val_mse"]) and set(dtypes) == {torch.bfloat16}
    ck = load_checkpoint(ctx.out)
    assert all(v.dtype == torch.float32 for v in ck["emas"]["ema"]["module"].values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_ema_held_in_low_precision_is_refused_before_anything_is_written(tmp_path, precision):
    # the loop's evaluations forward the EMA on float32 batches, which a bfloat16 EMA cannot take
    with pytest.raises(UserError, match="ema.dtype bfloat16"):
        run_toy(tmp_path, toy_spec(**{"precision": precision, "ema.dtype": "bfloat16", "schedule.epochs": 1}))
    written = [p.name for p in (tmp_path / "run").iterdir()] if (tmp_path / "run").exists() else []
    assert not [n for n in written if not n.startswith(".")], written


def test_bn_momentum_follows_the_plan_when_bn_scale(tmp_path):
    from emarule.tasks import toy

    spec = toy_spec(**{"toy.batchnorm": True, "norm": {"bn_momentum": 0.9, "bn_scale": True}, "schedule.epochs": 1})
    ctx = make_ctx(tmp_path, spec, kappa=4)
    parts = toy.make_parts(ctx)
    train(ctx, parts)
    bn = [m for m in parts.model.modules() if isinstance(m, nn.BatchNorm1d)][0]
    assert bn.momentum == pytest.approx(1 - 0.9**4)


def test_wandb_offline_mirror(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    _, ctx = run_toy(tmp_path, toy_spec(**{"schedule.epochs": 1}), wandb="offline")
    assert (ctx.out / "wandb-id.txt").exists()
    assert list((ctx.out / "wandb").glob("offline-run-*"))


def test_engine_modules_stay_out_of_torch_free_commands():
    code = ("import sys, emarule.cli.main, emarule.engine.schedules, emarule.engine.rundir, emarule.scaling; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_ema_start_steps_counts_base_batches_of_data(tmp_path):
    """ema.start_steps = 3 at B = 16 starts the EMA after 48 samples at every κ: at κ=2 (32 a step) the
    first step's EMA is a copy and the second averages, where round(3 / 2) = 2 steps would copy twice."""
    spec = toy_spec(**{"schedule.epochs": 1, "ema.start_steps": 3})
    _, ctx = run_toy(tmp_path, spec, kappa=2, log_every_steps=1)
    assert ctx.cfg.batch.size == 16
    rows = [json.loads(x) for x in (ctx.out / "metrics.jsonl").read_text().splitlines()]
    rhos = [r["ema_momentum"] for r in rows if r["kind"] == "train"]
    assert rhos[:1] == [0.0] and rhos[1] == pytest.approx(0.9**2)


def test_non_finite_gradient_stops_without_clipping(tmp_path):
    """A finite loss whose backward overflows: the run stops before any step, and says so."""
    from emarule.errors import TrainingDiverged

    class InfGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("inf")

    spec = toy_spec(**{"optimizer": {"name": "sgd", "lr": 0.1}, "schedule": {"kind": "constant", "epochs": 1}})
    ctx = make_ctx(tmp_path, spec)
    seen: list = []
    parts = linear_parts(seen)
    before = [p.detach().clone() for p in parts.model.parameters()]

    def loss(m, teacher, batch, now=None):
        xb, _ = batch
        return InfGrad.apply(m.lin(xb)).mean(), {}

    parts.loss = loss
    with pytest.raises(TrainingDiverged, match="gradient norm became (inf|nan)"):
        train(ctx, parts)
    assert all(torch.equal(a, b) for a, b in zip(before, parts.model.parameters(), strict=True))  # nothing stepped
    assert not (ctx.out / "checkpoint.pt").exists()


def test_run_says_what_plan_warns_about(tmp_path):
    """A setting that has no effect (a momentum after a transition, with no transition) is said by `run` too."""
    from engine_util import run_cli, toy_spec, write_spec

    spec = toy_spec(**{"schedule.epochs": 1, "ema.momentum_after_transition": 0.5})
    r = run_cli("--spec", str(write_spec(tmp_path, spec)), "--out", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning: ema.momentum_after_transition has no effect without Progressive Scaling" in r.stderr


def test_total_norm_is_torchs_get_total_norm_bit_for_bit():
    from emarule.engine.step import total_norm

    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 45):
        grads = [torch.randn(int(torch.randint(1, 300, (1,), generator=gen)), generator=gen) * 10.0 ** (i % 9 - 4)
                 for i in range(n)]
        assert total_norm(grads) == float(torch.nn.utils.get_total_norm(grads))
    mixed = [torch.randn(5, generator=gen), torch.randn(5, generator=gen).double()]  # torch's grouping path
    assert total_norm(mixed) == float(torch.nn.utils.get_total_norm(mixed))
    assert total_norm([]) == 0.0
