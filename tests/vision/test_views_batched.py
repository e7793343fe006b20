"""`augment.views` converts, crops, resizes and takes contrast means in batches; its output and where each
item's draws end must be bitwise the one-image torch oracle's (`augment_reference.reference_view`), on the
sources, sizes and view augmentations of the presets (emarule/experiments/*.yaml, `cpu` and `tiny`), on gray, RGB
and mixed batches, on 1 and 2 torch threads."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from emarule.vision import augment as A
from emarule.vision import multicrop as MC
from augment_reference import reference_view
from emarule.vision.data import TensorSource, digits


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
    want = np.stack([reference_view(img, aug, size, None, draws=d).numpy()
                     for img, d in zip(images, d_ref, strict=True)])
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
    "byol-vit, byol-r18, byol-r50-lars cpu": ("shapes", 16, list(A.STACKS["byol_cifar10"])),
    "dino-vit cpu globals": ("shapes", 16, _dino_augs((0.8, 1.0), MC.DINO_LOCAL_SCALE)[:2]),
    "dino-vit cpu locals": ("shapes", 8, _dino_augs((0.8, 1.0), MC.DINO_LOCAL_SCALE)[2:]),
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
    assert A.views([], A.STACKS["byol"][0], 8, []).shape == (0, 3, 8, 8)
