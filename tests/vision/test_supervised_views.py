"""The supervised training set makes a micro-batch at once: each item must be bitwise the one-image
pipeline (crop, flip, gray to three channels, normalize), on the textures (translate) and on resized crops."""

import torch

from emarule.vision import augment as A
from emarule.vision import supervised as S
from emarule.vision.data import digits, synthetic
from emarule.vision.textures import textures


def one_image(ds, i):
    x, flip = S.train_view(ds.source, i, ds.size, ds.augmentation, ds.generator(i))
    x = S.three_channels(x.flip(-1) if flip else x)
    return A.normalize(x, ds.source.mean, ds.source.std)


def test_a_batch_of_training_views_is_bitwise_each_view_made_alone():
    cases = [(textures(True, 96, 16, 1.0, 0), "translate", 16), (synthetic(True, 96, 32, 4), "imagenet", 24),
             (digits(True), "imagenet", 16)]
    for source, augmentation, size in cases:
        ds = S.TrainViews(source, augmentation, size, seed=5)
        ds.set_epoch(3)
        batch = ds.__getitems__(list(range(10, 74)))
        flipped = 0
        for k, (x, y) in enumerate(batch):
            assert x.shape == (3, size, size) and y == source.label(10 + k)
            assert torch.equal(x, one_image(ds, 10 + k)), (augmentation, k)
            g = ds.generator(10 + k)
            flipped += S.train_view(source, 10 + k, size, augmentation, g)[1]
        assert 0 < flipped < len(batch)  # both branches of the flip were checked
