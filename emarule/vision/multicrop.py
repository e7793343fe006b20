"""DINO's multi-crop training set: two global crops for teacher and student, local crops for the student.

Item i at epoch e is `(globals, locals, label)`: `globals` is G×3×S×S (S = `data.image_size`),
`locals` is L×3×s×s (s = `data.local_size`; 0×3×s×s without local crops), each crop normalized
with the source's mean and std. Every draw comes from one generator seeded by (seed, e, i)
(`emarule.vision.augment.generator_for`), consumed crop after crop in a fixed order, so an item is
the same on any rank, world size or micro-batch split, and a new epoch gives new crops.

Stacks (`data.augmentation`), each (global 1, global 2, local):

- ``dino``: DINO's `DataAugmentationDINO` (Caron et al. 2021, facebookresearch/dino main_dino.py):
  random resized crop (global scale `data.global_scale`, default (0.4, 1); local
  `data.local_scale`, default (0.05, 0.4)), horizontal flip (p=0.5), color jitter (0.4, 0.4, 0.2,
  0.1; p=0.8), grayscale (p=0.2), Gaussian blur σ∈[0.1, 2] with p = 1.0 / 0.1 / 0.5, solarization
  p = 0 / 0.2 / 0. The crops are resized bilinearly with antialiasing (DINO: bicubic) and blurred
  with a kernel of about 10 % of the crop (DINO: PIL's radius); both are our approximations.
- ``dino_digits``: the same without the flip (a flipped digit is another digit), the blur and the
  solarization (at 8×8 they wipe out or invert the strokes; `byol_digits` drops the blur too), for
  the scikit-learn digits of the `cpu`/`tiny` presets; the crop scales still come from the spec.
- ``none``: resize and normalize only (tests).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from emarule.registry.sections import DINO
from emarule.errors import UserError
from emarule.vision import augment as A
from emarule.vision.data import Source

_G1 = A.ViewAug(blur_p=1.0, solarize_p=0.0)
_G2 = A.ViewAug(blur_p=0.1, solarize_p=0.2)
_LOCAL = A.ViewAug(blur_p=0.5, solarize_p=0.0)

STACKS: dict[str, tuple[A.ViewAug, A.ViewAug, A.ViewAug]] = {
    "dino": (_G1, _G2, _LOCAL),
    "dino_digits": tuple(replace(v, flip_p=0.0, blur_p=0.0, solarize_p=0.0) for v in (_G1, _G2, _LOCAL)),
    "none": (A.STACKS["none"][0],) * 3,
}

# main_dino.py's --global_crops_scale and --local_crops_scale: the spec's defaults (emarule/registry/sections.py)
DINO_GLOBAL_SCALE = tuple(DINO["data"]["global_scale"].default)
DINO_LOCAL_SCALE = tuple(DINO["data"]["local_scale"].default)


class MultiCropSet(A.SeededViews):
    """Map-style training set of multi-crop items, a pure function of (seed, epoch, index)."""

    def __init__(self, source: Source, augmentation: str, global_size: int, local_size: int, seed: int,
                 global_crops: int = 2, local_crops: int = 8, global_scale=DINO_GLOBAL_SCALE,
                 local_scale=DINO_LOCAL_SCALE):
        if augmentation not in STACKS:
            raise UserError(f"data.augmentation {augmentation!r}: use one of {', '.join(sorted(STACKS))}")
        for name, (lo, hi) in (("data.global_scale", global_scale), ("data.local_scale", local_scale)):
            if not 0.0 < lo <= hi <= 1.0:
                raise UserError(f"{name} [{lo}, {hi}]: a crop's area fraction needs 0 < low ≤ high ≤ 1")
        g1, g2, loc = STACKS[augmentation]
        crop = augmentation != "none"
        gs, ls = tuple(global_scale), tuple(local_scale)
        # Global crops alternate DINO's two global transforms (blur 1.0, then blur 0.1 + solarize).
        self.global_augs = [replace(g1 if k % 2 == 0 else g2, crop_scale=gs, crop=crop) for k in range(global_crops)]
        self.local_aug = replace(loc, crop_scale=ls, crop=crop)
        super().__init__(source, seed)
        self.global_size, self.local_size, self.local_crops = int(global_size), int(local_size), int(local_crops)
        self.augmentation = augmentation

    def crops_of(self, idx: list) -> tuple[list, list, list]:
        """For items `idx`: each crop's (augmentation, size), each item's `_Draws` per crop, and the images."""
        crops = [(aug, self.global_size) for aug in self.global_augs]
        crops += [(self.local_aug, self.local_size)] * self.local_crops
        # Each item's generator feeds its crops in order: the globals, then the locals.
        draws = self.draws(idx, len(crops))
        return crops, draws, [self.source.image(i) for i in idx]

    def __getitems__(self, indices: list) -> list:
        """A batch of items, made together (`augment.views`): each is bitwise the item `[i]` gives."""
        idx = [int(i) for i in indices]
        crops, draws, images = self.crops_of(idx)
        m, s = self.source.mean, self.source.std
        made = [A.normalized_views(images, aug, size, [d[c] for d in draws], m, s)
                for c, (aug, size) in enumerate(crops)]
        g = len(self.global_augs)
        globals_ = torch.stack(made[:g], 1)
        locals_ = (torch.stack(made[g:], 1) if self.local_crops
                   else torch.zeros(len(idx), 0, 3, self.local_size, self.local_size))
        return [(globals_[k], locals_[k], self.source.label(i)) for k, i in enumerate(idx)]
