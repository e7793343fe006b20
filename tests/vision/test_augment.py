"""A batch's views are made together, their colour operations in numpy; each must be bitwise the view
that the same operations give in torch on one image (`augment_reference.reference_view`, the oracle):
every stack of BYOL and DINO, on the data sources the presets use (uint8 RGB shapes and CIFAR-like
images, float gray digits), at sizes that shrink and enlarge; and the training sets' batches must be
bitwise their items one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emarule.vision import augment as A
from emarule.vision import multicrop as MC
from augment_reference import hue, reference_view
from emarule.vision.data import TwoViewSet, digits, synthetic


def _shapes(n):
    from emarule.vision import shapes as S

    x, _ = S.load(S.ShapesRequest(n, 0))
    return x


# Every view kind the presets and recipes use: BYOL's pairs, DINO's globals and its local crop.
VIEWS = {f"{name}/{k}": aug for name, pair in A.STACKS.items() for k, aug in enumerate(pair)}
VIEWS.update({f"{name}/{k}": aug for name, triple in MC.STACKS.items() for k, aug in enumerate(triple)})


@pytest.mark.parametrize("source,size", [("shapes", 16), ("shapes", 8), ("synthetic", 24), ("digits", 16)])
def test_every_view_is_bitwise_the_torch_reference(source, size):
    images = {"shapes": lambda: _shapes(40), "synthetic": lambda: synthetic(True, 40, 32, 4).images,
              "digits": lambda: digits(True).images[:40]}[source]()
    applied = set()
    for name, aug in VIEWS.items():
        # The whole batch at once, as the training sets make it, each image from its own generator.
        batch = A.views(list(images), aug, size, [A._Draws(A.generator_for(3, 1, i)) for i in range(len(images))])
        assert batch.dtype == np.float32 and batch.shape == (len(images), 3, size, size), name
        for i, img in enumerate(images):
            want = reference_view(img, aug, size, A.generator_for(3, 1, i), applied)
            got = torch.from_numpy(batch[i])
            assert torch.equal(got, want), (name, source, i, (got - want).abs().max().item())
        one = A.apply_view(images[0], aug, size, A.generator_for(3, 1, 0))
        assert one.is_contiguous() and torch.equal(one, torch.from_numpy(batch[0])), name
    # The check means something only where the draws reached every operation (gray digits skip the
    # colour ones, which are no-ops on them).
    every = {"flip", "brightness", "contrast", "gray", "blur", "solarize"}
    assert every | ({"saturation", "hue"} if source != "digits" else set()) <= applied


def test_hue_matches_the_reference_on_ties_and_grays():
    """Pixels where two channels tie for the maximum, and pure grays, take the HSV formula's edge branches."""
    vals = torch.tensor([0.0, 0.25, 0.5, 1.0])
    grid = torch.cartesian_prod(vals, vals, vals).T.reshape(3, 8, 8).contiguous()
    for shift in (-0.1, -0.03, 0.0, 0.05, 0.1):
        got = A._hue(np.stack([grid.numpy()] * 2), np.array([shift, shift]))
        assert torch.equal(torch.from_numpy(got[1]), hue(grid, shift))


def test_a_training_sets_batch_is_bitwise_its_items_one_at_a_time():
    from emarule.vision.data import load_sources

    src, _ = load_sources("shapes", None, 16, 96, 16, 5)
    sets = [TwoViewSet(src, "byol_cifar10", 16, seed=4), MC.MultiCropSet(src, "dino", 16, 8, 4, 2, 3)]
    for ds in sets:
        ds.set_epoch(2)
        batch = ds.__getitems__(list(range(5, 37)))
        for k, item in enumerate(batch):
            alone = ds[5 + k]
            assert item[-1] == alone[-1]
            assert all(torch.equal(a, b) for a, b in zip(item[:-1], alone[:-1], strict=True)), (type(ds).__name__, k)
        assert not torch.equal(batch[0][0], batch[1][0])
