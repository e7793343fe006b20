"""`augment.views` makes a batch's crops and colour operations in batches; its output and its draws must be
bitwise those of the one-image-at-a-time implementation it replaced, frozen below as `reference_views`, on
the sources, sizes and view augmentations of the presets (experiments/*.yaml, `cpu` and `tiny`), on gray,
RGB and mixed batches, on 1 and 2 torch threads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from emarule.vision import augment as A
from emarule.vision import multicrop as MC
from emarule.vision.data import TensorSource, digits

# --- The implementation before batching, verbatim (crop_box, gray, _blend, _hue and gaussian_blur are shared:
# the change left them as they were).


def _to_float(img: torch.Tensor) -> torch.Tensor:
    return img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()


def _resize(img: torch.Tensor, size: int) -> torch.Tensor:
    if img.shape[-2:] == (size, size):
        return img
    shrink = img.shape[-1] > size or img.shape[-2] > size
    return F.interpolate(img[None], size=(size, size), mode="bilinear", align_corners=False,
                         antialias=shrink)[0]


def _contrast_mean(x: np.ndarray) -> np.ndarray:
    luma = torch.from_numpy(A.gray(x))
    return np.array([luma[k].mean().item() for k in range(len(x))], np.float32)[:, None, None, None]


def reference_views(images: list, aug: A.ViewAug, size: int, draws: list) -> np.ndarray:
    _F, _ONE = np.float32, np.float32(1.0)
    n = len(images)
    x = np.empty((n, 3, size, size), np.float32)
    mono = np.zeros(n, bool)
    u = np.empty((n, 14))
    for k, (img, d) in enumerate(zip(images, draws, strict=True)):
        if aug.crop:
            h, w = img.shape[-2:]
            i, j, ch, cw = A.crop_box(h, w, aug.crop_scale, aug.crop_ratio, d)
            img = img[:, i:i + ch, j:j + cw]
        else:
            d.i += 40
        x[k] = _resize(_to_float(img), size).numpy()
        mono[k] = img.shape[0] == 1
        u[k] = d.values[d.i:d.i + 14]
        d.i += 14
    flip, jitter, to_gray = u[:, 0] < aug.flip_p, u[:, 1] < aug.jitter_p, u[:, 2] < aug.gray_p
    blur, sol = u[:, 3] < aug.blur_p, u[:, 5] < aug.solarize_p
    sigma = aug.blur_sigma[0] + u[:, 4] * (aug.blur_sigma[1] - aug.blur_sigma[0])
    factor = [lo + (hi - lo) * u[:, 6 + c] for c, (lo, hi) in enumerate((
        (1 - aug.brightness, 1 + aug.brightness), (1 - aug.contrast, 1 + aug.contrast),
        (1 - aug.saturation, 1 + aug.saturation), (-aug.hue, aug.hue)))]
    order = np.argsort(u[:, 10:14], axis=1, kind="stable")
    x[flip] = x[flip][..., ::-1]
    strength = (aug.brightness, aug.contrast, aug.saturation, aug.hue)
    for position in range(4):
        for op in range(4):
            sel = jitter & (order[:, position] == op)
            if op >= 2:
                sel &= ~mono
            if strength[op] <= 0 or not sel.any():
                continue
            v, f = x[sel], factor[op][sel]
            if op == 0:
                x[sel] = A._clip(v * A._per_item(f))
            elif op == 1:
                x[sel] = A._blend(v, _contrast_mean(v), f)
            elif op == 2:
                x[sel] = A._blend(v, A.gray(v), f)
            else:
                x[sel] = A._hue(v, f)
    if to_gray.any():
        x[to_gray] = A.gray(x[to_gray])
    for k in np.flatnonzero(blur):
        x[k] = A.gaussian_blur(torch.from_numpy(x[k]), float(sigma[k])).numpy()
    if sol.any():
        v = x[sol]
        x[sol] = np.where(v >= _F(0.5), _ONE - v, v)
    return x


# --- The checks.


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _shapes(n: int) -> torch.Tensor:
    from emarule.vision import shapes as S

    return S.load(S.ShapesRequest(n, 0))[0]  # uint8 3×32×32


def _dino_augs(global_scale, local_scale) -> list:
    """DINO's global and local view augmentations, as MultiCropSet builds them for `dino_digits`."""
    src = TensorSource(torch.zeros(1, 1, 8, 8), torch.zeros(1, dtype=torch.int64), "x", (0.5,), (0.5,), 1)
    mc = MC.MultiCropSet(src, "dino_digits", 8, 4, 0, 2, 2, global_scale, local_scale)
    return mc.global_augs + [mc.local_aug]


def _same(images: list, aug: A.ViewAug, size: int, seed: int, epoch: int, where) -> None:
    d_ref = [A._Draws(A.generator_for(seed, epoch, i)) for i in range(len(images))]
    d_new = [A._Draws(A.generator_for(seed, epoch, i)) for i in range(len(images))]
    want = reference_views(images, aug, size, d_ref)
    got = A.views(images, aug, size, d_new)
    assert got.dtype == np.float32 and got.shape == want.shape, where
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (where, np.abs(got - want).max())
    assert [d.i for d in d_new] == [d.i for d in d_ref], where


def _random_batches(pool: list, count: int, rng: np.random.Generator, most: int = 64):
    for _ in range(count):
        n = int(rng.integers(1, most + 1))
        yield [pool[int(k)] for k in rng.integers(0, len(pool), n)], int(rng.integers(0, 2**31))


# (source, size, view augmentations) of each cpu / tiny preset that makes two-view or multi-crop batches.
_DIGITS = list(A.STACKS["byol_digits"])
PRESETS = {
    "byol-vit cpu": ("shapes", 16, list(A.STACKS["byol_cifar10"])),
    "dino-vit cpu globals": ("shapes", 16, _dino_augs((0.8, 1.0), MC.DINO_LOCAL_SCALE)[:2]),
    "dino-vit cpu locals": ("shapes", 8, _dino_augs((0.8, 1.0), MC.DINO_LOCAL_SCALE)[2:]),
    "byol-r18, byol-r50-lars cpu": ("digits", 16, _DIGITS),
    "byol-vit, byol-r18, byol-r50-lars tiny": ("digits", 8, _DIGITS),
    "dino-vit tiny globals": ("digits", 8, _dino_augs((0.5, 1.0), (0.2, 0.5))[:2]),
    "dino-vit tiny locals": ("digits", 4, _dino_augs((0.5, 1.0), (0.2, 0.5))[2:]),
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_views_are_bitwise_the_reference_on_the_presets(preset, threads):
    source, size, augs = PRESETS[preset]
    pool = list(_shapes(300)) if source == "shapes" else list(digits(True).images[:300])
    rng = np.random.default_rng([threads, size, len(preset)])
    for b, (images, seed) in enumerate(_random_batches(pool, 24, rng)):
        aug = augs[b % len(augs)]
        _same(images, aug, size, seed, b, (preset, b))


def test_views_are_bitwise_the_reference_on_mixed_and_gray_batches(threads):
    """uint8 RGB, uint8 gray, float gray and float RGB images of different sizes in one batch, and gray batches,
    through every stack (blur and solarization included) and the plain resize of ``none``."""
    rgb = _shapes(64)
    gray_u8 = [img[:1].clone() for img in rgb[:32]]
    gray = gray_u8 + list(digits(True).images[:64])
    pool = list(rgb) + gray + [A.to_float(img[:, 4:28, 2:30]) for img in rgb[32:]]
    augs = [a for pair in A.STACKS.values() for a in pair] + list(MC.STACKS["dino"])
    augs.append(replace(MC.STACKS["dino"][2], crop_scale=(0.05, 0.4)))
    rng = np.random.default_rng(threads)
    for b, (images, seed) in enumerate(_random_batches(pool, 36, rng, most=32)):
        size = (8, 12, 16, 24)[b % 4]
        _same(images, augs[b % len(augs)], size, seed, b, ("mixed", b, size))
        source = gray if b % 2 else gray_u8  # gray of two sizes and dtypes, or of one
        grays = [source[int(k)] for k in rng.integers(0, len(source), len(images))]
        _same(grays, augs[(b + 3) % len(augs)], size, seed, b, ("gray", b, size))


def test_views_are_bitwise_the_reference_at_full_size(threads):
    """224 px views, whose contrast mean sums more pixels than torch sums in one piece on 2+ threads."""
    gen = torch.Generator().manual_seed(5)
    images = list(torch.randint(0, 256, (6, 3, 48, 56), dtype=torch.uint8, generator=gen))
    for aug in (*A.STACKS["byol"], A.STACKS["none"][0]):
        for seed in range(2):
            _same(images, replace(aug, jitter_p=1.0), 224, seed, 0, ("224", aug, seed))


def test_views_of_an_empty_batch():
    assert reference_views([], A.STACKS["byol"][0], 8, []).shape == A.views([], A.STACKS["byol"][0], 8, []).shape
