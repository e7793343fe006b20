"""The training views cut in two halves (`data.augment_on: device`): the loader's workers decode, crop and
resize, and hand over the crops in the source's dtype (uint8 for ImageNet and CIFAR-10); the training device
then flips, colour-jitters, grays, blurs, solarizes and normalizes a whole micro-batch at once, with kornia's
batched operations and per-item parameters.

Every parameter is drawn in the worker, from the item's own generator (`augment.generator_for`), in the order
`augment.views` draws it (`augment.view_draws`, `augment.colour_draws`), and travels with the crop as 13
float32 numbers (`PARAMS`). An item is still a pure function of (seed, epoch, index): the device half draws
nothing, so a seeded run repeats itself and a resumed run continues the same stream, on any world size.

What differs from the CPU half (`data.augment_on: cpu`): the crop is resized in the source's dtype (a uint8
crop is rounded to whole levels before the colour operations), and kornia computes the hue rotation, the
contrast's mean and the blur in its own order of floating-point operations (tests/vision/test_device_views.py
bounds the difference). The CPU half is kept for the cpu and tiny presets, whose runs it reproduces bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from emarule.errors import UserError
from emarule.vision import augment as A
from emarule.vision.data import TwoViewSet
from emarule.vision.multicrop import MultiCropSet
from emarule.vision.supervised import TrainViews, train_view

AUGMENT_ON = ("cpu", "device")
# One view's parameters, per item: the four switches, the blur's σ, the jitter's four factors, and the jitter
# op at each of its four positions (0 brightness, 1 contrast, 2 saturation, 3 hue, −1 none).
PARAMS = ("flip", "gray", "blur", "solarize", "sigma", "brightness", "contrast", "saturation", "hue",
          "op1", "op2", "op3", "op4")
FLIP, GRAY, BLUR, SOLARIZE, SIGMA = range(5)
FACTORS, OPS = slice(5, 9), slice(9, 13)


def require_kornia() -> None:
    """A one-line UserError naming the fix where kornia, which the device half runs on, is missing."""
    try:
        import kornia  # noqa: F401
    except ImportError:
        raise UserError("data.augment_on=device needs kornia: pip install 'emarule[gpu-augment]', or "
                        "--set data.augment_on=cpu") from None


def pack(c: A.Colour) -> torch.Tensor:
    """`augment.Colour` as an N×13 float32 tensor (`PARAMS`)."""
    cols = [c.flip, c.gray, c.blur, c.solarize, c.sigma, *c.factor, *c.ops.T]
    return torch.from_numpy(np.stack([np.asarray(v, np.float32) for v in cols], 1))


def crops(images: list, aug: A.ViewAug, size: int, draws: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The workers' half of one view of each image: (N×3×size×size crops in the images' dtype, N×13 params)."""
    from torchvision.transforms.v2 import functional as TF

    out, u = [], np.empty((len(images), 14))
    mono = np.array([img.shape[0] == 1 for img in images], bool)
    for k, (img, d) in enumerate(zip(images, draws, strict=True)):
        h, w = img.shape[-2:]
        box, u[k] = A.view_draws(h, w, aug, d)
        top, left, ch, cw = box if box is not None else (0, 0, h, w)
        x = TF.resized_crop(img, top, left, ch, cw, [size, size], antialias=True)
        out.append(x.expand(3, -1, -1))
    return torch.stack(out), pack(A.colour_draws(u, aug, mono))


def _jitter_ops():
    from kornia import enhance as E

    return (E.adjust_brightness_accumulative, E.adjust_contrast_with_mean_subtraction,
            E.adjust_saturation_with_gray_subtraction, lambda x, f: E.adjust_hue(x, f * (2 * math.pi)))


def colour(x: torch.Tensor, params: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    """The device's half: N×3×S×S crops (uint8 or float, on any device) and their N×13 params → the
    normalized float32 views, in `augment.views`' order: flip, jitter, grayscale, blur, solarization."""
    from kornia import color, enhance, filters

    with torch.autocast(x.device.type, enabled=False):  # the views in float32 whatever the step's precision
        x = A.to_float(x.clone() if x.is_floating_point() else x).contiguous()  # the ops below write into it
        p = params.to(x.device, torch.float32)
        plan = params.cpu()  # which items each op takes: one transfer, and index lists built on the host

        def take(mask: torch.Tensor) -> torch.Tensor | None:
            idx = mask.nonzero().view(-1)
            return idx.to(x.device) if len(idx) else None

        if (i := take(plan[:, FLIP] > 0)) is not None:
            x[i] = x[i].flip(-1)
        for position in range(4):
            for op, fn in enumerate(_jitter_ops()):
                if (i := take(plan[:, OPS][:, position] == op)) is not None:
                    x[i] = fn(x[i], p[i, FACTORS][:, op])
        if (i := take(plan[:, GRAY] > 0)) is not None:
            x[i] = color.rgb_to_grayscale(x[i]).expand(-1, 3, -1, -1)
        if (i := take(plan[:, BLUR] > 0)) is not None:
            k, size = A.blur_kernel(x.shape[-1]), x.shape[-1]
            border = "reflect" if k // 2 < size else "replicate"
            x[i] = filters.gaussian_blur2d(x[i], (k, k), p[i, SIGMA][:, None].expand(-1, 2), border_type=border)
        if (i := take(plan[:, SOLARIZE] > 0)) is not None:
            x[i] = enhance.solarize(x[i], 0.5)
        m = torch.tensor(mean, device=x.device)
        s = torch.tensor(std, device=x.device)
        return enhance.normalize(x, m, s)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:])


def coloured(x: torch.Tensor, params: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    """`colour` over B×V×… crops of B items and V views each, back as B×V×3×S×S."""
    return colour(_flat(x), _flat(params), mean, std).view(x.shape)


class TwoViewCrops(TwoViewSet):
    """`TwoViewSet`'s workers' half: item i is (2×3×S×S crops, 2×13 params, label), from the same draws."""

    def __getitems__(self, indices: list) -> list:
        idx = [int(i) for i in indices]
        draws = [d for pair in self.draws(idx, 2) for d in pair]  # view 1, then view 2
        images = [self.source.image(i) for i in idx]
        (c1, p1), (c2, p2) = (crops(images, aug, self.size, draws[v::2]) for v, aug in enumerate((self.aug1,
                                                                                                   self.aug2)))
        return [(torch.stack((c1[k], c2[k])), torch.stack((p1[k], p2[k])), self.source.label(i))
                for k, i in enumerate(idx)]


class MultiCrops(MultiCropSet):
    """`MultiCropSet`'s workers' half: item i is (G global crops, L local crops, their G×13 and L×13 params,
    label), from the same draws."""

    def __getitems__(self, indices: list) -> list:
        idx = [int(i) for i in indices]
        views, draws, images = self.crops_of(idx)
        made = [crops(images, aug, size, [d[c] for d in draws]) for c, (aug, size) in enumerate(views)]
        g, n = len(self.global_augs), len(idx)

        def stacked(part: list, size: int) -> tuple[torch.Tensor, torch.Tensor]:
            if not part:
                return torch.zeros(n, 0, 3, size, size, dtype=images[0].dtype), torch.zeros(n, 0, len(PARAMS))
            return torch.stack([c for c, _ in part], 1), torch.stack([p for _, p in part], 1)

        (gx, gp), (lx, lp) = stacked(made[:g], self.global_size), stacked(made[g:], self.local_size)
        return [(gx[k], lx[k], gp[k], lp[k], self.source.label(i)) for k, i in enumerate(idx)]


class TrainCrops(TrainViews):
    """`TrainViews`' workers' half: item i is (crop in the source's dtype, whether to flip it, label)."""

    def __getitems__(self, indices: list) -> list:
        idx = [int(i) for i in indices]
        return [(*train_view(self.source, i, self.size, self.augmentation, self.generator(i), as_float=False),
                 self.source.label(i)) for i in idx]


@dataclass(frozen=True)
class DeviceHalf:
    """The device's half of a training set's batch, for the task's loss: `stage(batch)` is the batch the CPU
    half would have given, made on the batch's device."""

    kind: str  # "two_views", "multi_crop" or "supervised"
    mean: tuple
    std: tuple

    def stage(self, batch):
        if self.kind == "two_views":
            x, params, y = batch
            v = coloured(x, params, self.mean, self.std)
            return v[:, 0], v[:, 1], y
        if self.kind == "multi_crop":
            gx, lx, gp, lp, y = batch
            loc = coloured(lx, lp, self.mean, self.std) if lx.shape[1] else lx.float()
            return coloured(gx, gp, self.mean, self.std), loc, y
        x, flip, y = batch
        from kornia import enhance

        with torch.autocast(x.device.type, enabled=False):
            x = A.to_float(x).expand(-1, 3, -1, -1)
            x = torch.where(flip.to(torch.bool).view(-1, 1, 1, 1), x.flip(-1), x)
            m, s = (torch.tensor(v, device=x.device) for v in (self.mean, self.std))
            return enhance.normalize(x, m, s), y

    def before(self, loss):
        """`loss` taking its micro-batch through `stage` first, inside the step, on the training device."""

        def staged(model, teacher, batch, now):
            return loss(model, teacher, self.stage(batch), now)

        return staged


def training_set(kind: str, augment_on: str, source, *args, **kwargs):
    """(the task's training set for `data.augment_on`, a function that readies the task's loss for its batches):
    the CPU half's set and the loss as it is, or the workers' half and the loss taking its batch through the
    device's (`DeviceHalf.before`). `kind` is two_views, multi_crop or supervised; `args` are the set's own."""
    if augment_on not in AUGMENT_ON:
        raise UserError(f"data.augment_on {augment_on!r}: use cpu or device")
    cpu, device = {"two_views": (TwoViewSet, TwoViewCrops), "multi_crop": (MultiCropSet, MultiCrops),
                   "supervised": (TrainViews, TrainCrops)}[kind]
    if augment_on == "cpu":
        return cpu(source, *args, **kwargs), lambda loss: loss
    require_kornia()
    return device(source, *args, **kwargs), DeviceHalf(kind, source.mean, source.std).before
