"""Generated shapes: an image set whose class is a shape's structure, hidden under nuisances.

`data.source: shapes` for the self-supervised tasks. On scikit-learn's digits a linear probe of a teacher
at initialization reads as much as a trained one (the pixels already separate the classes), so the
probe cannot see what BYOL or DINO learned. Here the class is only the outline of one shape, and
what dominates the pixels is nuisance, mostly of the kinds BYOL's and DINO's augmentations are built to
remove (crops: position and scale; colour jitter and grayscale: colours); docs/data.md has what a
probe reads on it:

- ten shapes (`CLASSES`), each drawn at a random position, size and rotation;
- the shape's colour and the background's drawn independently (kept at least `MIN_CONTRAST` apart),
  the background shaded by a random low-frequency wave and pixel noise;
- distractor strokes of random colours under the shape, and one over it.

Images are N×3×S×S uint8 (S = 32 by default), labels balanced over the ten classes. Generation is
vectorised torch, in blocks of `BLOCK` images, each block drawn from its own generator seeded by
(seed, split, block): the first n images do not depend on how many are asked for, and a small subset
costs only its own blocks.

Cached like the speech corpus: `<cache>/shapes/<key>/` with `images.npy`, `labels.npy` and
`manifest.json` (the request and both files' SHA-256) written last, built in a temporary folder that
is moved into place whole. A folder whose files do not match their manifest is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from emarule.errors import UserError
from emarule.engine.seeding import mix

VERSION = 1  # bump when the generator's output changes: a new cache key
CLASSES = ("disk", "ring", "square", "frame", "triangle", "cross", "L", "T", "bars", "star")
TRAIN, TEST = 30000, 5000  # images per split when the preset caps neither
SIZE = 32
BLOCK = 1000
SUPERSAMPLE = 2  # shape coverage is the mean over SUPERSAMPLE² points per pixel (antialiased edges)
MIN_CONTRAST = 0.35  # least RGB distance between the shape's colour and the background's mean
SEED = 0  # the data set's seed: every run seed sees the same images
# Normalization: the training split's per-channel mean is 0.500–0.502 and its std 0.295–0.296
# (`stats()`, 30,000 images); these rounded values are the ones docs/data.md's runs were made with.
MEAN, STD = (0.49, 0.49, 0.49), (0.29, 0.29, 0.29)


@dataclass(frozen=True)
class ShapesRequest:
    """What to draw; every field is part of the cache key. The nuisance knobs default to the data set's."""

    n: int
    split: int  # 0 train, 1 test
    size: int = SIZE
    seed: int = SEED
    radius: tuple = (0.2, 0.36)  # the shape's circumscribed radius, as a fraction of the image
    rotation: float = math.pi  # rotations are drawn from ±rotation (radians)
    strokes_under: int = 3  # distractor strokes drawn before the shape
    strokes_over: int = 1  # and after it
    wave: float = 1.0  # amplitude of the background's shading wave (× 0.1–0.3)

    def key(self) -> str:
        blob = json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache() -> Path:
    return Path(os.environ.get("EMARULE_CACHE", Path.home() / ".cache" / "emarule")) / "shapes"


# --- drawing -------------------------------------------------------------------------------------


def _coverage(cls: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Whether each point (u, v) of the shape's own frame (the shape fits the unit disk) is inside it."""
    au, av = u.abs(), v.abs()
    rho = torch.sqrt(u * u + v * v)
    name = CLASSES[cls]
    if name == "disk":
        return rho <= 0.85
    if name == "ring":
        return (rho <= 0.95) & (rho >= 0.55)
    if name == "square":
        return torch.maximum(au, av) <= 0.68
    if name == "frame":
        m = torch.maximum(au, av)
        return (m <= 0.72) & (m >= 0.4)
    if name == "triangle":  # equilateral, inscribed in the unit circle: three half-planes
        inside = torch.ones_like(u, dtype=torch.bool)
        for a in (math.pi / 2, math.pi * 7 / 6, math.pi * 11 / 6):
            inside &= (u * math.cos(a + math.pi) + v * math.sin(a + math.pi)) <= 0.5
        return inside
    if name == "cross":
        return ((au <= 0.25) & (av <= 0.9)) | ((av <= 0.25) & (au <= 0.9))
    if name == "L":
        return ((u >= -0.7) & (u <= -0.2) & (av <= 0.8)) | ((au <= 0.7) & (v >= -0.8) & (v <= -0.3))
    if name == "T":
        return ((au <= 0.85) & (v >= 0.35) & (v <= 0.85)) | ((au <= 0.25) & (av <= 0.85))
    if name == "bars":
        return (au >= 0.25) & (au <= 0.7) & (av <= 0.85)
    if name == "star":  # five points
        phi = torch.atan2(v, u)
        return rho <= 0.42 + 0.5 * torch.cos(5 * phi).clamp_min(0) ** 2
    raise ValueError(cls)


def _segments(px, py, a, b, width):
    """Antialiased coverage of segments a→b (n×2 each) of the given widths on the pixel grid (n×S×S)."""
    ax, ay = a[:, 0, None, None], a[:, 1, None, None]
    dx, dy = (b[:, 0] - a[:, 0])[:, None, None], (b[:, 1] - a[:, 1])[:, None, None]
    t = (((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy).clamp_min(1e-6)).clamp(0, 1)
    d = torch.sqrt((px - ax - t * dx) ** 2 + (py - ay - t * dy) ** 2)
    return (width[:, None, None] / 2 + 0.5 - d).clamp(0, 1)


def _colours(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.rand(n, 3, generator=g)


def draw_block(r: ShapesRequest, n: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (n×3×size×size uint8) and labels: block `block` of `r`'s split, a pure function of the arguments."""
    size = r.size
    g = torch.Generator().manual_seed(mix(r.seed, r.split, block, 0x5A9E))
    k = len(CLASSES)
    labels = (torch.arange(n) + block * BLOCK) % k
    labels = labels[torch.randperm(n, generator=g)]
    s = float(size)
    # Background: a colour, shaded by a random plane wave (1-3 cycles per image), plus pixel noise.
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32) + 0.5,
                            torch.arange(size, dtype=torch.float32) + 0.5, indexing="ij")
    bg = _colours(n, g)
    freq = (1.0 + 2.0 * torch.rand(n, generator=g)) * 2 * math.pi / s
    ang = 2 * math.pi * torch.rand(n, generator=g)
    phase = 2 * math.pi * torch.rand(n, generator=g)
    amp = r.wave * (0.1 + 0.2 * torch.rand(n, generator=g))
    wave = torch.sin(freq[:, None, None] * (xx * torch.cos(ang)[:, None, None] + yy * torch.sin(ang)[:, None, None])
                     + phase[:, None, None])
    img = bg[:, :, None, None] + (amp[:, None, None] * wave)[:, None]

    def stroke():
        nonlocal img
        a = torch.rand(n, 2, generator=g) * s
        length = s * (0.3 + 0.5 * torch.rand(n, generator=g))
        theta = 2 * math.pi * torch.rand(n, generator=g)
        b = a + length[:, None] * torch.stack((torch.cos(theta), torch.sin(theta)), 1)
        width = 1.0 + 1.0 * torch.rand(n, generator=g)
        colour = _colours(n, g)
        cov = _segments(xx, yy, a, b, width)[:, None]
        img = img * (1 - cov) + colour[:, :, None, None] * cov

    for _ in range(r.strokes_under):
        stroke()
    # The shape: centre, radius (its unit disk in pixels), rotation, colour.
    radius = s * (r.radius[0] + (r.radius[1] - r.radius[0]) * torch.rand(n, generator=g))
    centre = radius[:, None] + (s - 2 * radius[:, None]) * torch.rand(n, 2, generator=g)
    rot = r.rotation * (2 * torch.rand(n, generator=g) - 1)
    fg = _colours(n, g)
    # A shape too close in colour to the background is pushed from it along the grey axis (toward the
    # farther of black and white), so that the shape is always visible.
    toward = torch.where(bg.mean(1, keepdim=True) > 0.5, -1.0, 1.0)
    close = (fg - bg).norm(dim=1, keepdim=True) < MIN_CONTRAST
    fg = torch.where(close, bg + toward * (MIN_CONTRAST / math.sqrt(3)), fg).clamp(0, 1)
    sub = (torch.arange(size * SUPERSAMPLE, dtype=torch.float32) + 0.5) / SUPERSAMPLE
    sy, sx = torch.meshgrid(sub, sub, indexing="ij")
    cover = torch.zeros(n, size, size)
    for c in range(k):
        idx = (labels == c).nonzero().flatten()
        if len(idx) == 0:
            continue
        dx = (sx - centre[idx, 0, None, None]) / radius[idx, None, None]
        dy = (sy - centre[idx, 1, None, None]) / radius[idx, None, None]
        co, si = torch.cos(rot[idx])[:, None, None], torch.sin(rot[idx])[:, None, None]
        inside = _coverage(c, co * dx + si * dy, -si * dx + co * dy).float()
        cover[idx] = torch.nn.functional.avg_pool2d(inside[:, None], SUPERSAMPLE)[:, 0]
    img = img * (1 - cover[:, None]) + fg[:, :, None, None] * cover[:, None]
    for _ in range(r.strokes_over):
        stroke()
    img = img + 0.03 * torch.randn(img.shape, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), labels


def generate(request: ShapesRequest) -> tuple[np.ndarray, np.ndarray]:
    """All n images of the request (n×3×S×S uint8) and their int64 labels, block after block."""
    xs, ys = [], []
    for block in range(math.ceil(request.n / BLOCK)):
        x, y = draw_block(request, BLOCK, block)
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs)[:request.n], torch.cat(ys)[:request.n]
    return x.numpy(), y.numpy().astype(np.int64)


# --- cache ---------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _jsonable(request: ShapesRequest) -> dict:
    return json.loads(json.dumps(asdict(request)))


def _valid(root: Path, request: ShapesRequest) -> bool:
    """Whether `root` holds this request's images, byte for byte as its manifest recorded them."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        return (manifest.get("request") == _jsonable(request) and manifest.get("version") == VERSION
                and all(_sha256(root / name) == digest for name, digest in manifest["files"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure(request: ShapesRequest, cache: Path | None = None) -> Path:
    """The folder holding `request`'s images, built on first use and checked against its manifest on every use."""
    if request.n < 1 or request.size < 4 or request.split not in (0, 1):
        raise UserError(f"generated shapes: {request.n} images of {request.size} px in split {request.split}; "
                        f"ask for at least 1 image of at least 4 px, in split 0 (train) or 1 (test)")
    cache = Path(cache) if cache is not None else default_cache()
    root = cache / request.key()
    if _valid(root, request):
        return root
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    except OSError as e:
        raise UserError(f"generated shapes: cannot write in {cache} ({e.strerror}); set EMARULE_CACHE to a "
                        f"writable folder") from None
    try:
        x, y = generate(request)
        np.save(tmp / "images.npy", x)
        np.save(tmp / "labels.npy", y)
        files = {name: _sha256(tmp / name) for name in ("images.npy", "labels.npy")}
        (tmp / "manifest.json").write_text(json.dumps({"request": _jsonable(request), "version": VERSION,
                                                       "files": files}, indent=1, sort_keys=True))
        if root.exists():  # a corrupt or stale folder: moved aside, then removed
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=cache))
            try:
                root.rename(stale / "old")
            except OSError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(root)
        except OSError:
            if not _valid(root, request):  # not another builder's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def load(request: ShapesRequest, cache: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    root = ensure(request, cache)
    return torch.from_numpy(np.load(root / "images.npy")), torch.from_numpy(np.load(root / "labels.npy"))


def stats(n: int = TRAIN) -> tuple[tuple, tuple]:
    """Per-channel mean and std of the first n training images (how MEAN and STD were measured)."""
    x, _ = generate(ShapesRequest(n, 0))
    f = torch.from_numpy(x).float().div_(255.0)
    return tuple(f.mean((0, 2, 3)).tolist()), tuple(f.std((0, 2, 3)).tolist())
