"""Generated shapes: an image set whose class is a glyph's structure, hidden under nuisances.

`data.source: shapes` for the self-supervised tasks. On scikit-learn's digits a linear probe of the raw
pixels reads more than one of any trained teacher (the pixels already separate the classes), so the
probe cannot see what BYOL or DINO learned. Here the class is which glyph is drawn, and the rest is
nuisance of the kinds BYOL's and DINO's augmentations are built to remove (crops: position and scale;
colour jitter: brightness and contrast); docs/data.md has what a probe reads on it:

- five glyphs (`CLASSES`, chosen from `SEGMENTS`), all drawn with one stroke, so that they share their
  local parts (stroke ends, lines, curves) and differ in how the parts are put together;
- each at a random size, position and rotation (a full turn: every glyph is mirror-symmetric, so a
  horizontal flip never changes the class);
- a random background and glyph grey level, at least `MIN_CONTRAST` apart (or colours: `colours`);
- pixel noise.

Images are N×3×S×S uint8 (S = 32 by default), labels balanced over the classes in every block of `BLOCK`
images (exactly, when N is a multiple of it). Generation is vectorised torch, in those blocks, each
drawn from its own generator seeded by (seed, split, block): the first n images do not depend on how
many are asked for, and a small subset costs only its own blocks.

Cached like the speech corpus: `<cache>/shapes/<key>/` with `images.npy`, `labels.npy` and
`manifest.json` (the request and both files' SHA-256) written last, built in a temporary folder that
is moved into place whole. A folder whose files do not match their manifest is rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from emarule.engine.cache import build_once, manifest_holds, sha256
from emarule.errors import UserError
from emarule.engine.seeding import mix

VERSION = 2  # bump when the generator's output changes: a new cache key
# colours="rgb" alone since its contrast push stays in the RGB cube (version 2 clamped the pushed glyph,
# which left 3 % of glyphs closer than MIN_CONTRAST); grey and hue images are version 2's, byte for byte
RGB_VERSION = 3
CLASSES = ("I", "Y", "plus", "triangle", "ring")
TRAIN, TEST = 30000, 5000  # images per split when the preset caps neither
SIZE = 32
BLOCK = 1000
SUPERSAMPLE = 2  # a glyph's coverage is the mean over SUPERSAMPLE² points per pixel (antialiased strokes)
MIN_CONTRAST = 0.4  # least RGB distance between the glyphs' colour and the background's (grey, rgb)
COLOURS = ("gray", "rgb", "hue")
SEED = 0  # the data set's seed: every run seed sees the same images
# Normalization: `stats()` on the training split measures mean 0.500 and std 0.280 in every channel; the
# std used (0.27, from an earlier float32 estimate) is the one docs/data.md's runs were made with.
MEAN, STD = (0.50, 0.50, 0.50), (0.27, 0.27, 0.27)


@dataclass(frozen=True)
class ShapesRequest:
    """What to draw; every field is part of the cache key. The nuisance knobs default to the data set's."""

    n: int
    split: int  # 0 train, 1 test
    size: int = SIZE
    seed: int = SEED
    grid: int = 1  # glyphs per image: grid × grid cells, one glyph of the image's class in each
    fill: tuple = (0.6, 0.95)  # a glyph's radius, as a fraction of half its cell (drawn per image)
    stroke: tuple = (0.28, 0.28)  # stroke width, as a fraction of the glyph's radius (drawn per image)
    noise: float = 0.03  # pixel noise (std, on [0, 1])
    classes: tuple = CLASSES  # names from SEGMENTS
    # Each cell's background and glyph colours: "gray" (two grey levels), "rgb" (uniform in the RGB cube),
    # "hue" (luminances 0.3-0.6 apart, each with a random hue).
    colours: str = "gray"

    @property
    def version(self) -> int:
        return RGB_VERSION if self.colours == "rgb" else VERSION

    def key(self) -> str:
        blob = json.dumps({"version": self.version, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache() -> Path:
    return Path(os.environ.get("EMARULE_CACHE", Path.home() / ".cache" / "emarule")) / "shapes"


# --- drawing -------------------------------------------------------------------------------------


def _path(points, closed=False):
    n = len(points)
    return [(points[i], points[(i + 1) % n]) for i in range(n if closed else n - 1)]


def _spokes(k, r):
    return [(r * math.cos(math.pi / 2 + 2 * math.pi * i / k), r * math.sin(math.pi / 2 + 2 * math.pi * i / k))
            for i in range(k)]


def _unit(segments):
    """The segments scaled so that the farthest end point lies on the unit circle."""
    m = max(math.hypot(*p) for seg in segments for p in seg)
    return tuple(tuple((x / m, y / m) for x, y in seg) for seg in segments)


# Every glyph is drawn with the same stroke, so glyphs share their local parts (stroke width, ends,
# corners, junctions) and differ in how they are put together. Each is symmetric under some mirror,
# so with a free rotation a horizontal flip never changes the class.
SEGMENTS = {
    "I": _unit([((0, -1), (0, 1))]),
    "L": _unit(_path([(-0.5, 0.7), (-0.5, -0.5), (0.7, -0.5)])),
    "T": _unit([((-0.8, 0.6), (0.8, 0.6)), ((0, 0.6), (0, -0.9))]),
    "plus": _unit([((-0.8, 0), (0.8, 0)), ((0, -0.8), (0, 0.8))]),
    "Y": _unit([((0, 0), p) for p in _spokes(3, 0.9)]),
    "equals": _unit([((-0.7, -0.4), (0.7, -0.4)), ((-0.7, 0.4), (0.7, 0.4))]),
    "U": _unit(_path([(-0.6, 0.7), (-0.6, -0.6), (0.6, -0.6), (0.6, 0.7)])),
    "square": _unit(_path([(-0.6, -0.6), (0.6, -0.6), (0.6, 0.6), (-0.6, 0.6)], closed=True)),
    "triangle": _unit(_path(_spokes(3, 0.9), closed=True)),
    "ring": None,  # the circle of radius RING
    "arc": None,  # three quarters of that circle
    "V": _unit(_path([(-0.5, 0.8), (0, -0.8), (0.5, 0.8)])),
    "star": _unit([((0, 0), p) for p in _spokes(5, 0.9)]),
    "asterisk": _unit([((0, 0), p) for p in _spokes(6, 0.9)]),
}
RING = 0.8


def _distance(name: str, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Distance from each point (u, v) of the glyph's own frame (it fits the unit disk) to its strokes' centre line."""
    if name == "ring":
        return (torch.sqrt(u * u + v * v) - RING).abs()
    if name == "arc":
        on = (torch.sqrt(u * u + v * v) - RING).abs()
        ends = torch.minimum((u - RING) ** 2 + v * v, u * u + (v - RING) ** 2).sqrt()
        return torch.where((u > 0) & (v > 0), ends, on)
    best = None
    for (ax, ay), (bx, by) in SEGMENTS[name]:
        dx, dy = bx - ax, by - ay
        t = (((u - ax) * dx + (v - ay) * dy) / (dx * dx + dy * dy)).clamp(0, 1)
        d = (u - ax - t * dx) ** 2 + (v - ay - t * dy) ** 2
        best = d if best is None else torch.minimum(best, d)
    return best.sqrt()


LUMA = torch.tensor((0.299, 0.587, 0.114))


def _chroma(lum: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Colours (…×3) of the given luminances, each with a random hue at 50–100 % of the largest saturation that fits."""
    c = torch.rand(*lum.shape, 3, generator=g) - 0.5
    # Elementwise, not a matrix product: on an AVX-512 Xeon the BLAS rounds `c @ LUMA` otherwise than the EPYCs
    # that recorded version 2's bytes did; single IEEE operations round alike on every CPU.
    c = c - (c[..., 0] * LUMA[0] + c[..., 1] * LUMA[1] + c[..., 2] * LUMA[2])[..., None]  # a pure chroma direction
    l3 = lum[..., None]
    room = torch.where(c > 0, (1 - l3) / c.clamp_min(1e-6), l3 / (-c).clamp_min(1e-6)).amin(-1)
    return (l3 + (0.5 + 0.5 * torch.rand(lum.shape, generator=g))[..., None] * room[..., None] * c).clamp(0, 1)


def _colours(kind: str, n: int, cells: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Background and glyph colours (n×cells×3 each) of one block."""
    if kind == "hue":
        lb = torch.rand(n, cells, generator=g)
        gap = (0.3 + 0.3 * torch.rand(n, cells, generator=g)) * torch.where(lb > 0.5, -1.0, 1.0)
        return _chroma(lb, g), _chroma(lb + gap, g)
    bg, fg = torch.rand(n, cells, 3, generator=g), torch.rand(n, cells, 3, generator=g)
    if kind == "gray":
        bg, fg = bg[..., :1].expand(-1, -1, 3), fg[..., :1].expand(-1, -1, 3)
    # A glyph too close to its background is pushed from it toward the farther of black and white, so that
    # it is always visible.
    far = bg.mean(-1, keepdim=True) > 0.5
    close = (fg - bg).norm(dim=-1, keepdim=True) < MIN_CONTRAST
    if kind == "gray":  # along the grey axis, which stays in the cube from a grey (the data set's bytes)
        return bg, torch.where(close, bg + torch.where(far, -1.0, 1.0) * (MIN_CONTRAST / math.sqrt(3)), fg).clamp(0, 1)
    # Straight at that corner, MIN_CONTRAST of the way: a point between two points of the cube is in it, and
    # the corner is at least √3 / 2 away (the mean of bg is on its side of 0.5).
    toward = torch.where(far, 0.0, 1.0) - bg
    pushed = bg + toward * (MIN_CONTRAST / toward.norm(dim=-1, keepdim=True))
    return bg, torch.where(close, pushed, fg).clamp(0, 1)


def draw_block(r: ShapesRequest, n: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (n×3×size×size uint8) and labels: block `block` of `r`'s split, a pure function of the arguments."""
    size, grid, ss = r.size, r.grid, SUPERSAMPLE
    g = torch.Generator().manual_seed(mix(r.seed, r.split, block, 0x5A9E))
    k = len(r.classes)
    labels = (torch.arange(n) + block * BLOCK) % k
    labels = labels[torch.randperm(n, generator=g)]
    cells = grid * grid
    cell = size / grid
    # Per image: one glyph size (each glyph ±15 % around it) and stroke width; per glyph: a position
    # inside its cell, a rotation, its background's and its own colour.
    radius = (cell / 2) * (r.fill[0] + (r.fill[1] - r.fill[0]) * torch.rand(n, 1, generator=g))
    radius = torch.clamp(radius * (0.85 + 0.3 * torch.rand(n, cells, generator=g)), max=0.98 * cell / 2)
    slack = cell / 2 - radius
    col, row = (torch.arange(cells) % grid).float(), (torch.arange(cells) // grid).float()
    cx = (col + 0.5) * cell + slack * (2 * torch.rand(n, cells, generator=g) - 1)
    cy = (row + 0.5) * cell + slack * (2 * torch.rand(n, cells, generator=g) - 1)
    rot = 2 * math.pi * torch.rand(n, cells, generator=g)
    half = (r.stroke[0] + (r.stroke[1] - r.stroke[0]) * torch.rand(n, 1, generator=g)) / 2
    bg, fg = _colours(r.colours, n, cells, g)
    # Every supersampled point, in the frame of the glyph of its cell.
    sub = (torch.arange(size * ss, dtype=torch.float32) + 0.5) / ss
    sy, sx = torch.meshgrid(sub, sub, indexing="ij")
    where = ((sy // cell).clamp(max=grid - 1) * grid + (sx // cell).clamp(max=grid - 1)).long().flatten()
    cover = torch.zeros(n, size * ss * size * ss)
    for c in range(k):
        idx = (labels == c).nonzero().flatten()
        if len(idx) == 0:
            continue
        rad = radius[idx][:, where]
        dx, dy = (sx.flatten() - cx[idx][:, where]) / rad, (sy.flatten() - cy[idx][:, where]) / rad
        co, si = torch.cos(rot[idx])[:, where], torch.sin(rot[idx])[:, where]
        cover[idx] = (_distance(r.classes[c], co * dx + si * dy, co * dy - si * dx) <= half[idx]).float()
    cover = torch.nn.functional.avg_pool2d(cover.view(n, 1, size * ss, size * ss), ss)
    pix = torch.arange(size) * grid // size
    at = (pix[:, None] * grid + pix[None, :]).flatten()
    bg, fg = (c[:, at].transpose(1, 2).reshape(n, 3, size, size) for c in (bg, fg))
    img = bg * (1 - cover) + fg * cover
    img = img + r.noise * torch.randn(img.shape, generator=g)
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


def _save(path: Path, array: np.ndarray) -> None:
    """`np.save`'s bytes, written by Python: a failed write then says why (errno), where numpy's own write
    says only "problem writing element"."""
    buf = io.BytesIO()
    np.save(buf, array)
    path.write_bytes(buf.getbuffer())


def _jsonable(request: ShapesRequest) -> dict:
    return json.loads(json.dumps(asdict(request)))


def _valid(root: Path, request: ShapesRequest) -> bool:
    """Whether `root` holds this request's images, byte for byte as its manifest recorded them."""
    return manifest_holds(root, _jsonable(request), request.version)


def ensure(request: ShapesRequest, cache: Path | None = None) -> Path:
    """The folder holding `request`'s images, built on first use and checked against its manifest on every use."""
    bad = [c for c in request.classes if c not in SEGMENTS]
    if (request.n < 1 or request.grid < 1 or request.size < 4 * request.grid or request.split not in (0, 1)
            or request.colours not in COLOURS or bad or len(set(request.classes)) < 2):
        raise UserError(f"generated shapes: {request.n} images of {request.size} px in split {request.split}, "
                        f"{request.grid}×{request.grid} glyphs, colours {request.colours!r}, classes "
                        f"{list(request.classes)}; ask for at least 1 image of at least 4 px per glyph, in split 0 "
                        f"(train) or 1 (test), colours one of {', '.join(COLOURS)}, and two or more distinct "
                        f"classes from {', '.join(SEGMENTS)}")
    cache = Path(cache) if cache is not None else default_cache()

    def build(tmp: Path) -> None:
        x, y = generate(request)
        for name, array in (("images.npy", x), ("labels.npy", y)):
            _save(tmp / name, array)
        files = {name: sha256(tmp / name) for name in ("images.npy", "labels.npy")}
        (tmp / "manifest.json").write_text(json.dumps({"request": _jsonable(request), "version": request.version,
                                                       "files": files}, indent=1, sort_keys=True))

    return build_once(cache / request.key(), build, lambda root: _valid(root, request),
                      "generated shapes: cannot write in {cache} ({reason}); set EMARULE_CACHE to a writable folder",
                      "generated shapes: cannot write in {cache} ({reason}); free space (or raise the limit), or set "
                      "EMARULE_CACHE to a folder with room")


def load(request: ShapesRequest, cache: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    root = ensure(request, cache)
    return torch.from_numpy(np.load(root / "images.npy")), torch.from_numpy(np.load(root / "labels.npy"))


def stats(n: int = TRAIN) -> tuple[tuple, tuple]:
    """Per-channel mean and std of the first n training images (how MEAN and STD were measured)."""
    x, _ = generate(ShapesRequest(n, 0))
    f = torch.from_numpy(x).float().div_(255.0)
    return tuple(f.mean((0, 2, 3)).tolist()), tuple(f.std((0, 2, 3)).tolist())
