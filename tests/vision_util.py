"""A tiny ImageNet-layout tree (train/ and val/ class folders of random 36×36 JPEGs) for the loader tests
and the corrupt-data examples of docs/faults.md."""

from pathlib import Path

import numpy as np
from PIL import Image


def image_folder(root: Path, classes=("n01", "n02"), val_classes=None, n=16) -> Path:
    g = np.random.default_rng(0)
    for split, names, count in (("train", classes, n), ("val", val_classes or classes, 4)):
        for c in names:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(g.integers(0, 255, (36, 36, 3), dtype=np.uint8)).save(d / f"{i}.JPEG")
    return root
