"""data.augment_on=device (emarule/vision/device_views.py): the workers' half draws every parameter from the
distributions the CPU path draws from, the device's half makes the CPU path's views where the parameters are
the same, and a run on it repeats itself and resumes bit for bit."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import default_collate

from augment_reference import reference_view
from emarule.config.load import load_spec
from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.scaling import plan
from emarule.tasks import build_parts, run_task
from emarule.vision import augment as A
from emarule.vision import data as D
from emarule.vision import device_views as V
from emarule.vision import multicrop as MC
from emarule.vision import supervised as S
from engine_util import load_checkpoint, one_thread, tensors_equal, train_until_sigterm

SIZE, H, W = 8, 40, 48  # small views of larger images: the crop's geometry is fine-grained, the ops cheap
N = 3000  # items per sample: a KS test then tells apart ranges that differ by a few percent
P_MIN = 1e-3


def photo_like(n: int, h: int, w: int, seed: int, float_: bool = False) -> torch.Tensor:
    """n smooth RGB images (uint8, or float in [0, 1]): blocks of colour blended, as photos are, not noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, 256, (n, 3, h // 8 + 1, w // 8 + 1), generator=g).float()
    x = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    return x / 255 if float_ else x.round().to(torch.uint8)


def source(n: int, h: int = H, w: int = W, float_: bool = False) -> D.TensorSource:
    return D.TensorSource(photo_like(n, h, w, 7, float_), torch.arange(n) % 10, "test", D.IMAGENET_MEAN,
                          D.IMAGENET_STD, 10)


SRC = source(N)


def cpu_sample(aug: A.ViewAug, seed: int) -> list:
    """What the CPU path draws for N items: the torch reference's record of every value (`drawn`)."""
    rows = []
    for i in range(N):
        drawn = {}
        reference_view(SRC.image(i), aug, SIZE, A.generator_for(seed, 0, i), drawn=drawn)
        rows.append(drawn)
    return rows


def device_sample(aug: A.ViewAug, seed: int, monkeypatch) -> list:
    """What the workers' half hands the device for N items, read back as the device's half reads it, with the
    crop boxes the workers cut."""
    boxes, view_draws = [], A.view_draws

    def spy(h, w, a, d):
        box, u = view_draws(h, w, a, d)
        boxes.append(box)
        return box, u

    monkeypatch.setattr(A, "view_draws", spy)
    images = [SRC.image(i) for i in range(N)]
    x, p = V.crops(images, aug, SIZE, [A._Draws(A.generator_for(seed, 0, i)) for i in range(N)])
    monkeypatch.setattr(A, "view_draws", view_draws)
    assert x.shape == (N, 3, SIZE, SIZE) and x.dtype == torch.uint8 and p.shape == (N, len(V.PARAMS))
    rows = []
    for box, q in zip(boxes, p.tolist(), strict=True):
        ops = [int(o) for o in q[V.OPS]]
        row = {"box": box, "sigma": q[V.SIGMA], "jitter": max(ops) >= 0, "order": tuple(ops)}
        row.update({k: q[c] > 0 for k, c in (("flip", V.FLIP), ("gray", V.GRAY), ("blur", V.BLUR),
                                              ("solarize", V.SOLARIZE))})
        row.update(zip(("brightness", "contrast", "saturation", "hue"), q[V.FACTORS], strict=True))
        rows.append(row)
    return rows


def geometry(rows: list) -> dict:
    i, j, ch, cw = (np.array(v, float) for v in zip(*[r["box"] for r in rows], strict=True))
    return {"crop area": ch * cw / (H * W), "crop log ratio": np.log(cw / ch),
            "crop centre y": (i + ch / 2) / H, "crop centre x": (j + cw / 2) / W}


def p_values(a: list, b: list) -> dict:
    """Per parameter, the p-value of 'both samples come from one distribution': Kolmogorov–Smirnov for the
    continuous ones, Fisher's exact test for the switches, χ² over the 24 orders of the jitter's ops."""
    out = {}
    ga, gb = geometry(a), geometry(b)
    for k in ga:
        out[k] = stats.ks_2samp(ga[k], gb[k]).pvalue
    for k in ("brightness", "contrast", "saturation", "hue", "sigma"):
        out[k] = stats.ks_2samp([r[k] for r in a], [r[k] for r in b]).pvalue
    for k in ("flip", "jitter", "gray", "blur", "solarize"):
        ya, yb = sum(r[k] for r in a), sum(r[k] for r in b)
        out[k] = stats.fisher_exact([[ya, len(a) - ya], [yb, len(b) - yb]]).pvalue
    orders = sorted({r["order"] for r in a + b if r["jitter"]})
    table = [[sum(r["order"] == o for r in s if r["jitter"]) for o in orders] for s in (a, b)]
    out["jitter order"] = stats.chi2_contingency(table).pvalue
    return out


AUGS = {"byol view 1": A.STACKS["byol"][0], "byol view 2": A.STACKS["byol"][1],
        "dino local": replace(MC.STACKS["dino"][2], crop_scale=MC.DINO_LOCAL_SCALE)}


@pytest.mark.parametrize("name", AUGS)
def test_each_parameter_comes_from_the_cpu_paths_distribution(name, monkeypatch):
    """Independent seeds (0 for the CPU path, 1 for the device's), so that the two samples are two draws."""
    aug = AUGS[name]
    cpu, dev = cpu_sample(aug, 0), device_sample(aug, 1, monkeypatch)
    p = p_values(cpu, dev)
    assert len(p) == 15 and min(p.values()) > P_MIN, {k: v for k, v in p.items() if v <= P_MIN}
    assert 0.45 < np.mean([r["flip"] for r in dev]) < 0.55  # not two samples of one wrong distribution
    assert abs(np.mean([r["blur"] for r in dev]) - aug.blur_p) < 0.03


def test_the_same_tests_reject_a_parameter_drawn_from_another_distribution(monkeypatch):
    aug = AUGS["byol view 2"]
    wrong = replace(aug, crop_scale=(0.12, 1.0), brightness=0.36, hue=0.09, flip_p=0.45, blur_sigma=(0.1, 1.8))
    p = p_values(cpu_sample(aug, 0), device_sample(wrong, 1, monkeypatch))
    rejected = {k for k, v in p.items() if v <= P_MIN}
    assert {"crop area", "brightness", "hue", "flip", "sigma"} <= rejected, p
    assert not rejected & {"contrast", "saturation", "gray", "jitter order"}, p


def views_both_ways(src, stack: str, size: int, seed: int = 3) -> tuple[list, list]:
    idx = list(range(len(src)))
    cpu = default_collate(D.TwoViewSet(src, stack, size, seed).__getitems__(idx))
    half = V.DeviceHalf("two_views", src.mean, src.std)
    dev = half.stage(default_collate(V.TwoViewCrops(src, stack, size, seed).__getitems__(idx)))
    std = torch.tensor(src.std).view(1, 3, 1, 1)
    return [v * std for v in cpu[:2]], [v * std for v in dev[:2]]  # in [0, 1] units: differences in levels


@pytest.mark.parametrize("size", [16, 64])
def test_views_match_the_cpu_paths_where_the_parameters_match(size):
    """The same seed draws the same parameters on both paths. From float images the views agree to float32
    rounding (kornia's hue, contrast mean and blur sum in their own order); from uint8 images the device's
    crops are rounded to whole levels first, which moves a view by a few levels at most."""
    torch.set_num_threads(1)
    for stack in ("byol", "byol_cifar10"):
        cpu, dev = views_both_ways(source(48, 60, 52, float_=True), stack, size)
        for a, b in zip(cpu, dev, strict=True):
            assert (a - b).abs().max() < 1e-5
        cpu, dev = views_both_ways(source(48, 60, 52), stack, size)
        for a, b in zip(cpu, dev, strict=True):
            d = (a - b).abs() * 255
            assert d.max() < 6 and d.mean() < 0.5, (d.max(), d.mean())
    assert (cpu[0] - dev[1]).abs().mean() * 255 > 20  # another view's parameters: far apart
    cpu, dev = views_both_ways(D.digits(True).subset(32), "byol_digits", size)  # one channel: no hue, saturation
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(cpu, dev, strict=True))


def test_multi_crop_views_match_the_cpu_paths_where_the_parameters_match():
    torch.set_num_threads(1)
    src = source(16, 60, 52, float_=True)
    idx = list(range(16))
    cpu = default_collate(MC.MultiCropSet(src, "dino", 32, 16, 5, 2, 3).__getitems__(idx))
    batch = default_collate(V.MultiCrops(src, "dino", 32, 16, 5, 2, 3).__getitems__(idx))
    assert [t.shape for t in batch[:4]] == [(16, 2, 3, 32, 32), (16, 3, 3, 16, 16), (16, 2, 13), (16, 3, 13)]
    dev = V.DeviceHalf("multi_crop", src.mean, src.std).stage(batch)
    for a, b in zip(cpu, dev, strict=True):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-4
    none = V.MultiCrops(src, "dino", 32, 16, 5, 2, 0).__getitems__([0])[0]
    assert none[1].shape == (0, 3, 16, 16) and none[3].shape == (0, 13)


def test_supervised_crops_cross_in_the_folders_uint8_and_normalize_on_the_device(tmp_path):
    """polyak-r50's loader: an image folder's crop crosses as uint8, and the device's flip and normalization
    give the CPU path's views bit for bit; a float source crosses as float."""
    from vision_util import image_folder

    folder = D.ImageFolderSource(image_folder(tmp_path), "train", 32)
    textures = source(8, 20, 20, float_=True)
    for src, aug in ((folder, "imagenet"), (textures, "imagenet"), (textures, "translate")):
        idx = list(range(8))
        cpu = default_collate(S.TrainViews(src, aug, 16, 4).__getitems__(idx))
        batch = default_collate(V.TrainCrops(src, aug, 16, 4).__getitems__(idx))
        assert batch[0].dtype == (torch.uint8 if src is folder else torch.float32)
        x, y = V.DeviceHalf("supervised", src.mean, src.std).stage(batch)
        assert torch.equal(y, cpu[1]) and torch.allclose(x, cpu[0], atol=1e-6, rtol=0)
        assert batch[1].any() and not batch[1].all()  # both flipped and unflipped items were compared


def test_items_are_a_pure_function_of_seed_epoch_and_index():
    src = source(8)
    a, b = V.TwoViewCrops(src, "byol", 16, 1), V.TwoViewCrops(src, "byol", 16, 1)
    b.set_epoch(0)
    for x, y in zip(a.__getitems__([3, 5]), [b[3], b[5]], strict=True):
        assert all(torch.equal(u, v) for u, v in zip(x[:2], y[:2], strict=True))
    b.set_epoch(1)
    assert not torch.equal(a[3][1], b[3][1])


def test_a_missing_kornia_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kornia", None)
    with pytest.raises(UserError, match=r"needs kornia: pip install 'emarule\[gpu-augment\]', or --set "
                                        r"data.augment_on=cpu"):
        V.training_set("two_views", "device", source(2), "byol", 8, 0)
    assert isinstance(V.training_set("two_views", "cpu", source(2), "byol", 8, 0)[0], D.TwoViewSet)


def test_the_full_size_recipes_use_the_device_and_their_presets_the_cpu():
    for name in ("byol-vit", "byol-r18", "byol-r50-lars", "dino-vit", "polyak-r50"):
        assert load_spec(name)["data"]["augment_on"] == "device", name
        for preset in ("cpu", "tiny"):
            assert load_spec(name, preset=preset)["data"]["augment_on"] == "cpu", (name, preset)


# --- a run on the device path: reproducible, and resumed bit for bit -----------------------------------------


def context(tmp: Path, out: str, seed: int = 0, resume: bool = False) -> RunContext:
    spec = load_spec("byol-vit", preset="tiny", overrides=["data.augment_on=device"])
    return RunContext(spec=spec, kappa=1.0, ema_rule="exponential", plan=plan(spec, 1.0, "exponential", None),
                      out=tmp / out, preset="tiny", quiet=True, resume=resume, seed=seed,
                      checkpoint_every_epochs=100.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device_views")
    with one_thread():
        for out, seed in (("a", 0), ("b", 0), ("other", 1)):
            run_task(context(tmp, out, seed))
    return tmp


def test_a_seeded_run_on_the_device_path_repeats_itself(runs):
    a, b, other = (load_checkpoint(runs / n) for n in ("a", "b", "other"))
    assert a["finished"] and a["clock"] == b["clock"]
    for key in ("model", "emas", "optimizer"):
        assert tensors_equal(a[key], b[key]), key
    assert not tensors_equal(a["model"], other["model"])


def test_a_run_stopped_mid_epoch_resumes_the_same_views_bit_for_bit(tmp_path, runs):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = context(tmp_path, "cut")
        train_until_sigterm(ctx, build_parts(ctx), at_call=2)  # at the second step of the first epoch's four
        cut_at = load_checkpoint(tmp_path / "cut")
        assert not cut_at["finished"] and cut_at["clock"]["step"] == 2
        run_task(context(tmp_path, "cut", resume=True))
    finally:
        torch.set_num_threads(threads)
    got, want = load_checkpoint(tmp_path / "cut"), load_checkpoint(runs / "a")
    assert got["finished"] and got["clock"] == want["clock"]
    for key in ("model", "emas", "optimizer"):
        assert tensors_equal(got[key], want[key]), key


def test_the_device_half_runs_in_float32_under_a_bf16_autocast():
    src = source(4)
    batch = default_collate(V.TwoViewCrops(src, "byol", 16, 0).__getitems__([0, 1, 2, 3]))
    half = V.DeviceHalf("two_views", src.mean, src.std)
    plain = half.stage(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = half.stage(batch)
    assert cast[0].dtype == torch.float32 and torch.equal(cast[0], plain[0]) and torch.equal(cast[1], plain[1])


def test_a_run_recorded_without_augment_on_is_one_made_on_the_cpu_path():
    """--resume and reproduce's reuse compare specs (`config.identity.comparable`): a run whose record has no
    data.augment_on made its views in the workers, as `cpu` does, and not as `device` does."""
    from emarule.config.identity import comparable

    spec = load_spec("byol-vit", preset="tiny")
    recorded = {**spec, "data": {k: v for k, v in spec["data"].items() if k != "augment_on"}}
    assert spec["data"]["augment_on"] == "cpu" and comparable(recorded) == comparable(spec)
    device = load_spec("byol-vit", preset="tiny", overrides=["data.augment_on=device"])
    assert comparable(device) != comparable(spec) and comparable(device) != comparable(recorded)
