"""The generated shapes (emarule/vision/shapes.py): glyphs, determinism, balance, layout, cache, build time."""

import errno
import hashlib
import math
import time

import numpy as np
import pytest
import torch

from emarule.errors import UserError
from emarule.vision import shapes as S
from emarule.vision.data import load_sources


@pytest.fixture(scope="module")
def two_blocks():
    return S.generate(S.ShapesRequest(2 * S.BLOCK, 0))


def _glyph(name: str, angle: float, mirror: bool = False, n: int = 64) -> torch.Tensor:
    """The glyph's coverage (stroke 0.28) on an n×n grid over [-1, 1]², rotated by `angle`, mirrored in x first."""
    t = (torch.arange(n, dtype=torch.float32) + 0.5) / n * 2 - 1
    v, u = torch.meshgrid(t, t, indexing="ij")
    u = -u if mirror else u
    co, si = math.cos(angle), math.sin(angle)
    return S._distance(name, co * u + si * v, co * v - si * u) <= 0.14


@pytest.mark.parametrize("name", sorted(S.SEGMENTS))
def test_a_mirrored_glyph_is_the_same_glyph_rotated(name):
    # The views are flipped horizontally: a glyph whose mirror image were no rotation of itself would
    # turn into another class.
    mirrored = _glyph(name, 0.0, mirror=True)
    best = min((mirrored ^ _glyph(name, 2 * math.pi * k / 360)).float().mean() for k in range(360))
    assert best < 0.01


def test_glyphs_differ_from_one_another_at_every_rotation():
    shapes = {name: _glyph(name, 0.0) for name in S.CLASSES}
    for a in S.CLASSES:
        for b in S.CLASSES:
            if a < b:
                closest = min((shapes[a] ^ _glyph(b, 2 * math.pi * k / 90)).float().mean() for k in range(90))
                assert closest > 0.04, (a, b)


def test_glyph_geometry():
    centre = torch.zeros(1)
    assert float(S._distance("ring", centre, centre)) == pytest.approx(S.RING)  # a hole in the middle
    assert float(S._distance("plus", centre, centre)) == 0.0  # the bars cross there
    for name in S.SEGMENTS:  # every glyph fits the unit disk, so that it stays inside its cell
        t = torch.linspace(-1.3, 1.3, 131)
        v, u = torch.meshgrid(t, t, indexing="ij")
        inked = S._distance(name, u, v) <= 0.14
        assert inked.any() and float(torch.sqrt(u * u + v * v)[inked].max()) <= 1.0 + 0.14 + 0.03


def test_same_request_gives_the_same_bytes_and_another_seed_other_images():
    a = S.generate(S.ShapesRequest(300, 0, size=16))
    b = S.generate(S.ShapesRequest(300, 0, size=16))
    assert a[0].tobytes() == b[0].tobytes() and np.array_equal(a[1], b[1])
    other = S.generate(S.ShapesRequest(300, 0, size=16, seed=1))
    assert (other[0] != a[0]).mean() > 0.5
    test = S.generate(S.ShapesRequest(300, 1, size=16))  # the test split is not the training split
    assert (test[0] != a[0]).mean() > 0.5


def test_a_smaller_request_is_a_prefix_of_a_larger_one():
    small, large = S.generate(S.ShapesRequest(700, 0, size=16)), S.generate(S.ShapesRequest(S.BLOCK + 1, 0, size=16))
    assert np.array_equal(small[0], large[0][:700]) and np.array_equal(small[1], large[1][:700])
    assert len(large[1]) == S.BLOCK + 1


def test_layout_and_class_balance(two_blocks):
    x, y = two_blocks
    assert x.shape == (2 * S.BLOCK, 3, S.SIZE, S.SIZE) and x.dtype == np.uint8
    channels = torch.from_numpy(x).float().div(255).mean((2, 3))  # grey by default: the channels differ by noise
    assert (channels.max(1).values - channels.min(1).values).max() < 0.02
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(len(S.CLASSES)))
    assert np.bincount(y).tolist() == [2 * S.BLOCK // len(S.CLASSES)] * len(S.CLASSES)  # exactly balanced
    assert len(np.unique(y[:100])) == len(S.CLASSES)  # shuffled: a prefix holds every class
    assert x.min() == 0 or x.max() == 255  # the full range is used, not a washed-out band


def test_pixels_are_dominated_by_nuisances(two_blocks):
    # The class mean images differ far less than images within a class: position, colour and clutter
    # dominate pixel space (why a linear probe of raw pixels reads little).
    x, y = two_blocks
    f = torch.from_numpy(x).float().div(255).flatten(1)
    means = torch.stack([f[torch.from_numpy(y) == c].mean(0) for c in range(len(S.CLASSES))])
    between = means.var(0).sum()
    within = torch.stack([f[torch.from_numpy(y) == c].var(0).sum() for c in range(len(S.CLASSES))]).mean()
    assert between < 0.02 * within


def test_mean_and_std_constants_match_the_data(two_blocks):
    f = torch.from_numpy(two_blocks[0]).float().div(255)
    mean, std = f.mean((0, 2, 3)).tolist(), f.std((0, 2, 3)).tolist()
    assert np.allclose(mean, S.MEAN, atol=0.02) and np.allclose(std, S.STD, atol=0.02)


def test_generation_is_fast():
    # 5,000 images in under 5 s of CPU time on one thread (the 30,000 of the training split then in well
    # under a minute); CPU time, not wall time, so that other processes on a shared machine do not count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = time.process_time()
        S.generate(S.ShapesRequest(5 * S.BLOCK, 0))
        assert time.process_time() - t < 5.0
    finally:
        torch.set_num_threads(threads)


def test_cache_is_reused(tmp_path, monkeypatch):
    req = S.ShapesRequest(S.BLOCK, 1)
    x, y = S.load(req, tmp_path)
    monkeypatch.setattr(S, "generate", lambda r: pytest.fail("a valid cache was rebuilt"))
    x2, y2 = S.load(req, tmp_path)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert [p.name for p in tmp_path.iterdir()] == [req.key()]  # no build folder left behind


def test_a_corrupt_cache_is_detected_and_rebuilt(tmp_path, monkeypatch):
    req = S.ShapesRequest(S.BLOCK, 0)
    x, _ = S.load(req, tmp_path)
    images = tmp_path / req.key() / "images.npy"
    raw = bytearray(images.read_bytes())
    raw[-1] ^= 0xFF  # one pixel flipped: the file still loads, only its hash tells
    images.write_bytes(bytes(raw))
    calls = []
    real = S.generate
    monkeypatch.setattr(S, "generate", lambda r: calls.append(r) or real(r))
    x2, _ = S.load(req, tmp_path)
    assert calls == [req] and torch.equal(x, x2)
    (tmp_path / req.key() / "labels.npy").unlink()  # a missing file too
    assert torch.equal(S.load(req, tmp_path)[0], x) and len(calls) == 2


@pytest.mark.parametrize("request_", [S.ShapesRequest(0, 0), S.ShapesRequest(10, 2), S.ShapesRequest(10, 0, size=2),
                                      S.ShapesRequest(10, 0, grid=4, size=12), S.ShapesRequest(10, 0, colours="red"),
                                      S.ShapesRequest(10, 0, classes=("ring", "heart")),
                                      S.ShapesRequest(10, 0, classes=("ring", "ring"))])
def test_an_impossible_request_is_a_user_error_and_writes_nothing(tmp_path, request_):
    with pytest.raises(UserError, match="ask for at least 1 image"):
        S.ensure(request_, tmp_path / "shapes")
    assert not (tmp_path / "shapes").exists()


def test_unwritable_cache_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="EMARULE_CACHE"):
        S.ensure(S.ShapesRequest(10, 0), blocker / "shapes")


def test_source_caps_and_normalization(tmp_path, monkeypatch):
    monkeypatch.setenv("EMARULE_CACHE", str(tmp_path))
    train, test = load_sources("shapes", None, 16, 300, 200, 10)
    assert (len(train), len(test), train.num_classes, train.name) == (300, 200, len(S.CLASSES), "shapes")
    assert train.images.dtype == torch.uint8 and train.mean == S.MEAN
    view = test.eval_view(0, 16)
    assert view.shape == (3, 16, 16) and abs(float(view.mean())) < 1.5


@pytest.mark.parametrize("colours", S.COLOURS)
def test_every_glyph_stands_out_from_its_background(colours):
    # Each cell of a 2×2 grid has its own colours; the glyph's pixels differ from the background's in
    # every cell (grey and rgb: by at least MIN_CONTRAST in RGB; hue: in luminance).
    x, y = S.generate(S.ShapesRequest(200, 0, size=32, grid=2, colours=colours, noise=0.0))
    f = torch.from_numpy(x).float().div(255)
    cells = f.unfold(2, 16, 16).unfold(3, 16, 16).permute(0, 2, 3, 1, 4, 5).reshape(-1, 3, 256)
    lo, hi = cells.min(-1).values, cells.max(-1).values
    assert ((hi - lo).norm(dim=-1) > 0.25).all()
    if colours != "gray":
        assert (f[:, 0] != f[:, 1]).any()
    assert set(np.unique(y)) == set(range(len(S.CLASSES)))


def test_other_glyph_sets():
    x, y = S.generate(S.ShapesRequest(100, 0, size=16, classes=("square", "arc", "V")))
    assert x.shape == (100, 3, 16, 16) and set(np.unique(y)) == {0, 1, 2}


def test_the_grey_data_sets_bytes_and_cache_keys_are_those_of_every_run_so_far():
    # The presets' images and the folders already cached stay valid: only colours="rgb" changed (RGB_VERSION).
    x, y = S.generate(S.ShapesRequest(S.BLOCK, 0))
    assert hashlib.sha256(x.tobytes()).hexdigest()[:16] == "2058d8eb8b992a29"
    assert hashlib.sha256(y.tobytes()).hexdigest()[:16] == "88e70a2d1be77d96"
    x, _ = S.generate(S.ShapesRequest(200, 1, grid=2, colours="hue"))
    assert hashlib.sha256(x.tobytes()).hexdigest()[:16] == "32bfe76a1cf37b39"
    keys = [S.ShapesRequest(10000, 0), S.ShapesRequest(2000, 1), S.ShapesRequest(64, 0, colours="hue")]
    assert [r.key() for r in keys] == ["4a3ba34492104680", "4efb54231aebafbf", "d344b50d21ed5a56"]


def test_rgb_glyphs_keep_their_contrast_inside_the_cube():
    bg, fg = S._colours("rgb", 50000, 1, torch.Generator().manual_seed(0))
    assert ((fg >= 0) & (fg <= 1)).all()
    assert (fg - bg).norm(dim=-1).min() >= S.MIN_CONTRAST - 1e-6
    rgb = S.ShapesRequest(10, 0, colours="rgb")
    assert rgb.version == S.RGB_VERSION != S.VERSION == S.ShapesRequest(10, 0).version


def test_a_full_disk_while_building_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    with pytest.raises(UserError, match=r"cannot write in .*shapes \(no space left on the device\); free space") as e:
        S.ensure(S.ShapesRequest(10, 0), tmp_path / "shapes")
    assert "\n" not in str(e.value) and list((tmp_path / "shapes").iterdir()) == []
