"""How the image sources are split and capped: the digits' train and test splits share no image and
together hold all 1,797 of them, and a capped folder source keeps every class of a class-sorted folder."""

from collections import Counter

import torch

from vision_util import image_folder

from emarule.vision import data as VD


def rows(source):
    """Each item as (image bytes, label): the digits hold no two identical images, so this names an item."""
    return [(source.images[i].numpy().tobytes(), int(source.labels[i])) for i in range(len(source))]


def test_the_digits_splits_are_disjoint_and_cover_every_image():
    train, test = rows(VD.digits(True)), rows(VD.digits(False))
    assert (len(train), len(test)) == (1437, VD.DIGITS_TEST)
    # A test image also seen in training would score memorisation as generalisation.
    assert len(set(train) & set(test)) == 0
    images, target = VD.digits_arrays()
    every = Counter(((torch.tensor(x, dtype=torch.float32) / 16.0)[None].numpy().tobytes(), int(y))
                    for x, y in zip(images, target, strict=True))
    assert Counter(train + test) == every


def test_the_test_split_holds_every_class():
    assert set(VD.digits(False).labels.tolist()) == set(range(10))


def test_a_capped_folder_keeps_every_class(tmp_path):
    """ImageFolder lists items class by class: the first n of them would be a few classes only."""
    root = image_folder(tmp_path, classes=("n01", "n02", "n03", "n04"), n=5)
    train, test = VD.load_sources("imagenet", root, 24, 8, 4, 4)
    assert isinstance(train, VD.Subset) and (len(train), len(test)) == (8, 4)
    assert Counter(train.label(i) for i in range(len(train))) == {0: 2, 1: 2, 2: 2, 3: 2}
    assert sorted(test.label(i) for i in range(len(test))) == [0, 1, 2, 3]


def test_a_subset_is_spread_evenly_over_its_source():
    labels = torch.arange(10).repeat_interleave(30)  # 300 items sorted by class
    base = VD.TensorSource(torch.arange(300, dtype=torch.float32).view(300, 1, 1, 1), labels, "sorted",
                           VD.DIGITS_MEAN, VD.DIGITS_STD, 10)
    sub = VD.Subset(base, 20)
    picked = [int(sub.image(i)) for i in range(len(sub))]
    assert picked == list(range(0, 300, 15))  # every 15th item, from the first
    assert [sub.label(i) for i in range(len(sub))] == [int(labels[j]) for j in picked]
    assert Counter(sub.label(i) for i in range(len(sub))) == {c: 2 for c in range(10)}
    assert len(VD.Subset(base, 1000)) == 300  # a cap above the source's size keeps it whole
