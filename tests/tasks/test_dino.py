"""DINO task: the loss, the center, the schedules, multi-crop data, the head, the tracking probe, runs end to end."""

import copy
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.engine.context import RunContext
from emarule.vision.probe import TrackingProbe, adam_hyperparameters
from emarule.scaling import plan
from emarule.config.load import load_spec
from emarule.tasks import dino as D
from emarule.engine.interface import Now
from emarule.vision import data as VD
from emarule.vision.dino_head import DINOHead
from emarule.vision.multicrop import MultiCropSet
from engine_util import full_size_autocast

runner = CliRunner()


def ctx_for(preset="tiny", overrides=(), kappa=1.0, seed=0, out=Path("unused"), **kw):
    s = load_spec("dino-vit", preset=preset, overrides=list(overrides))
    return RunContext(spec=s, kappa=kappa, ema_rule="exponential", plan=plan(s, kappa), out=out, seed=seed, **kw)


def now_at(epoch=0.0, kappa=1.0, center_momentum=0.9):
    return Now(seen=0, samples=0, epoch=epoch, base_step=0, step=0, kappa=kappa,
               plan={"dino.center_momentum": center_momentum})


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


# --- the loss and its schedules -----------------------------------------------------------------


def test_cross_entropy_puts_the_teacher_distribution_first_and_skips_same_view_pairs():
    g = torch.Generator().manual_seed(0)
    B, K, G, L = 3, 5, 2, 2
    s = torch.randn((G + L) * B, K, generator=g)
    q = F.softmax(torch.randn(G * B, K, generator=g), -1)
    manual, pairs = 0.0, 0
    for a in range(G):
        for v in range(G + L):
            if v == a:
                continue
            qa, sv = q[a * B:(a + 1) * B], s[v * B:(v + 1) * B]
            manual += -(qa * F.log_softmax(sv, -1)).sum(-1).mean()
            pairs += 1
    assert pairs == G * (G + L) - G
    assert D.dino_cross_entropy(s, q, G, G + L).item() == pytest.approx(manual.item() / pairs, rel=1e-6)
    # Teacher first: the value is −Σ q log p_student, not −Σ p_student log q.
    p = F.softmax(s[:G * B], -1)
    wrong = -(p[B:] * q[:B].log()).sum(-1).mean()
    assert D.dino_cross_entropy(s[:G * B], q, G, G).item() != pytest.approx(wrong.item(), rel=1e-3)
    # A student that reproduces the (sharp) teacher on the other view reaches the teacher's entropy.
    onehot = F.one_hot(torch.tensor([1, 3, 0]), K).float()
    q2 = torch.cat([onehot, onehot])
    assert D.dino_cross_entropy(100.0 * q2, q2, 2, 2).item() == pytest.approx(0.0, abs=1e-6)


def test_teacher_temperature_follows_dinos_linspace_by_whole_epochs():
    sched = np.concatenate([np.linspace(0.04, 0.07, 30), np.full(250, 0.07)])
    for e in (0, 0.99, 1, 7.5, 29, 29.9, 30, 100, 279.5):
        assert D.teacher_temperature(e, 0.04, 0.07, 30) == pytest.approx(sched[int(e)])
    assert D.teacher_temperature(0, 0.04, 0.07, 0) == 0.07
    assert D.teacher_temperature(0.5, 0.04, 0.07, 1) == 0.04 and D.teacher_temperature(1, 0.04, 0.07, 1) == 0.07


def test_center_is_an_ema_of_the_batch_means_and_round_trips():
    c = D.Center(4)
    m1, m2 = torch.tensor([1.0, 2, 3, 4]), torch.tensor([0.0, -1, 1, 2])
    c.step(m1, 0.9)
    c.step(m2, 0.9)
    assert torch.allclose(c.value, 0.9 * 0.1 * m1 + 0.1 * m2) and c.updates == 2
    other = D.Center(4)
    other.load_state_dict(copy.deepcopy(c.state_dict()))
    assert torch.equal(other.value, c.value) and other.updates == 2


# --- the model ---------------------------------------------------------------------------------


def test_head_is_dinos_mlp_with_a_unit_norm_last_layer():
    torch.manual_seed(0)
    h = DINOHead(24, 40, hidden=16, bottleneck=8, layers=3)
    assert [type(m).__name__ for m in h.mlp] == ["Linear", "GELU", "Linear", "GELU", "Linear"]
    assert h.last_layer.weight_g is None  # norm_last_layer: the row norms are fixed, not learned
    assert all(float(m.bias.detach().abs().max()) == 0.0 for m in h.mlp if isinstance(m, torch.nn.Linear))
    x = torch.randn(5, 24)
    out = h(x)
    assert out.shape == (5, 40)
    # each output is a cosine between the normalized bottleneck and a unit row: |out| ≤ 1
    assert float(out.detach().abs().max()) <= 1.0 + 1e-5
    v = h.last_layer.weight_v.detach()
    z = F.normalize(h.mlp(x), dim=-1)
    assert torch.allclose(out, z @ (v / v.norm(dim=1, keepdim=True)).T, atol=1e-6)
    assert DINOHead(24, 40, hidden=16, bottleneck=8, norm_last_layer=False).last_layer.weight_g is not None


def test_build_tiny_parts_and_no_decay():
    parts = D.build(ctx_for())
    m = parts.model
    assert parts.ema_source is m.student and parts.teacher == "ema" and parts.progress_metric == "dino_loss"
    assert not any(p.requires_grad for p in m.probe.parameters())  # the probe has its own optimizer
    assert parts.aux_params == set()
    names = dict(m.named_parameters())
    assert parts.no_decay and all(names[n].ndim <= 1 for n in parts.no_decay)
    assert "student.head.last_layer.weight_v" not in parts.no_decay
    assert "student.backbone.cls_token" not in parts.no_decay  # DINO decays it
    assert parts.info["train_size"] == 128 and parts.info["global_crops"] == "2 × 8px"


def test_loss_freezes_the_last_layer_in_the_first_epoch_and_leaves_the_teacher_alone():
    parts = D.build(ctx_for())
    m = parts.model
    teacher = copy.deepcopy(m.student)
    teacher.train()
    batch = torch.utils.data.default_collate([parts.train_set[i] for i in range(8)])
    loss, metrics = parts.loss(m, teacher, batch, now_at(0.5))
    loss.backward()
    assert m.student.head.last_layer.weight_v.grad is None  # frozen in epoch 0
    assert m.student.head.mlp[0].weight.grad is not None and m.student.backbone.cls_token.grad is not None
    assert all(p.grad is None for p in teacher.parameters()) and teacher.training  # mode given back
    assert {"dino_loss", "teacher_temp", "center_momentum", "teacher_entropy", "probe_loss", "probe_train_top1",
            "teacher_mean"} <= set(metrics)
    assert metrics["teacher_mean"].shape == (64,) and metrics["center_momentum"] == 0.9
    assert metrics["teacher_temp"] == pytest.approx(0.04)  # warm-up starts at 0.04
    m.zero_grad()
    loss, metrics = parts.loss(m, teacher, batch, now_at(1.0))
    loss.backward()
    assert m.student.head.last_layer.weight_v.grad is not None
    assert metrics["teacher_temp"] == pytest.approx(0.07)


def test_teacher_runs_without_stochastic_depth():
    parts = D.build(ctx_for(overrides=["model.stochastic_depth=0.5", "model.depth=2"]))
    m = parts.model
    assert m.student.backbone.blocks[-1].drop_path1.drop_prob == pytest.approx(0.5)
    teacher = copy.deepcopy(m.student).train()
    batch = torch.utils.data.default_collate([parts.train_set[i] for i in range(4)])
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        _, metrics = parts.loss(m, teacher, batch, now_at(1.0))
        outs.append(metrics["teacher_mean"])
    assert torch.equal(outs[0], outs[1])  # the teacher's output does not depend on the RNG


# --- multi-crop data -----------------------------------------------------------------------------


def test_multicrop_items_are_a_pure_function_of_seed_epoch_index():
    src = VD.digits(True)
    a = MultiCropSet(src, "dino_digits", 16, 8, seed=3, global_crops=2, local_crops=3)
    b = MultiCropSet(src, "dino_digits", 16, 8, seed=3, global_crops=2, local_crops=3)
    a.set_epoch(4)
    b.set_epoch(4)
    state = torch.get_rng_state()
    first = [a[i] for i in (5, 9)]
    second = [b[i] for i in (9, 5)][::-1]
    assert torch.equal(torch.get_rng_state(), state)
    for (g1, l1, y1), (g2, l2, y2) in zip(first, second, strict=True):
        assert torch.equal(g1, g2) and torch.equal(l1, l2) and y1 == y2
    g, loc, _ = first[0]
    assert g.shape == (2, 3, 16, 16) and loc.shape == (3, 3, 8, 8)
    assert not torch.equal(g[0], g[1]) and not torch.equal(loc[0], loc[1])
    a.set_epoch(5)
    assert not torch.equal(a[5][0], g)
    assert MultiCropSet(src, "dino_digits", 16, 8, 0, 2, 0)[0][1].shape == (0, 3, 8, 8)


def test_multicrop_dino_stack_matches_dinos_transforms():
    src = VD.synthetic(True, 4, 32, 10)
    s = MultiCropSet(src, "dino", 24, 12, 0)
    g1, g2 = s.global_augs
    assert (g1.blur_p, g1.solarize_p, g2.blur_p, g2.solarize_p, s.local_aug.blur_p) == (1.0, 0.0, 0.1, 0.2, 0.5)
    assert g1.crop_scale == (0.4, 1.0) and s.local_aug.crop_scale == (0.05, 0.4) and s.local_crops == 8
    assert g1.flip_p == 0.5 and g1.jitter_p == 0.8 and g1.gray_p == 0.2
    with pytest.raises(Exception, match="data.local_scale"):
        MultiCropSet(src, "dino", 24, 12, 0, local_scale=(0.5, 0.2))


def write_tiny_cifar(root: Path, n_train: int = 6, n_test: int = 4) -> Path:
    """torchvision's pickled CIFAR-10 layout: data_batch_1..5, test_batch, batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(1, 6):
        data = rng.integers(0, 256, (n_train, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n_train)]
        with open(folder / f"data_batch_{k}", "wb") as f:
            pickle.dump({"batch_label": f"training batch {k} of 5", "labels": labels, "data": data}, f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"labels": [i % 10 for i in range(n_test)],
                     "data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8)}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return root


def test_cifar10_pickled_layout_is_read_without_torchvision_checksums(tmp_path):
    root = write_tiny_cifar(tmp_path)
    train, test = VD.load_sources("cifar10", root, 32, None, None, 10)
    assert len(train) == 30 and len(test) == 4 and train.images.shape == (30, 3, 32, 32)
    with open(root / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        raw = pickle.load(f)
    # rows are R, G, B planes of 32×32
    assert torch.equal(train.images[0], torch.from_numpy(raw["data"][0].reshape(3, 32, 32)))
    assert train.label(0) == raw["labels"][0] and test.label(3) == 3
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    res = runner.invoke(app, ["run", "dino-vit", "--data", str(root), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "incomplete or corrupt" in res.output and "Traceback" not in res.output


# --- the tracking probe ----------------------------------------------------------------------------


def test_probe_adam_follows_the_adam_rule_and_clamps_betas():
    lr, b1, b2, eps = adam_hyperparameters(1e-3, 4.0)
    assert (lr, b1, b2, eps) == pytest.approx((2e-3, 0.6, 0.996, 5e-9))
    assert adam_hyperparameters(1e-3, 16.0)[1] == 0.0  # 1 − 16 · 0.1 < 0: clamped


def test_probe_gradient_is_the_cross_entropy_gradient_and_its_steps_are_bounded():
    torch.manual_seed(0)
    probe = TrackingProbe(6, 3, base_lr=1e-2)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    out = probe.train_metrics(x, y)
    ref = copy.deepcopy(probe.module)
    for p in ref.parameters():
        p.requires_grad_(True)
    ref.bn.running_mean.zero_()
    F.cross_entropy(ref(x), y).backward()
    assert torch.allclose(out["probe_grad/weight"], ref.fc.weight.grad, atol=1e-6)
    assert torch.allclose(out["probe_grad/bias"], ref.fc.bias.grad, atol=1e-6)
    before = probe.module.fc.weight.clone()
    huge = {k: v * 1e6 for k, v in out.items() if k.startswith("probe_grad/")}
    probe.step(now_at(kappa=8.0), huge)
    # Adam's first step moves each weight by at most lr·√κ, however large the gradient
    assert float((probe.module.fc.weight - before).abs().max()) <= 1e-2 * math.sqrt(8) * (1 + 1e-5)


def test_probe_keeps_its_pace_in_epochs_at_large_kappa_under_its_adam_rule():
    """κ=8: a batch 8× larger and 8× fewer steps over the same data. Under the Adam rule the probe
    ends near its κ=1 loss; with the base Adam values it falls behind. Neither ever leaves chance."""
    g0 = torch.Generator().manual_seed(0)
    n, d, k = 2048, 32, 10
    base = torch.randn(n, 4, generator=g0)
    x = base @ torch.randn(4, d, generator=g0) + 0.1 * torch.randn(n, d, generator=g0)  # correlated features
    y = (base[:, 0] * 3).long().clamp(-4, 5) + 4

    def final_loss(kappa, rule=True, steps_at_1=160, batch=32):
        torch.manual_seed(0)
        probe = TrackingProbe(d, k, base_lr=3e-3)
        g = torch.Generator().manual_seed(1)
        for _ in range(int(steps_at_1 / kappa)):
            idx = torch.randint(0, n, (int(batch * kappa),), generator=g)
            probe.step(now_at(kappa=kappa if rule else 1.0), probe.train_metrics(x[idx], y[idx]))
        probe.module.eval()
        with torch.no_grad():
            return F.cross_entropy(probe.module(x), y).item()

    ref, ruled, unruled = final_loss(1), final_loss(8), final_loss(8, rule=False)
    assert max(ref, ruled, unruled) < math.log(k)
    assert abs(ruled - ref) < 0.5 * abs(unruled - ref)


# --- runs through the engine --------------------------------------------------------------------------


def test_tiny_preset_kappa2_logs_what_the_issue_asks(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "dino-vit", "--preset", "tiny", "--kappa", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = rows_of(out)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if "probe_top1" in r]
    assert train and all(math.isfinite(r["dino_loss"]) and r["dino_loss"] >= 0 for r in train)
    assert all(r["center_momentum"] == pytest.approx(0.9) for r in train)
    assert all(r["ema_momentum"] == pytest.approx(0.97**2) for r in train)
    assert all(r["batch_size"] == 64 for r in train) and {r["teacher_temp"] for r in train} == {0.04, 0.07}
    assert [r["epoch"] for r in evals] == [1.0, 2.0] and all(0 <= r["probe_top1"] <= 100 for r in evals)
    assert not any(k.startswith("ema_probe") or k.startswith("probe_grad") or k == "teacher_mean"
                   for r in rows for k in r)
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    steps = ck["clock"]["step"]
    assert ck["task_state"]["center"]["updates"] == steps == 4 and ck["task_state"]["probe"]["steps"] == steps
    h = json.loads((out / "hparams.json").read_text())
    assert h["task"]["task"] == "dino" and h["hyperparameters"]["dino.center_momentum"]["scaled"] == 0.9
    # `sweep --metric` is checked against the registry's metrics before training: they must be what a run logs
    from emarule.request import checks

    logged = {k.removeprefix("ema_") for r in rows for k in r}
    assert {*checks.LOOP_METRICS, *checks.TASK_METRICS["dino"]} <= logged
    scaled = tmp_path / "scaled"
    res = runner.invoke(app, ["run", "dino-vit", "--preset", "tiny", "--kappa", "2", "--set", "dino.center_scale=true",
                              "--out", str(scaled)])
    assert res.exit_code == 0, res.output
    momenta = [r["center_momentum"] for r in rows_of(scaled) if r["kind"] == "train"]
    assert momenta and all(m == pytest.approx(0.81) for m in momenta)


def test_center_moves_once_per_step_and_accumulation_gives_the_same_center(tmp_path):
    from emarule.engine.loop import train

    torch.set_num_threads(1)
    centers = []
    for name, mdb in (("whole", None), ("accumulated", 8)):
        ctx = ctx_for(kappa=1.0, out=tmp_path / name, max_device_batch=mdb)
        ctx.quiet = True
        parts = D.build(ctx)
        train(ctx, parts)
        h = json.loads((tmp_path / name / "hparams.json").read_text())
        assert h["layout"][0]["accumulation"] == (4 if mdb else 1)
        assert parts.state.center.updates == 8  # 128 samples / 32 per step × 2 epochs
        centers.append(parts.state.center.value.clone())
    assert float(centers[0].abs().max()) > 0
    assert torch.allclose(centers[0], centers[1], atol=1e-5, rtol=1e-4)


def test_full_size_vit_b16_with_the_65536_head_takes_a_step_on_cifar_layout(tmp_path):
    """The recipe's real model on a tiny CIFAR-10 directory (torchvision's pickled layout): ViT-B/16
    and the DINO head with 65,536 outputs, 2 global crops at 224 and 2 local crops at 96 (the recipe
    has 8; 2 keep the test fast), one image, one optimizer step of the task's parts under bf16 autocast where
    the CPU has it natively (else fp32), as the loop runs them (without the loop's 1.8 GB checkpoint)."""
    from emarule.engine import optimizers
    from emarule.engine.ema import ModelEma

    torch.set_num_threads(2)
    root = write_tiny_cifar(tmp_path / "cifar", n_train=1, n_test=2)
    ctx = ctx_for(None, ["batch.size=1", "progressive=null", "data.local_crops=2"], data=root)
    parts = D.build(ctx)
    info = parts.info
    assert 85.7e6 < info["backbone_parameters"] < 85.9e6  # ViT-B/16 without its classifier
    assert info["head_parameters"] == 768 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 256 + 256 + 256 * 65536
    assert info["global_crops"] == "2 × 224px" and info["local_crops"] == "2 × 96px" and info["dataset"] == "cifar10"
    model = parts.model
    teacher = ModelEma(parts.ema_source, ctx.plan["ema.momentum"])
    opt = optimizers.build(ctx.spec, model, parts.no_decay, ctx.plan)
    batch = torch.utils.data.default_collate([parts.train_set[0]])
    assert batch[0].shape == (1, 2, 3, 224, 224) and batch[1].shape == (1, 2, 3, 96, 96)
    before = model.student.head.mlp[0].weight.detach().clone()
    with full_size_autocast():
        loss, metrics = parts.loss(model, teacher.module, batch, now_at(1.0))
    # at initialization the student's distributions over 65,536 classes are near uniform
    assert 0.5 * math.log(65536) < loss.item() < 1.5 * math.log(65536)
    loss.backward()
    assert model.student.head.last_layer.weight_v.grad is not None  # epoch 1: the last layer trains
    opt.step()
    teacher.update(parts.ema_source)
    reduced = {k: v.double() for k, v in metrics.items() if isinstance(v, torch.Tensor)}
    parts.on_step(now_at(1.0), reduced)
    assert not torch.equal(model.student.head.mlp[0].weight, before)
    assert parts.state.center.updates == 1 and parts.state.center.value.shape == (65536,)
    assert torch.isfinite(parts.state.center.value).all()
