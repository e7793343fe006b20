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

The jitter's operations are torchvision's (ColorJitter), not those of BYOL's own code
(byol/utils/augmentations.py): brightness multiplies by a factor in [0.6, 1.4] where BYOL adds a
delta in [−0.4, 0.4], contrast pulls toward the image's grayscale mean where BYOL pulls each channel
toward its own mean, and the blur pads by reflection where BYOL's pads with zeros. The probabilities,
strengths, random order and clipping after each operation are BYOL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
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
    engine, `generator(i)` for the item's random draws, one item per image of `source`. A subclass makes
    items a micro-batch at a time (`__getitems__`, as the DataLoader asks); one item is a batch of one."""

    def __init__(self, source, seed: int):
        self.source, self.seed, self.epoch = source, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def generator(self, i: int) -> torch.Generator:
        return generator_for(self.seed, self.epoch, int(i))

    def draws(self, indices: list, count: int) -> list:
        """Each item's `count` successive `_Draws` (`[_Draws(g) for _ in range(count)]` on its generator), from
        one call per item: the CPU generator fills a float64 tensor one number after another (a serial kernel),
        so numbers 0–63 of one call of 64·count are the first `_Draws`' 64, the next 64 the second's, and so
        on. One generator for the batch, reseeded per item: a new one costs as much as a reseeding."""
        g, out = torch.Generator(), []
        for i in indices:
            g.manual_seed(item_seed(self.seed, self.epoch, int(i)))
            values = torch.rand(_DRAWS * count, generator=g, dtype=torch.float64).tolist()
            out.append([_Draws.of(values[k * _DRAWS:(k + 1) * _DRAWS]) for k in range(count)])
        return out

    def __getitems__(self, indices: list) -> list:
        raise NotImplementedError

    def __getitem__(self, i: int):
        return self.__getitems__([i])[0]


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


_DRAWS = 64  # uniforms drawn per view: a crop box takes up to 40, the colour 14


class _Draws:
    """Uniform numbers drawn in one call from the generator, consumed in a fixed order."""

    def __init__(self, g: torch.Generator, n: int = _DRAWS):
        self.values = torch.rand(n, generator=g, dtype=torch.float64).tolist()
        self.i = 0

    @classmethod
    def of(cls, values: list) -> "_Draws":
        """Draws already made (`SeededViews.draws`)."""
        d = cls.__new__(cls)
        d.values, d.i = values, 0
        return d

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
    """Bilinear resize of a C×H×W (or N×C×H×W) float tensor to size×size (antialiased when shrinking)."""
    if img.shape[-2:] == (size, size):
        return img
    shrink = img.shape[-1] > size or img.shape[-2] > size
    batch = img if img.dim() == 4 else img[None]
    out = F.interpolate(batch, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink)
    return out if img.dim() == 4 else out[0]


# F.interpolate's own CPU kernels for a 4-D bilinear resize to a given size (no scale factors), called without
# its Python argument handling, which costs half as much as the kernel on a 16 px crop: the same call, the same
# bits. None where a torch build lacks them (then `resize`).
_BILINEAR = getattr(torch._C._nn, "upsample_bilinear2d", None)
_BILINEAR_AA = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None)


def _resized(crops: np.ndarray, size: int) -> np.ndarray:
    """`resize` of N×C×h×w float32 crops (a numpy array, or a view of one) to size×size, as a numpy array."""
    h, w = crops.shape[-2:]
    if (h, w) == (size, size):
        return crops
    kernel = _BILINEAR_AA if h > size or w > size else _BILINEAR
    if kernel is None:
        return resize(torch.from_numpy(crops), size).numpy()
    return kernel(torch.from_numpy(crops), (size, size), False, None).numpy()


def _floats(images: list) -> list:
    """`to_float` of each image as a numpy array (a numpy slice costs far less than a torch one), in one call
    for a batch of one shape and dtype (`to_float` is elementwise)."""
    if len({(img.shape, img.dtype) for img in images}) == 1:
        return list(to_float(torch.stack(images)).numpy())
    return [to_float(img).numpy() for img in images]


# A batch's views are made together. The crops are cut from one float conversion of the batch and resized in
# torch, those of one shape in one call (the kernel resizes each image on its own, so a stack changes no bit);
# the colour operations then run on the whole batch in numpy, each on the items whose draws chose it, with each
# item's factor as a float32 scalar. On the 8–32 px views of the CPU presets a call costs far more than its
# arithmetic, so this is several times faster than one image at a time (`make bench`). Every colour operation
# is elementwise and correctly rounded in float32, as torch's is, so a view is bitwise the one the same
# operations give in torch on one image (tests/augment_reference.py keeps that torch version, the tests'
# oracle); the contrast's mean and the blur's convolution stay in torch, whose summation order numpy does not
# share.
_F = np.float32
_ONE, _ZERO = _F(1.0), _F(0.0)
# For HSV sector 0..5, which of (v, q, p, t) gives the red, green and blue channel (torchvision's table).
_SECTOR = np.array([[0, 1, 2, 2, 3, 0], [3, 0, 0, 1, 2, 2], [2, 2, 3, 0, 0, 1]])
_SECTOR7 = _SECTOR[:, np.arange(7) % 6]  # indexed by floor(6h), 0..6: sector 6 is sector 0


def _per_item(values: np.ndarray) -> np.ndarray:
    """Per-item factors (float64, as drawn) as float32 scalars broadcast over an item's pixels."""
    return values.astype(np.float32)[:, None, None, None]


def _clip(x: np.ndarray) -> np.ndarray:
    np.maximum(x, _ZERO, out=x)
    return np.minimum(x, _ONE, out=x)


def gray(x: np.ndarray) -> np.ndarray:
    """N×3×H×W → N×1×H×W luma."""
    return (_F(_GRAY[0]) * x[:, 0] + _F(_GRAY[1]) * x[:, 1] + _F(_GRAY[2]) * x[:, 2])[:, None]


def _blend(a: np.ndarray, b, f: np.ndarray) -> np.ndarray:
    return _clip(_per_item(f) * a + _per_item(1.0 - f) * b)


def _contrast_mean(x: np.ndarray) -> np.ndarray:
    luma = torch.from_numpy(gray(x))
    # Per item, torch sums 16..32767 floats in one vectorized loop on any thread count: batching changes no bit.
    if 16 <= luma[0].numel() < 32768:
        return luma.mean(dim=(1, 2, 3)).numpy()[:, None, None, None]
    return np.array([luma[k].mean().item() for k in range(len(x))], np.float32)[:, None, None, None]


def _hue(x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Hue rotation of each N×3×H×W item by its `shift` (in turns) through HSV, as torchvision's adjust_hue."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    maxc = np.maximum(np.maximum(r, g), b)
    minc = np.minimum(np.minimum(r, g), b)
    eq = maxc == minc
    cr = maxc - minc
    den = maxc.copy()
    den[eq] = _ONE
    s = cr / den
    cr[eq] = _ONE
    rc, gc, bc = np.moveaxis((maxc[:, None] - x) / cr[:, None], 1, 0)
    # One sector formula per pixel (red's wins a tie, then green's). torchvision sums the three with the
    # others masked to ±0, whose sign the "+ 1" below erases.
    h = (_F(4.0) + gc) - rc
    np.copyto(h, (_F(2.0) + rc) - bc, where=maxc == g)
    np.copyto(h, bc - gc, where=maxc == r)
    h = _fmod1(h / _F(6.0) + _ONE)
    h = _fmod1(h + shift.astype(np.float32)[:, None, None] + _ONE)
    h6 = h * _F(6.0)
    i = np.floor(h6)
    f = h6 - i
    n = maxc.size
    cand = np.empty((4, n), np.float32)  # v, q, p, t
    cand[0] = maxc.reshape(-1)
    cand[1] = (_ONE - s * f).reshape(-1)
    cand[2] = (_ONE - s).reshape(-1)
    cand[3] = (_ONE - s * (_ONE - f)).reshape(-1)
    cand[1:] *= cand[0]
    _clip(cand[1:])
    # cand[_SECTOR[:, i % 6], pixel] as one flat `take` (a fancy index over two arrays costs 4× as much); i is
    # 0..6 (h6 may round up to 6.0), whose sector `_SECTOR7` gives without the modulo
    pick = _SECTOR7.take(i.reshape(-1).astype(np.intp), axis=1) * n
    pick += np.arange(n)
    out = cand.reshape(-1).take(pick).reshape(3, *maxc.shape)
    return np.ascontiguousarray(np.moveaxis(out, 0, 1))


def _fmod1(a: np.ndarray) -> np.ndarray:
    """np.fmod(a, 1) for float32 a, in place: a − floor(a), which equals it bit for bit where a > 0 (both are
    exact: the fraction is representable and, for a ≥ 1, Sterbenz's lemma makes the subtraction exact), at a
    tenth of the cost. `_hue`'s arguments are > 0 (h/6 + 1 ≥ 5/6, h + shift + 1 ≥ 1/2); fmod itself where one
    is not (fmod keeps the sign of a negative a, and of −0)."""
    if a.size and not a.min() > 0:
        return np.fmod(a, _ONE)
    return np.subtract(a, np.floor(a), out=a)


def gaussian_blur(img: torch.Tensor, sigma: float) -> torch.Tensor:
    size = img.shape[-1]
    k = blur_kernel(size)
    x = torch.arange(k, dtype=img.dtype) - (k - 1) / 2
    w = torch.exp(-(x**2) / (2 * sigma**2))
    w = w / w.sum()
    c = img.shape[0]
    pad = k // 2
    out = F.pad(img[None], (pad, pad, pad, pad), mode="reflect" if pad < size else "replicate")
    out = F.conv2d(out, w.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    out = F.conv2d(out, w.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)
    return out[0]


def view_draws(h: int, w: int, aug: ViewAug, d: _Draws) -> tuple[tuple | None, list]:
    """One view's crop box of an h×w image (None without a crop) and the 14 uniforms its colour draws come from
    (`colour_draws`), taken from `d` in the order every path takes them."""
    if aug.crop:
        box = crop_box(h, w, aug.crop_scale, aug.crop_ratio, d)
    else:
        box, d.i = None, d.i + 40
    # Every draw is taken whether or not its op applies, so that one op's probability never shifts the
    # randomness of the others.
    u = d.values[d.i:d.i + 14]
    d.i += 14
    return box, u


@dataclass(frozen=True)
class Colour:
    """Per item of a view: whether each op applies, its factors (float64, as drawn) and the jitter's ops in
    their order (`ops[k, position]`: 0 brightness, 1 contrast, 2 saturation, 3 hue, −1 none there)."""

    flip: np.ndarray
    gray: np.ndarray
    blur: np.ndarray
    solarize: np.ndarray
    sigma: np.ndarray
    factor: list
    ops: np.ndarray


def colour_draws(u: np.ndarray, aug: ViewAug, mono: np.ndarray) -> Colour:
    """The colour parameters of N items from their N×14 uniforms (`view_draws`); `mono` marks one-channel
    images, on which saturation and hue are no-ops."""
    jitter = u[:, 1] < aug.jitter_p
    factor = [lo + (hi - lo) * u[:, 6 + c] for c, (lo, hi) in enumerate((
        (1 - aug.brightness, 1 + aug.brightness), (1 - aug.contrast, 1 + aug.contrast),
        (1 - aug.saturation, 1 + aug.saturation), (-aug.hue, aug.hue)))]
    order = np.argsort(u[:, 10:14], axis=1, kind="stable")  # the jitter ops in a random order per item
    strength = np.array((aug.brightness, aug.contrast, aug.saturation, aug.hue))
    on = jitter[:, None] & (strength[order] > 0) & ~(mono[:, None] & (order >= 2))
    return Colour(flip=u[:, 0] < aug.flip_p, gray=u[:, 2] < aug.gray_p, blur=u[:, 3] < aug.blur_p,
                  solarize=u[:, 5] < aug.solarize_p,
                  sigma=aug.blur_sigma[0] + u[:, 4] * (aug.blur_sigma[1] - aug.blur_sigma[0]),
                  factor=factor, ops=np.where(on, order, -1))


def blur_kernel(size: int) -> int:
    """The blur's odd kernel width for a size×size view: about 10 % of it, at least 3."""
    return max(3, (int(0.1 * size) // 2) * 2 + 1)


def views(images: list, aug: ViewAug, size: int, draws: list) -> np.ndarray:
    """One augmented view of each image (uint8 or float C×H×W), each from its own `_Draws`, as an
    N×3×size×size float32 array in [0, 1]."""
    n = len(images)
    x = np.empty((n, 3, size, size), np.float32)
    mono = np.array([img.shape[0] == 1 for img in images], bool)  # a gray image: saturation and hue are no-ops
    rows = []  # per item: flip, jitter, gray, blur, blur σ, solarize, 4 jitter factors, 4 order keys
    crops = {}  # crops of one shape are resized together: item indices, crops
    for k, (img, d) in enumerate(zip(_floats(images), draws, strict=True)):
        box, row = view_draws(*img.shape[-2:], aug, d)
        rows.append(row)
        if box is not None:
            i, j, ch, cw = box
            img = img[:, i:i + ch, j:j + cw]
        ks, imgs = crops.setdefault(img.shape, ([], []))
        ks.append(k)
        imgs.append(img)
    for ks, imgs in crops.values():  # a gray image's one channel fills all three
        if len(ks) == 1:  # most crops have a size of their own: no copy, no fancy indexing
            x[ks[0]] = _resized(imgs[0][None], size)[0]
        else:
            x[ks] = _resized(np.stack(imgs), size)
    c = colour_draws(np.array(rows, np.float64).reshape(n, 14), aug, mono)
    flip, to_gray, blur, sol, sigma, factor = c.flip, c.gray, c.blur, c.solarize, c.sigma, c.factor
    x[flip] = x[flip][..., ::-1]
    for position in range(4):
        for op in range(4):
            sel = c.ops[:, position] == op
            if not sel.any():
                continue
            v, f = x[sel], factor[op][sel]
            if op == 0:
                x[sel] = _clip(v * _per_item(f))
            elif op == 1:
                x[sel] = _blend(v, _contrast_mean(v), f)
            elif op == 2:
                x[sel] = _blend(v, gray(v), f)
            else:
                x[sel] = _hue(v, f)
    if to_gray.any():
        x[to_gray] = gray(x[to_gray])
    for k in np.flatnonzero(blur):
        x[k] = gaussian_blur(torch.from_numpy(x[k]), float(sigma[k])).numpy()
    if sol.any():
        v = x[sol]
        x[sol] = np.where(v >= _F(0.5), _ONE - v, v)
    return x


def apply_view(img: torch.Tensor, aug: ViewAug, size: int, g: torch.Generator) -> torch.Tensor:
    """One augmented view (float, [0, 1], 3×size×size) of a uint8 or float C×H×W image."""
    return torch.from_numpy(views([img], aug, size, [_Draws(g)])[0])


def normalized_views(images: list, aug: ViewAug, size: int, draws: list, mean: tuple, std: tuple) -> torch.Tensor:
    """`views`, normalized with the data set's mean and std: N×3×size×size."""
    return normalize(torch.from_numpy(views(images, aug, size, draws)), mean, std)


def normalize(x: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s
