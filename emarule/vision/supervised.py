"""Supervised image classification data: one augmented view per training item, and evaluation views.

- `TrainViews`: item i at epoch e is (image, label) with the view drawn from a generator seeded by
  (seed, e, i) (`emarule.vision.augment.generator_for`), so that it does not depend on the world
  size, the micro-batching or the DataLoader's workers.
  - ``imagenet`` (the standard stack, as timm's and torchvision's ResNet recipes): random resized
    crop (scale 0.08–1, ratio 3/4–4/3, torchvision's box sampler) to `image_size`, horizontal flip
    with p = 0.5.
  - ``translate``: a random `image_size` crop without resizing, and the flip (generated textures,
    whose class a rescale would change).
- `EvalViews`: resize the shorter side to `image_size / 0.875` (256 for 224) and centre-crop
  `image_size`; small splits are prepared once.
- ImageNet itself is `emarule.vision.data.imagenet(root, size)`, shared with the self-supervised tasks.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from emarule.errors import UserError
from emarule.vision import augment as A
from emarule.vision.data import ImageFolderSource, TensorSource

AUGMENTATIONS = ("imagenet", "translate")
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
EVAL_CROP = 0.875  # 224 of 256
CACHE_LIMIT = 20000  # evaluation splits up to this size are prepared once


def eval_resize(size: int) -> int:
    return int(round(size / EVAL_CROP))


def is_folder(source) -> bool:
    return isinstance(source, ImageFolderSource)


def pil_image(source: ImageFolderSource, i: int):
    return source.pil(i)  # RGB; a file that fails to decode is an ItemError naming it


def pil_to_tensor(img) -> torch.Tensor:
    from torchvision.transforms.functional import pil_to_tensor as to_tensor

    return to_tensor(img)


def pil_to_float(img) -> torch.Tensor:
    return pil_to_tensor(img).float().div_(255.0)


def three_channels(x: torch.Tensor) -> torch.Tensor:
    return x.expand(3, -1, -1).contiguous() if x.shape[0] == 1 else x


def train_view(source, i: int, size: int, augmentation: str, g: torch.Generator,
               as_float: bool = True) -> tuple[torch.Tensor, bool]:
    """One augmented view before its flip, float C×size×size in [0, 1] (or the source's own range), not
    normalised, and whether to flip it. With `as_float` false the view keeps the source's dtype (uint8 for
    an image folder), for the training device to convert (`emarule.vision.device_views`)."""
    d = A._Draws(g)
    if is_folder(source):
        from PIL import Image

        img = pil_image(source, i)
        top, left, ch, cw = A.crop_box(img.height, img.width, CROP_SCALE, CROP_RATIO, d)
        # crop and resize in one resampling, as torchvision's RandomResizedCrop does on PIL images
        x = img.resize((size, size), Image.BILINEAR, box=(left, top, left + cw, top + ch))
        x = pil_to_float(x) if as_float else pil_to_tensor(x)
    else:
        img = A.to_float(source.image(i)) if as_float else source.image(i)
        h, w = img.shape[-2:]
        if augmentation == "imagenet":
            top, left, ch, cw = A.crop_box(h, w, CROP_SCALE, CROP_RATIO, d)
            x = A.resize(img[:, top:top + ch, left:left + cw], size)
        else:
            top, left = translate_box(h, w, size, d)
            x = img[:, top:top + size, left:left + size]
    return x, d.u() < 0.5


def translate_box(h: int, w: int, size: int, d) -> tuple[int, int]:
    """`translate`'s crop of an h×w image: (top, left) of its size×size window, from the view's first two draws."""
    if h < size or w < size:
        raise UserError(f"data.augmentation translate crops {size} px from images of {h}×{w}; "
                        f"use imagenet, or a smaller data.image_size")
    return min(int(d.u() * (h - size + 1)), h - size), min(int(d.u() * (w - size + 1)), w - size)


def eval_view(source, i: int, size: int) -> torch.Tensor:
    """Shorter side to size / 0.875, centre crop of size (float, not normalised)."""
    short = eval_resize(size)
    if is_folder(source):
        from PIL import Image

        img = pil_image(source, i)
        w, h = img.size
        nh, nw = (short, max(short, round(w * short / h))) if h <= w else (max(short, round(h * short / w)), short)
        x = pil_to_float(img.resize((nw, nh), Image.BILINEAR))
    else:
        x = A.to_float(source.image(i))
        h, w = x.shape[-2:]
        nh, nw = (short, max(short, round(w * short / h))) if h <= w else (max(short, round(h * short / w)), short)
        if (nh, nw) != (h, w):
            x = F.interpolate(x[None], size=(nh, nw), mode="bilinear", align_corners=False,
                              antialias=nh < h)[0]
    top, left = (nh - size) // 2, (nw - size) // 2
    return three_channels(x[:, top:top + size, left:left + size])


class TrainViews(A.SeededViews):
    """The training set: item i at epoch e is (view, label), a pure function of (seed, e, i)."""

    def __init__(self, source, augmentation: str, image_size: int, seed: int):
        if augmentation not in AUGMENTATIONS:
            raise UserError(f"data.augmentation {augmentation!r}: use {' or '.join(AUGMENTATIONS)}")
        super().__init__(source, seed)
        self.augmentation, self.size = augmentation, image_size

    def __getitems__(self, indices: list) -> list:
        """A micro-batch: each item cropped on its own, then flipped and normalized together (a call per
        batch, not per item, on the small views of the CPU presets); bitwise the items one at a time."""
        idx = [int(i) for i in indices]
        if self.augmentation == "translate" and isinstance(self.source, TensorSource):
            x, labels = self.translated(idx)
        else:
            crops, flips = zip(*(train_view(self.source, i, self.size, self.augmentation, self.generator(i))
                                 for i in idx), strict=True)
            x, flip, labels = torch.stack(crops), torch.tensor(flips), [self.source.label(i) for i in idx]
            x[flip] = x[flip].flip(-1)
        x = A.normalize(x.expand(-1, 3, -1, -1), self.source.mean, self.source.std)
        return [(x[k], labels[k]) for k in range(len(idx))]

    def translated(self, idx: list) -> tuple[torch.Tensor, list]:
        """`translate` on images held in one tensor: (the crops, flipped where drawn, as floats; the labels).
        Each item's draws are `train_view`'s (top, left, flip, from its own generator, reseeded rather than
        made anew), but the crops are numpy slices, stacked and flipped together: the same pixels as a torch
        slice per item, which costs more than the draws on 16 px views; `to_float` is elementwise."""
        images, size = self.source.images.numpy(), self.size
        h, w = images.shape[-2:]
        g, crops, flips = torch.Generator(), [], []
        for i in idx:
            g.manual_seed(A.item_seed(self.seed, self.epoch, i))
            d = A._Draws(g, 3)  # train_view's three draws: the first 3 of any longer stream of the generator
            top, left = translate_box(h, w, size, d)
            crops.append(images[i, :, top:top + size, left:left + size])
            flips.append(d.u() < 0.5)
        x, flip = np.stack(crops), np.array(flips, bool)
        x[flip] = x[flip][..., ::-1]
        return A.to_float(torch.from_numpy(x)), self.source.labels[idx].tolist()


class EvalViews:
    """The validation split's views and labels."""

    def __init__(self, source, image_size: int):
        self.source, self.size = source, image_size
        self.cache = [None] * len(source) if len(source) <= CACHE_LIMIT and not is_folder(source) else None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        if self.cache is not None and self.cache[i] is not None:
            return self.cache[i]
        x = A.normalize(eval_view(self.source, i, self.size), self.source.mean, self.source.std)
        item = (x, self.source.label(i))
        if self.cache is not None:
            self.cache[i] = item
        return item
