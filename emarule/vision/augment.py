"""BYOL's two-view augmentations on tensors, driven by an explicit `torch.Generator`.

Every random draw of a view comes from the generator passed in, never from torch's, numpy's
or Python's global RNG, so a training item is a pure function of (seed, epoch, index):
`item_seed` mixes the three into the generator's seed. The same item at the same epoch gives
the same two views on any rank, any world size and any micro-batch split; a new epoch gives
new views.

Stacks (`data.augmentation`):

- ``byol`` (ImageNet, Grill et al. 2020, Table 6): random resized crop (scale 0.08–1, ratio
  3/4–4/3), horizontal flip (p=0.5), color jitter (brightness 0.4, contrast 0.4, saturation 0.2,
  hue 0.1; p=0.8, random order), grayscale (p=0.2), Gaussian blur (σ∈[0.1, 2], kernel ≈ 10 % of
  the image; p=1.0 in view 1, 0.1 in view 2), solarization (p=0 in view 1, 0.2 in view 2).
- ``byol_cifar10``: the same stack with the blur dropped (p=0 in both views: it destroys
  32×32 images), solarization kept asymmetric (0 / 0.2), as in the common CIFAR-10 BYOL
  configurations (e.g. solo-learn). The paper names the stack "BYOL CIFAR10" without listing
  it; this is our reading.
- ``byol_digits``: ``byol_cifar10`` with a milder crop (scale 0.5–1) and no flip, for the
  8×8 scikit-learn digits of the `cpu`/`tiny` presets (a 0.08 crop of an 8×8 digit is 2×2
  pixels, and a flipped digit is another digit).
- ``none``: resize and normalize only (tests).

Views are float32 C×S×S tensors, normalized with the data set's mean and std.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from emarule.engine.seeding import mix

def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit generator seed that depends on (seed, epoch, index) and on nothing else."""
    return mix(seed, epoch, index, 0xA06)


def generator_for(seed: int, epoch: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(item_seed(seed, epoch, index))
    return g


class SeededViews:
    """A training set whose item i at epoch e is a pure function of (seed, e, i): `set_epoch` from the
    engine, `generator(i)` for the item's random draws, one item per image of `source`."""

    def __init__(self, source, seed: int):
        self.source, self.seed, self.epoch = source, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def generator(self, i: int) -> torch.Generator:
        return generator_for(self.seed, self.epoch, int(i))


@dataclass(frozen=True)
class ViewAug:
    """One view's augmentation parameters (probabilities and ranges)."""

    crop_scale: tuple = (0.08, 1.0)
    crop_ratio: tuple = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    gray_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple = (0.1, 2.0)
    solarize_p: float = 0.0
    crop: bool = True


_BYOL1 = ViewAug(blur_p=1.0, solarize_p=0.0)
_BYOL2 = ViewAug(blur_p=0.1, solarize_p=0.2)
_CIFAR1 = ViewAug(blur_p=0.0, solarize_p=0.0)
_CIFAR2 = ViewAug(blur_p=0.0, solarize_p=0.2)
_NONE = ViewAug(crop=False, flip_p=0.0, jitter_p=0.0, gray_p=0.0)

STACKS: dict[str, tuple[ViewAug, ViewAug]] = {
    "byol": (_BYOL1, _BYOL2),
    "byol_cifar10": (_CIFAR1, _CIFAR2),
    "byol_digits": (replace(_CIFAR1, crop_scale=(0.5, 1.0), flip_p=0.0),
                    replace(_CIFAR2, crop_scale=(0.5, 1.0), flip_p=0.0)),
    "none": (_NONE, _NONE),
}

_GRAY = (0.299, 0.587, 0.114)


class _Draws:
    """Uniform numbers drawn in one call from the generator, consumed in a fixed order."""

    def __init__(self, g: torch.Generator, n: int = 64):
        self.values = torch.rand(n, generator=g, dtype=torch.float64).tolist()
        self.i = 0

    def u(self, lo: float = 0.0, hi: float = 1.0) -> float:
        v = self.values[self.i]
        self.i += 1
        return lo + (hi - lo) * v


def crop_box(h: int, w: int, scale: tuple, ratio: tuple, d: _Draws) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (10 tries, then a center crop), from our draws."""
    area = h * w
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * d.u(*scale)
        aspect = math.exp(d.u(*log_r))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        u_i, u_j = d.u(), d.u()
        if 0 < cw <= w and 0 < ch <= h:
            i = min(int(u_i * (h - ch + 1)), h - ch)
            j = min(int(u_j * (w - cw + 1)), w - cw)
            return i, j, ch, cw
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def to_float(img: torch.Tensor) -> torch.Tensor:
    return img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()


def resize(img: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of a C×H×W float tensor to C×size×size (antialiased when shrinking)."""
    if img.shape[-2:] == (size, size):
        return img
    shrink = img.shape[-1] > size or img.shape[-2] > size
    return F.interpolate(img[None], size=(size, size), mode="bilinear", align_corners=False,
                         antialias=shrink)[0]


def gray(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img[0], img[1], img[2]
    return (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * b)[None]


def _blend(a: torch.Tensor, b: torch.Tensor | float, f: float) -> torch.Tensor:
    return (f * a + (1.0 - f) * b).clamp_(0.0, 1.0)


def _hue(img: torch.Tensor, shift: float) -> torch.Tensor:
    """Hue rotation by `shift` (in turns) through HSV, as torchvision's adjust_hue."""
    r, g, b = img[0], img[1], img[2]
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    eq = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eq, ones, maxc)
    crd = torch.where(eq, ones, cr)
    rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = torch.fmod((hr + hg + hb) / 6.0 + 1.0, 1.0)
    h = torch.fmod(h + shift + 1.0, 1.0)
    v = maxc
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    mask = i[None] == torch.arange(6)[:, None, None]
    a1 = torch.stack((v, q, p, p, t, v))
    a2 = torch.stack((t, v, v, q, p, p))
    a3 = torch.stack((p, p, t, v, v, q))
    out = torch.stack([(mask * a).sum(0) for a in (a1, a2, a3)])
    return out


def gaussian_blur(img: torch.Tensor, sigma: float) -> torch.Tensor:
    size = img.shape[-1]
    k = max(3, (int(0.1 * size) // 2) * 2 + 1)
    x = torch.arange(k, dtype=img.dtype) - (k - 1) / 2
    w = torch.exp(-(x**2) / (2 * sigma**2))
    w = w / w.sum()
    c = img.shape[0]
    pad = k // 2
    out = F.pad(img[None], (pad, pad, pad, pad), mode="reflect" if pad < size else "replicate")
    out = F.conv2d(out, w.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    out = F.conv2d(out, w.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)
    return out[0]


def apply_view(img: torch.Tensor, aug: ViewAug, size: int, g: torch.Generator) -> torch.Tensor:
    """One augmented view (float, [0, 1], C×size×size) of a uint8 or float C×H×W image."""
    d = _Draws(g)
    if aug.crop:
        h, w = img.shape[-2:]
        i, j, ch, cw = crop_box(h, w, aug.crop_scale, aug.crop_ratio, d)
        img = img[:, i:i + ch, j:j + cw]
    else:
        d.i += 40
    x = resize(to_float(img), size)
    mono = img.shape[0] == 1  # a gray image: saturation and hue are no-ops, skipped
    if mono:
        x = x.expand(3, -1, -1)
    x = x.contiguous()
    # Every draw below is taken whether or not its op applies, so that one op's probability
    # never shifts the randomness of the others.
    flip, jit, g_p, bl, bl_s, sol = d.u(), d.u(), d.u(), d.u(), d.u(), d.u()
    fb = d.u(1 - aug.brightness, 1 + aug.brightness)
    fc = d.u(1 - aug.contrast, 1 + aug.contrast)
    fs = d.u(1 - aug.saturation, 1 + aug.saturation)
    fh = d.u(-aug.hue, aug.hue)
    order = sorted(range(4), key=lambda _: d.u())
    if flip < aug.flip_p:
        x = x.flip(-1)
    if jit < aug.jitter_p:
        for op in order:
            if op == 0 and aug.brightness > 0:
                x = (x * fb).clamp_(0.0, 1.0)
            elif op == 1 and aug.contrast > 0:
                x = _blend(x, gray(x).mean(), fc)
            elif op == 2 and aug.saturation > 0 and not mono:
                x = _blend(x, gray(x), fs)
            elif op == 3 and aug.hue > 0 and not mono:
                x = _hue(x, fh)
    if g_p < aug.gray_p:
        x = gray(x).expand(3, -1, -1).contiguous()
        mono = True
    if bl < aug.blur_p:
        x = gaussian_blur(x, aug.blur_sigma[0] + bl_s * (aug.blur_sigma[1] - aug.blur_sigma[0]))
    if sol < aug.solarize_p:
        x = torch.where(x >= 0.5, 1.0 - x, x)
    return x


def normalize(x: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s
