"""The views' colour operations as torch computes them on one image at a time: the oracle that the batched
numpy implementation (`emarule.vision.augment.views`) must match bitwise (tests/vision/test_augment.py),
and the baseline of its benchmark (benchmarks/augment_speed.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from emarule.vision import augment as A


def gray(img):
    return (A._GRAY[0] * img[0] + A._GRAY[1] * img[1] + A._GRAY[2] * img[2])[None]


def _blend(a, b, f):
    return (f * a + (1.0 - f) * b).clamp_(0.0, 1.0)


def hue(img, shift):
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
    rows = (torch.stack((v, q, p, p, t, v)), torch.stack((t, v, v, q, p, p)), torch.stack((p, p, t, v, v, q)))
    return torch.stack([(mask * a).sum(0) for a in rows])


def _blur(img, sigma):
    size = img.shape[-1]
    k = max(3, (int(0.1 * size) // 2) * 2 + 1)
    x = torch.arange(k, dtype=img.dtype) - (k - 1) / 2
    w = torch.exp(-(x**2) / (2 * sigma**2))
    w = w / w.sum()
    c, pad = img.shape[0], k // 2
    out = F.pad(img[None], (pad, pad, pad, pad), mode="reflect" if pad < size else "replicate")
    out = F.conv2d(out, w.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    return F.conv2d(out, w.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)[0]


def reference_view(img, aug, size, g, applied=None, draws=None, drawn=None):
    """apply_view with every operation in torch (the implementation before the numpy one); the names of
    the operations it applied are added to `applied`. `draws`: the `_Draws` to take from instead of a new
    one on `g`, so that a caller can see where they end. `drawn`: a dict that receives every value drawn
    (the crop box, the uniforms behind the switches, the factors, σ and the jitter's order)."""
    applied = set() if applied is None else applied
    drawn = {} if drawn is None else drawn
    d = A._Draws(g) if draws is None else draws
    if aug.crop:
        h, w = img.shape[-2:]
        i, j, ch, cw = A.crop_box(h, w, aug.crop_scale, aug.crop_ratio, d)
        drawn["box"] = (i, j, ch, cw)
        img = img[:, i:i + ch, j:j + cw]
    else:
        d.i += 40
    x = A.resize(A.to_float(img), size)
    mono = img.shape[0] == 1
    if mono:
        x = x.expand(3, -1, -1)
    x = x.contiguous()
    flip, jit, g_p, bl, bl_s, sol = d.u(), d.u(), d.u(), d.u(), d.u(), d.u()
    fb = d.u(1 - aug.brightness, 1 + aug.brightness)
    fc = d.u(1 - aug.contrast, 1 + aug.contrast)
    fs = d.u(1 - aug.saturation, 1 + aug.saturation)
    fh = d.u(-aug.hue, aug.hue)
    order = sorted(range(4), key=lambda _: d.u())
    sigma = aug.blur_sigma[0] + bl_s * (aug.blur_sigma[1] - aug.blur_sigma[0])
    drawn.update(flip=flip < aug.flip_p, jitter=jit < aug.jitter_p, gray=g_p < aug.gray_p, blur=bl < aug.blur_p,
                 solarize=sol < aug.solarize_p, sigma=sigma, brightness=fb, contrast=fc, saturation=fs, hue=fh,
                 order=tuple(order))
    if flip < aug.flip_p:
        x = x.flip(-1)
        applied.add("flip")
    if jit < aug.jitter_p:
        for op in order:
            if op == 0 and aug.brightness > 0:
                x = (x * fb).clamp_(0.0, 1.0)
                applied.add("brightness")
            elif op == 1 and aug.contrast > 0:
                x = _blend(x, gray(x).mean(), fc)
                applied.add("contrast")
            elif op == 2 and aug.saturation > 0 and not mono:
                x = _blend(x, gray(x), fs)
                applied.add("saturation")
            elif op == 3 and aug.hue > 0 and not mono:
                x = hue(x, fh)
                applied.add("hue")
    if g_p < aug.gray_p:
        x = gray(x).expand(3, -1, -1).contiguous()
        applied.add("gray")
    if bl < aug.blur_p:
        x = _blur(x, sigma)
        applied.add("blur")
    if sol < aug.solarize_p:
        x = torch.where(x >= 0.5, 1.0 - x, x)
        applied.add("solarize")
    return x
