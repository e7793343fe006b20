"""Polyak-Ruppert ResNetv2 task: model, generated textures, views, the ImageNet loader, and runs end to end."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli_util import one_line_error
from engine_util import native_bf16

from emarule.request import checks
from emarule.cli.main import app
from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.scaling import plan
from emarule.config.load import load_spec
from emarule.tasks import polyak as P
from emarule.vision import data as D
from emarule.vision import resnetv2 as R
from emarule.vision import supervised as S
from emarule.vision import textures as T

runner = CliRunner()
RESNETV2_50_PARAMETERS = 25_549_352  # timm's resnetv2_50 with 1000 classes


def parts_for(preset="tiny", overrides=(), kappa=1.0, seed=0, data=None):
    s = load_spec("polyak-r50", preset=preset, overrides=list(overrides))
    ctx = RunContext(spec=s, kappa=kappa, ema_rule="exponential", plan=plan(s, kappa), out=Path("unused"), seed=seed,
                     data=data)
    return P.build(ctx)


def rows(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def write_imagenet(root: Path, classes=("n01", "n02", "n03"), train_per_class=1, val_per_class=1,
                   size=(40, 30)) -> Path:
    """A small ImageNet-layout tree of JPEGs: DIR/{train,val}/<class>/*.JPEG."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(n):
                px = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8).numpy()
                Image.fromarray(px).save(d / f"{c}_{i}.JPEG", quality=90)
    return root


# --- model --------------------------------------------------------------------------------------


def test_full_resnetv2_50_parameters_batchnorm_and_kaiming_normal_init():
    torch.manual_seed(0)
    net = R.resnetv2("resnetv2_50", 1000)
    assert R.parameter_count(net) == RESNETV2_50_PARAMETERS
    bns = R.batchnorms(net)
    assert len(bns) == 16 * 3 + 1 and all(isinstance(b, torch.nn.BatchNorm2d) for b in bns)  # pre-act: + final norm
    assert net.stem.conv.kernel_size == (7, 7) and hasattr(net.stem, "pool")
    conv = net.stages[3].blocks[0].conv2  # 3×3, 512 → 512: fan-out 512·9
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2.0 / (512 * 9)), rel=0.02)
    assert net.head.fc.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert float(net.head.fc.bias.detach().abs().max()) == 0.0
    assert all(float(b.weight.detach().min()) == 1.0 == float(b.weight.detach().max()) for b in bns)


def test_narrow_resnetv2_of_the_same_family():
    net = R.resnetv2("resnetv2_50", 10, width=8, layers=[1, 1, 1, 1], stem="small")
    assert [s.blocks[0].conv3.out_channels for s in net.stages] == [32, 64, 128, 256]
    assert type(net.stages[0].blocks[0]).__name__ == "PreActBottleneck"  # pre-activation, as resnetv2_50
    assert net.stem.conv.kernel_size == (3, 3) and net.stem.conv.stride == (2, 2) and not hasattr(net.stem, "pool")
    assert net(torch.randn(2, 3, 16, 16)).shape == (2, 10)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(arch="resnet50"), "pre-activation"), (dict(stem="cifar"), "model.stem"),
    (dict(init="xavier"), "model.init"), (dict(output_stride=4), "model.output_stride"),
    (dict(arch="resnetv2_50x1_bit", width=None, layers=None), "no BatchNorm"),
])
def test_model_errors_name_the_key(kwargs, needle):
    args = dict(arch="resnetv2_50", width=8, layers=[1, 1, 1, 1]) | kwargs
    with pytest.raises(UserError, match=needle):
        R.resnetv2(args.pop("arch"), 10, **args)


# --- generated textures ---------------------------------------------------------------------------


def test_textures_are_deterministic_balanced_and_flip_symmetric():
    a, ya = T.generate(60, 18, 1.0, seed=3, split=0)
    b, yb = T.generate(60, 18, 1.0, seed=3, split=0)
    assert torch.equal(a, b) and torch.equal(ya, yb)
    c, _ = T.generate(60, 18, 1.0, seed=3, split=1)
    assert not torch.equal(a, c)  # the validation split is other images
    assert a.shape == (60, 1, 18, 18) and torch.bincount(ya).tolist() == [6] * 10
    assert a.mean(dim=(1, 2, 3)).abs().max() < 1e-5 and (a.std(dim=(1, 2, 3)) - 1).abs().max() < 1e-4
    s = T.spectra(18)
    flipped = torch.roll(torch.flip(s, dims=[-1]), 1, dims=-1)  # kx → −kx on the FFT grid
    assert torch.allclose(s, flipped)


def test_texture_classes_are_told_apart_by_their_spectrum():
    """Without added noise, the nearest class spectrum to an image's periodogram is mostly its class."""
    x, y = T.generate(400, 18, 0.0, seed=0, split=0)
    power = torch.fft.fft2(x[:, 0].double()).abs() ** 2
    s = T.spectra(18)
    s = s / s.sum(dim=(1, 2), keepdim=True)
    score = torch.einsum("nij,cij->nc", power, s.log())  # log-likelihood up to a constant
    accuracy = (score.argmax(1) == y).double().mean().item()
    assert accuracy > 0.6  # chance is 0.1
    x_noisy, _ = T.generate(400, 18, 3.0, seed=0, split=0)
    noisy = torch.einsum("nij,cij->nc", torch.fft.fft2(x_noisy[:, 0].double()).abs() ** 2, s.log())
    assert (noisy.argmax(1) == y).double().mean().item() < accuracy  # data.noise makes it harder


# --- views ----------------------------------------------------------------------------------------


def test_train_views_are_pure_in_seed_epoch_index_and_translate_without_resizing():
    src = T.textures(True, 20, 16, 1.0, 0)
    views = S.TrainViews(src, "translate", 16, seed=5)
    x1, y1 = views[3]
    x2, _ = views[3]
    assert torch.equal(x1, x2) and y1 == src.label(3) and x1.shape == (3, 16, 16)
    views.set_epoch(1)
    assert not torch.equal(views[3][0], x1)
    img = src.image(3)[0]
    windows = [img[i:i + 16, j:j + 16] for i in range(3) for j in range(3)]
    windows += [w.flip(-1) for w in windows]
    assert any(torch.equal(x1[0], w) for w in windows)  # a crop (maybe flipped), never a resampling
    assert torch.equal(x1[0], x1[2])  # one channel shown three times


def test_imagenet_augmentation_on_tensors_and_eval_centre_crop():
    src = T.textures(True, 4, 16, 1.0, 0)
    x, _ = S.TrainViews(src, "imagenet", 8, seed=0)[0]
    assert x.shape == (3, 8, 8)
    ev, y = S.EvalViews(src, 16)[2]
    assert torch.equal(ev[0], src.image(2)[0, 1:17, 1:17]) and y == src.label(2)  # 18 → centre 16
    with pytest.raises(UserError, match="data.augmentation"):
        S.TrainViews(src, "byol", 16, seed=0)


def test_imagenet_folder_views_and_class_agreement(tmp_path):
    root = write_imagenet(tmp_path / "in", size=(50, 30))
    train, val = D.imagenet(root, 24)
    assert len(train) == 3 and train.num_classes == 3 and [val.label(i) for i in range(3)] == [0, 1, 2]
    views = S.TrainViews(train, "imagenet", 24, seed=0)
    x, y = views[1]
    assert x.shape == (3, 24, 24) and y == 1 and torch.equal(views[1][0], x)
    e, _ = S.EvalViews(val, 24)[0]
    assert e.shape == (3, 24, 24)  # 50×30 → shorter side 27 → 45×27 → centre 24


def extra_val_class(root: Path) -> Path:
    write_imagenet(root / "a")
    write_imagenet(root / "b", classes=("n09",))
    (root / "b" / "val" / "n09").rename(root / "a" / "val" / "n09")
    return root / "a"


@pytest.mark.parametrize("make,needle", [
    (lambda r: r, "is not a directory"),
    (lambda r: (r / "train").mkdir(parents=True) or (r / "val").mkdir() or r, "DIR/train/<class>/*.JPEG"),
    (lambda r: extra_val_class(r), "1 only in val/ (e.g. n09)"),
])
def test_imagenet_layout_errors_are_one_line(tmp_path, make, needle):
    root = make(tmp_path / "in")
    with pytest.raises(UserError, match=re.escape(needle)) as e:
        D.imagenet(root, 224)
    assert "\n" not in str(e.value)


# --- loss and evaluation --------------------------------------------------------------------------


def test_loss_is_label_smoothed_cross_entropy_and_reports_bn_momentum():
    parts = parts_for(overrides=["norm.bn_scale=true"], kappa=2)
    model = parts.model
    model.train()
    for bn in R.batchnorms(model):
        bn.momentum = 1 - 0.9**2  # what the engine sets for ρ_BN^κ
    x, y = torch.utils.data.default_collate([parts.train_set[i] for i in range(8)])
    loss, metrics = parts.loss(model, None, (x, y), None)
    torch.manual_seed(0)
    logits = model(x)  # BatchNorm in train mode: the same batch, the same statistics
    logp = logits.log_softmax(1)
    manual = (0.9 * -logp.gather(1, y[:, None])[:, 0] + 0.1 * -logp.mean(1)).mean()
    assert loss.item() == pytest.approx(manual.item(), rel=1e-5)
    assert metrics["bn_momentum"] == pytest.approx(0.81) and 0 <= metrics["train_top1"] <= 100
    assert parts.teacher is None and parts.info["train_size"] == 128 and parts.info["val_size"] == 64


def test_evaluation_sums_and_metrics():
    parts = parts_for()
    ev = parts.evaluations[0]
    assert ev.models == "all" and ev.every_epochs == 1.0
    net = parts.model.eval()
    x, y = torch.utils.data.default_collate([ev.data[i] for i in range(6)])
    with torch.no_grad():  # as the engine scores (emarule/engine/evaluation.py)
        sums = ev.score(net, (x, y), None)
        logits = net(x)
    assert int(sums["correct"]) == int((logits.argmax(1) == y).sum()) and sums["count"] == 6
    assert float(sums["loss_sum"]) == pytest.approx(6 * torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    out = ev.finish({"correct": 3.0, "count": 6.0, "loss_sum": 12.0})
    assert out == {"top1": 50.0, "val_loss": 2.0}


def test_no_weight_decay_on_biases_and_norms():
    parts = parts_for()
    names = dict(parts.model.named_parameters())
    assert parts.no_decay == {n for n, p in names.items() if p.ndim <= 1}
    assert "head.fc.bias" in parts.no_decay and "stem.conv.weight" not in parts.no_decay


# --- runs through the CLI ---------------------------------------------------------------------------


def test_tiny_run_at_kappa_2_logs_top1_ema_top1_and_both_momenta(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "polyak-r50", "--preset", "tiny", "--kappa", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    train, evals = rows(out, "train"), rows(out, "eval")
    rho_b = load_spec("polyak-r50", preset="tiny")["ema"]["momentum"]
    assert train and all(r["ema_momentum"] == pytest.approx(rho_b**2) for r in train)
    assert all(r["bn_momentum"] == pytest.approx(0.9) for r in train)  # unscaled by default (the paper)
    assert all(r["batch_size"] == 64 for r in train)
    assert [round(r["epoch"]) for r in evals] == [1, 2]
    for r in evals:
        assert {"top1", "ema_top1", "val_loss", "ema_val_loss"} <= set(r)
        assert 0 <= r["top1"] <= 100 and 0 <= r["ema_top1"] <= 100
    hp = json.loads((out / "hparams.json").read_text())
    assert hp["task"]["dataset"] == "textures" and hp["spec"]["ema"]["update_from"] == "pre"
    # `sweep --metric` is checked against checks.TASK_METRICS before training: it must hold what a run logs
    logged = {k.removeprefix("ema_") for r in train + evals for k in r}
    assert {*checks.LOOP_METRICS, *checks.TASK_METRICS["polyak"]} <= logged


def test_bn_scale_ablation_shows_in_the_log(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "polyak-r50", "--preset", "tiny", "--kappa", "4", "--set", "norm.bn_scale=true",
                              "--set", "schedule.epochs=1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert all(r["bn_momentum"] == pytest.approx(0.9**4) for r in rows(out, "train"))


@pytest.mark.parametrize("argv,needle", [
    (["--data", "{missing}"], "is not a directory"),
    ([], "pass --data DIR"),
    (["--preset", "tiny", "--data", "{tmp}"], "drop --data"),
])
def test_data_errors_are_one_line_before_anything_is_written(tmp_path, argv, needle):
    argv = [a.format(missing=tmp_path / "nope", tmp=tmp_path) for a in argv]
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "polyak-r50", "--kappa", "2", *argv, "--out", str(out)])
    one_line_error(res, needle)
    assert not out.exists()


def test_full_resnetv2_50_one_step_on_an_imagenet_tree(tmp_path):
    """The paper's model and loader at full size: 3 classes of JPEGs, one step of 3 images, in the recipe's
    bf16 where the CPU has it natively, else fp32 (emulated, the step took 6× as long: `native_bf16`)."""
    torch.set_num_threads(2)
    root = write_imagenet(tmp_path / "imagenet", size=(64, 48))
    out = tmp_path / "run"
    precision = "bf16" if native_bf16() else "fp32"
    assert load_spec("polyak-r50")["precision"] == "bf16"
    # κ = 3/1024: the SGD rule gives lr 0.4·3/1024 and the EMA rule ρ = 0.9999^(3/1024)
    res = runner.invoke(app, ["run", "polyak-r50", "--data", str(root), "--out", str(out), "--batch-size", "3",
                              "--set", "schedule.epochs=1", "--set", "schedule.warmup_epochs=0",
                              "--set", f"precision={precision}"])
    assert res.exit_code == 0, res.output
    hp = json.loads((out / "hparams.json").read_text())
    assert hp["task"]["parameters"] == RESNETV2_50_PARAMETERS and hp["task"]["image_size"] == 224
    assert hp["task"]["dataset"] == "imagefolder:train" and hp["spec"]["precision"] == precision
    (train,) = rows(out, "train")
    assert train["step"] == 1 and train["samples_seen"] == 3 and train["bn_momentum"] == pytest.approx(0.9)
    assert train["ema_momentum"] == pytest.approx(0.9999 ** (3 / 1024), rel=1e-12)
    assert train["lr"] == pytest.approx(0.4 * 3 / 1024) and math.isfinite(train["loss"])
    (ev,) = rows(out, "eval")
    assert {"top1", "ema_top1", "val_loss", "ema_val_loss"} <= set(ev)
