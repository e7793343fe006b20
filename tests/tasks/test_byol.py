"""BYOL task: models, loss, augmentations, data sets, errors, and a tiny run end to end."""

import contextlib
import copy
import json
from pathlib import Path

import pytest
import numpy as np
import torch
from typer.testing import CliRunner

from cli_util import one_line_error

from emarule.cli.main import app
from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.scaling import plan
from emarule.config.load import load_spec
from emarule.tasks import byol as B
from emarule.vision import augment as A
from emarule.vision import data as D
from emarule.vision import models as M
from emarule.vision.device_views import DeviceHalf

runner = CliRunner()


def parts_for(experiment="byol-r18", preset="tiny", overrides=(), kappa=1.0, seed=0):
    s = load_spec(experiment, preset=preset, overrides=list(overrides))
    ctx = RunContext(spec=s, kappa=kappa, ema_rule="exponential", plan=plan(s, kappa), out=Path("unused"), seed=seed)
    return B.build(ctx)


# --- models -------------------------------------------------------------------------------------


def test_cifar_resnet18_width4_shapes_and_stem():
    net = M.backbone("resnet18", width=4, cifar_stem=True, init="kaiming_uniform")
    assert net.num_features == 32
    assert net.stem[0].kernel_size == (3, 3) and net.stem[0].stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in net.modules())
    assert len(net.layers) == 8  # 4 stages × 2 basic blocks
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 32)
    full = M.backbone("resnet18", width=64, cifar_stem=True)
    assert 11.0e6 < sum(p.numel() for p in full.parameters()) < 11.4e6  # ResNet-18: 11.2M


def test_model_layers_sets_the_basic_blocks_per_stage_and_only_for_a_basic_block_resnet():
    net = M.backbone("resnet18", width=4, cifar_stem=True, layers=[1, 1, 1, 1])
    assert len(net.layers) == 4 and net.num_features == 32
    assert net(torch.randn(2, 3, 16, 16)).shape == (2, 32)
    assert len(M.backbone("resnet34", width=4, cifar_stem=True, layers=[1, 2, 1, 1]).layers) == 5
    assert len(parts_for(overrides=["model.layers=[1, 1, 1, 1]"]).model.online.backbone.layers) == 4
    with pytest.raises(UserError, match="model.layers applies to resnet18 and resnet34"):
        M.backbone("vit_base_patch16_224", layers=[1, 1, 1, 1])
    r = runner.invoke(app, ["plan", "byol-r18", "--kappa", "2", "--preset", "tiny", "--set", "model.layers=[1, 1, 1]"])
    one_line_error(r, "model.layers")


def test_byol_model_heads_probe_and_no_decay():
    parts = parts_for()
    m = parts.model
    assert parts.ema_source is m.online
    assert [type(x).__name__ for x in m.online.projector] == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert [type(x).__name__ for x in m.predictor] == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert m.probe.bn.affine is False and m.probe.fc.weight.shape == (10, 32)
    assert not any(p.requires_grad for p in m.probe.parameters())  # trained by its own Adam
    h, z = m.online(torch.randn(4, 3, 8, 8))
    assert h.shape == (4, 32) and z.shape == (4, 16) and m.predictor(z).shape == (4, 16)
    names = dict(m.named_parameters())
    assert parts.no_decay and all(names[n].ndim <= 1 for n in parts.no_decay)
    assert "online.backbone.stem.0.weight" not in parts.no_decay and "online.projector.0.bias" in parts.no_decay
    assert parts.info["train_size"] == 128 and parts.info["test_size"] == 64 and parts.info["dataset"] == "digits"


def test_head_norm_selects_batchnorm_or_layernorm_heads():
    for norm, kind in (("batchnorm", "BatchNorm1d"), ("layernorm", "LayerNorm")):
        m = parts_for("byol-vit", "tiny", [f"model.head_norm={norm}"]).model
        assert [type(x).__name__ for x in m.online.projector] == ["Linear", kind, "ReLU", "Linear"]
        assert type(m.predictor[1]).__name__ == kind
        assert not any(isinstance(x, torch.nn.BatchNorm2d) for x in m.online.backbone.modules())  # LayerNorm ViT
    with pytest.raises(UserError, match="head_norm"):
        load_spec("byol-vit", preset="tiny", overrides=["model.head_norm=groupnorm"])


def test_narrow_presets_build_a_narrow_vit_and_a_bottleneck_resnet50():
    vit = parts_for("byol-vit", "cpu").model.online.backbone
    assert vit.embed_dim == 64 and len(vit.blocks) == 4 and vit.patch_embed.patch_size == (4, 4)
    assert vit.patch_embed.num_patches == 16
    r50 = parts_for("byol-r50-lars", "cpu").model.online.backbone
    assert r50.num_features == 256 and len(r50.layers) == 16  # (3, 4, 6, 3) bottlenecks, 32 × width 8
    assert type(r50.layers[0]).__name__ == "Bottleneck"


def test_full_size_vit_and_resnet50_build(tmp_path):
    """The byol-vit and byol-r50-lars recipes build at full size (synthetic images stand in for ImageNet)."""
    torch.set_num_threads(1)
    small = ["data.source=synthetic", "data.train_samples=4", "data.eval_samples=2"]
    vit = parts_for("byol-vit", None, small)
    bb = vit.model.online.backbone
    assert 85.7e6 < sum(p.numel() for p in bb.parameters()) < 85.9e6  # ViT-B/16 without its classifier
    assert bb.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1) and bb.patch_embed.patch_size == (16, 16)
    assert {"online.backbone.pos_embed", "online.backbone.cls_token"} <= vit.no_decay
    assert vit.model.online.projector[0].in_features == 768 and vit.model.online.projector[0].out_features == 4096
    crops, params, y = torch.utils.data.default_collate([vit.train_set[i] for i in range(2)])
    assert crops.shape == (2, 2, 3, 224, 224) and crops.dtype == torch.uint8  # the recipe colours on the device
    src = vit.train_set.source
    x1, x2, y = DeviceHalf("two_views", src.mean, src.std).stage((crops, params, y))
    assert x1.shape == (2, 3, 224, 224) and x1.dtype == torch.float32
    vit.model.eval()
    with torch.no_grad():
        h, z = vit.model.online(x1)
    assert h.shape == (2, 768) and z.shape == (2, 256)
    r50 = parts_for("byol-r50-lars", None, small)
    assert 23.4e6 < r50.info["backbone_parameters"] < 23.6e6 and r50.model.num_features == 2048
    r50.model.eval()
    with torch.no_grad():
        h, z = r50.model.online(x1)
    assert h.shape == (2, 2048) and z.shape == (2, 256)


# --- loss ---------------------------------------------------------------------------------------


def test_cosine_loss_zero_for_aligned_symmetric_and_bounded():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    assert B.byol_loss(a, b, b, a).item() == pytest.approx(0.0, abs=1e-6)  # p1 = t2, p2 = t1
    assert B.byol_loss(a, b, 3 * b, 0.5 * a).item() == pytest.approx(0.0, abs=1e-6)  # scale invariant
    x1, x2, t1, t2 = (torch.randn(8, 16, generator=g) for _ in range(4))
    assert B.byol_loss(x1, x2, t1, t2).item() == pytest.approx(B.byol_loss(x2, x1, t2, t1).item())  # x1 ↔ x2
    e = torch.eye(4)
    assert B.byol_loss(e[:2], e[:2], e[2:], e[2:]).item() == pytest.approx(1.0)  # orthogonal: ½·1 + ½·1
    assert B.byol_loss(e[:2], e[:2], -e[:2], -e[:2]).item() == pytest.approx(2.0)  # opposite: the maximum
    # The paper's Definition: ½cos(p1, t2) + ½cos(p2, t1) per sample, mean over the batch.
    manual = (0.5 * (1 - torch.nn.functional.cosine_similarity(x1, t2))
              + 0.5 * (1 - torch.nn.functional.cosine_similarity(x2, t1))).mean()
    assert B.byol_loss(x1, x2, t1, t2).item() == pytest.approx(manual.item(), rel=1e-6)


def test_loss_stops_gradient_at_teacher_and_keeps_its_statistics():
    parts = parts_for()
    m, teacher = parts.model, copy.deepcopy(parts.ema_source)
    teacher.eval()
    bn = teacher.backbone.stem[1]
    stats = (bn.running_mean.clone(), bn.running_var.clone())
    batch = torch.utils.data.default_collate([parts.train_set[i] for i in range(8)])
    theta = m.probe.fc.weight.clone()
    loss, metrics = parts.loss(m, teacher, batch, None)
    loss.backward()
    assert {k for k, v in metrics.items() if not isinstance(v, torch.Tensor)} == {
        "byol_loss", "probe_loss", "probe_train_top1"}
    assert {"probe_grad/weight", "probe_grad/bias", "probe_stat/mean"} <= set(metrics)  # for its own step
    assert 0.0 <= metrics["byol_loss"] <= 2.0 and loss.item() == pytest.approx(metrics["byol_loss"])
    assert all(p.grad is None for p in teacher.parameters())
    assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
    assert teacher.training is False  # its mode is given back
    assert m.predictor[0].weight.grad is not None
    assert torch.equal(m.probe.fc.weight, theta)  # the probe moves only in on_step


def test_the_teacher_normalizes_with_batch_statistics_and_drops_no_path():
    # A ViT with stochastic depth and a BatchNorm head: the teacher's targets are deterministic, its
    # BatchNorm uses the batch's statistics without updating its running ones, and every mode comes back.
    torch.manual_seed(0)
    vit = M.backbone("vit_tiny_patch16_224", image_size=32, patch_size=8, stochastic_depth=0.5,
                     vit_dims={"embed_dim": 32, "depth": 2, "num_heads": 2})
    teacher = B.Online(vit, M.mlp(vit.num_features, 16, 8)).eval()
    head_bn = teacher.projector[1]
    stats = head_bn.running_mean.clone()
    x = torch.randn(6, 3, 32, 32)
    with torch.no_grad(), B.batch_statistics(teacher):
        assert head_bn.training and not vit.blocks[1].drop_path1.training
        a, b = teacher(x)[1], teacher(x)[1]
        assert torch.equal(a, b)
        assert torch.allclose(head_bn(torch.randn(6, 16) * 3 + 5).mean(0), torch.zeros(16), atol=1e-5)
    assert torch.equal(head_bn.running_mean, stats)
    assert not any(m.training for m in teacher.modules())


def test_probe_is_outside_the_run_optimizer():
    from emarule.engine import optimizers
    from emarule.scaling import scale

    parts = parts_for()
    assert not parts.aux_params and parts.on_step is not None
    spec = load_spec("byol-r18", preset="tiny")
    opt = optimizers.build(spec, parts.model, parts.no_decay, scale(spec, 4))
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert len(in_opt) == sum(1 for p in parts.model.parameters() if p.requires_grad)
    assert not any(id(p) in in_opt for p in parts.model.probe.parameters())


def test_gradient_clipping_leaves_the_aux_group_out():
    from emarule.engine import step as T

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(4, 1), "probe": torch.nn.Linear(4, 1)})
    x = torch.randn(8, 4)
    (model["body"](x).pow(2).mean() + 1e4 * model["probe"](x).pow(2).mean()).backward()
    named = dict(model.named_parameters())
    aux = frozenset(id(named[n]) for n in ("probe.weight", "probe.bias"))
    T.clip_gradients(list(model.parameters()), aux, 0.5)
    body = torch.cat([p.grad.flatten() for p in model["body"].parameters()]).norm().item()
    probe = torch.cat([p.grad.flatten() for p in model["probe"].parameters()]).norm().item()
    assert body == pytest.approx(0.5, rel=1e-5)  # clipped to grad_clip
    assert probe > 10.0  # the probe's huge gradient neither clipped nor counted in the body's norm


def test_probe_evaluation_reports_probe_top1_on_the_teacher_and_restores_modes():
    from emarule.engine import evaluation
    from emarule.engine.ema import ModelEma
    from emarule.engine.interface import Now

    parts = parts_for()
    ema = ModelEma(parts.ema_source, 0.9)
    ema.module.train()
    (ev,) = parts.evaluations
    assert ev.models == "teacher"
    now = Now(seen=0, samples=0, epoch=0, base_step=0, step=0, kappa=1, plan=None)
    out = evaluation.run([ev], parts.model, parts.ema_source, {"ema": ema}, "ema", now, torch.device("cpu"),
                         contextlib.nullcontext)
    assert set(out) == {"probe_top1"} and 0.0 <= out["probe_top1"] <= 100.0
    assert ema.module.training and parts.model.probe.training


# --- augmentations and data -----------------------------------------------------------------------


def test_views_are_a_pure_function_of_seed_epoch_index():
    src = D.digits(True)
    a = D.TwoViewSet(src, "byol_cifar10", 16, seed=3)
    b = D.TwoViewSet(src, "byol_cifar10", 16, seed=3)
    a.set_epoch(5)
    b.set_epoch(5)
    state = torch.get_rng_state()
    first = [a[i] for i in (7, 3, 11)]
    second = [b[i] for i in (11, 3, 7)][::-1]  # another instance, another access order
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is never used
    for (u1, u2, y), (w1, w2, z) in zip(first, second, strict=True):
        assert torch.equal(u1, w1) and torch.equal(u2, w2) and y == z
    assert not torch.equal(first[0][0], first[0][1])  # two different views of one image
    a.set_epoch(6)
    assert not torch.equal(a[7][0], first[0][0])  # a new epoch, new views
    c = D.TwoViewSet(src, "byol_cifar10", 16, seed=4)
    c.set_epoch(5)
    assert not torch.equal(c[7][0], first[0][0])  # a new seed, new views
    assert first[0][0].shape == (3, 16, 16) and first[0][0].dtype == torch.float32
    assert len({A.item_seed(s, e, i) for s in range(3) for e in range(3) for i in range(50)}) == 450


def test_byol_imagenet_stack_blur_and_solarize_are_asymmetric():
    v1, v2 = A.STACKS["byol"]
    assert (v1.blur_p, v2.blur_p, v1.solarize_p, v2.solarize_p) == (1.0, 0.1, 0.0, 0.2)
    c1, c2 = A.STACKS["byol_cifar10"]
    assert (c1.blur_p, c2.blur_p, c1.solarize_p, c2.solarize_p) == (0.0, 0.0, 0.0, 0.2)
    assert c1.crop_scale == (0.08, 1.0) and c1.flip_p == 0.5 and c1.gray_p == 0.2 and c1.jitter_p == 0.8
    img = (torch.rand(3, 40, 30, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    out = A.apply_view(img, v1, 24, A.generator_for(0, 0, 0))
    assert out.shape == (3, 24, 24) and 0.0 <= out.min() and out.max() <= 1.0


def test_hue_matches_torchvision():
    from torchvision.transforms.v2 import functional as TF

    x = torch.rand(2, 3, 9, 9, generator=torch.Generator().manual_seed(1))
    for shift in (-0.1, 0.03, 0.1):
        got = torch.from_numpy(A._hue(x.numpy(), np.array([shift, shift])))
        assert torch.allclose(got, TF.adjust_hue(x, shift), atol=1e-5)


def test_digits_split_is_fixed_and_disjoint():
    tr, te = D.digits(True), D.digits(False)
    assert len(tr) == 1437 and len(te) == 360 and tr.images.shape == (1437, 1, 8, 8)
    assert set(tr.labels.tolist()) == set(range(10)) and set(te.labels.tolist()) == set(range(10))
    assert float(tr.images.min()) == 0.0 and float(tr.images.max()) == 1.0
    seen = {bytes(x.numpy().tobytes()) for x in tr.images}
    assert sum(bytes(x.numpy().tobytes()) in seen for x in te.images) < 5  # only a few true duplicates
    assert torch.equal(D.digits(False).labels, te.labels)
    v = te.eval_view(0, 16)
    assert v.shape == (3, 16, 16) and torch.equal(v[0], v[1])  # upsampled, gray on 3 channels


def test_imagefolder_source(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for k in range(2):
                Image.new("RGB", (40, 30), (40 * k, 100, 200)).save(tmp_path / split / c / f"{k}.png")
    train, test = D.load_sources("imagenet", tmp_path, 24, None, None, 2)
    assert len(train) == 4 and train.num_classes == 2 and train.image(0).shape == (3, 30, 40)
    assert test.eval_view(3, 24).shape == (3, 24, 24) and test.label(3) == 1
    v1, v2, y = D.TwoViewSet(train, "byol", 24, 0)[2]
    assert v1.shape == v2.shape == (3, 24, 24) and y == 1
    (tmp_path / "only" / "train").mkdir(parents=True)
    with pytest.raises(UserError, match="only/val is not a directory"):
        D.load_sources("imagenet", tmp_path / "only", 24, None, None, 2)


# --- errors through the CLI ------------------------------------------------------------------------


def test_missing_cifar_is_one_line_naming_the_path_and_layout(tmp_path):
    line = one_line_error(runner.invoke(app, ["run", "byol-r18", "--data", str(tmp_path), "--out",
                                              str(tmp_path / "run")]), str(tmp_path))
    assert "cifar-10-batches-py" in line and "nothing is downloaded" in line
    assert not (tmp_path / "run").exists()
    line = one_line_error(runner.invoke(app, ["run", "byol-r18", "--out", str(tmp_path / "run")]), "--data DIR")
    assert "--preset cpu" in line
    (tmp_path / "cifar-10-batches-py").mkdir()
    one_line_error(runner.invoke(app, ["run", "byol-r18", "--data", str(tmp_path), "--out", str(tmp_path / "run")]),
                   "incomplete or corrupt")


def test_missing_imagenet_is_one_line(tmp_path):
    one_line_error(runner.invoke(app, ["run", "byol-vit", "--data", str(tmp_path), "--out", str(tmp_path / "r")]),
                   f"{tmp_path / 'train'} is not a directory")
    one_line_error(runner.invoke(app, ["run", "byol-r50-lars", "--out", str(tmp_path / "r")]), "--data DIR")


# --- end to end -------------------------------------------------------------------------------------


def test_run_tiny_preset_end_to_end(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "byol-r18", "--preset", "tiny", "--kappa", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    h = json.loads((out / "hparams.json").read_text())
    assert h["kappa"] == 2 and h["task"]["arch"] == "resnet18" and h["dataset_size"] == 128
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "byol_loss" in r]
    evals = [r for r in rows if "probe_top1" in r]
    assert train and all(0.0 <= r["byol_loss"] <= 2.0 for r in train)
    assert [r["epoch"] for r in evals] == [1.0, 2.0]
    assert all(r["batch_size"] == 64 for r in train)
    assert train[-1]["ema_momentum"] == pytest.approx(0.97**2)
