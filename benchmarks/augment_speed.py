"""The self-supervised training sets' items: made a batch at a time (what the loop does) against one image at a
time in torch (the oracle the batch matches bitwise, tests/augment_reference.py).

For byol-vit's and dino-vit's `cpu` training sets (the generated shapes at 16 px; BYOL's two views, DINO's
two global crops), each round makes the same `--items` items both ways, taking turns, on one torch thread:

  batched   the data set's `__getitems__` on micro-batches of `--batch` indices (as the DataLoader asks)
  torch     `reference_view` per view and image, then the same normalization

Prints items/s of each (median over rounds) and torch/batched wall time as the median and the minimum of the
per-round ratios (above 1.00x: the batch is faster).

Then the loader of the full-size recipes at 224 px (`loader`), on a generated ImageNet folder of 500×375
JPEGs: what a DataLoader worker spends per sample on byol-vit's two views, dino-vit's 2 + 8 crops and
polyak-r50's one view, taking turns:

  cpu       `data.augment_on: cpu`: the worker decodes and makes the whole normalized float32 views
  device    `data.augment_on: device`: the worker decodes, crops and resizes, and hands over uint8 crops and
            their parameters (emarule/vision/device_views.py); the rest is the training device's

Each is this process's CPU time (`time.process_time`, one torch thread: core-seconds, which other processes
on the machine do not add to) of `__getitems__` and the collation on micro-batches of `--batch`. Prints ms of
CPU per sample of each (median over rounds), the JPEG decoding alone, and cpu/device as the median and the
minimum of the per-round ratios; and the device's half run on this CPU (what it would cost a worker instead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from augment_reference import reference_view  # noqa: E402
from emarule.vision import augment as A  # noqa: E402
from emarule.vision.data import TwoViewSet, load_sources  # noqa: E402
from emarule.vision.multicrop import MultiCropSet  # noqa: E402


def training_sets(n: int) -> dict:
    """The cpu presets' training sets (emarule/experiments/byol-vit.yaml, dino-vit.yaml), on their first n images."""
    source, _ = load_sources("shapes", None, 16, n, 16, 5)
    return {"byol-vit": TwoViewSet(source, "byol_cifar10", 16, seed=0),
            "dino-vit": MultiCropSet(source, "dino_digits", 16, 8, 0, 2, 0, (0.8, 1.0))}


def augs(ds) -> list:
    return [ds.aug1, ds.aug2] if isinstance(ds, TwoViewSet) else list(ds.global_augs)


def batched(ds, items: int, batch: int) -> None:
    for start in range(0, items, batch):
        ds.__getitems__(list(range(start, min(start + batch, items))))


def one_at_a_time(ds, items: int, size: int = 16) -> None:
    for i in range(items):
        g = ds.generator(i)
        img = ds.source.image(i)
        [A.normalize(reference_view(img, aug, size, g), ds.source.mean, ds.source.std) for aug in augs(ds)]


def write_jpegs(root: Path, n: int) -> Path:
    """n 500×375 JPEGs (ImageNet's most common size) in an ImageNet layout: smooth colour fields with fine
    grain, so that decoding costs what a photograph's does."""
    import numpy as np
    from PIL import Image

    d = root / "train" / "n00000000"
    d.mkdir(parents=True)
    g = np.random.default_rng(0)
    for i in range(n):
        base = np.asarray(Image.fromarray(g.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((500, 375),
                                                                                                Image.BICUBIC))
        grain = g.integers(-12, 13, base.shape)
        Image.fromarray(np.clip(base + grain, 0, 255).astype(np.uint8)).save(d / f"{i}.JPEG", quality=90)
    return root


def loader_sets(src) -> dict:
    """name -> (the cpu path's training set, the device path's, the device's half): the full-size recipes'."""
    from emarule.vision import device_views as V
    from emarule.vision import supervised as S

    def half(kind):
        return V.DeviceHalf(kind, src.mean, src.std).stage

    return {"byol-vit (2 × 224)": (TwoViewSet(src, "byol", 224, 0), V.TwoViewCrops(src, "byol", 224, 0),
                                   half("two_views")),
            "dino-vit (2 × 224 + 8 × 96)": (MultiCropSet(src, "dino", 224, 96, 0),
                                            V.MultiCrops(src, "dino", 224, 96, 0), half("multi_crop")),
            "polyak-r50 (1 × 224)": (S.TrainViews(src, "imagenet", 224, 0), V.TrainCrops(src, "imagenet", 224, 0),
                                     half("supervised"))}


def cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def loader(items: int, batch: int, rounds: int) -> None:
    import tempfile

    from emarule.vision.data import ImageFolderSource

    with tempfile.TemporaryDirectory() as tmp:
        src = ImageFolderSource(write_jpegs(Path(tmp), items), "train", 224)
        chunks = [list(range(s, min(s + batch, items))) for s in range(0, items, batch)]
        decode = statistics.median(cpu_seconds(lambda: [src.image(i) for i in range(items)]) for _ in range(rounds))
        print(f"loader at 224 px: {items} ImageNet-sized JPEGs (500×375), micro-batches of {batch}, {rounds} "
              f"round(s), 1 thread, CPU time; decoding alone {1e3 * decode / items:.1f} ms a sample")
        for name, sets in loader_sets(src).items():
            slow, fast, on_cpu = loader_round(*sets, chunks, rounds)
            ratios = [s / f for s, f in zip(slow, fast, strict=True)]
            print(f"{name}")
            print(f"  augment_on cpu:    {1e3 * statistics.median(slow) / items:7.1f} ms CPU a sample")
            print(f"  augment_on device: {1e3 * statistics.median(fast) / items:7.1f} ms CPU a sample in the worker, "
                  f"and {1e3 * on_cpu / items:.1f} ms for the device's half were it run on this CPU")
            print(f"  ratio cpu/device CPU time: median {statistics.median(ratios):.2f}x  min {min(ratios):.2f}x")


def loader_round(cpu, device, half, chunks: list, rounds: int) -> tuple[list, list, float]:
    """CPU seconds of each round of the cpu path and of the device path's workers (taking turns), and the
    median of the device's half run here."""
    from torch.utils.data import default_collate

    slow, fast = [], []
    for _ in range(rounds):
        slow.append(cpu_seconds(lambda: [default_collate(cpu.__getitems__(c)) for c in chunks]))
        fast.append(cpu_seconds(lambda: [default_collate(device.__getitems__(c)) for c in chunks]))
    batches = [default_collate(device.__getitems__(c)) for c in chunks]
    return slow, fast, statistics.median(cpu_seconds(lambda: [half(b) for b in batches]) for _ in range(rounds))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loader-items", type=int, default=128, help="JPEGs for the loader at 224 px")
    ap.add_argument("--only", choices=("views", "loader"), help="one of the two measurements")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 128 items (the loader: 8), one round")
    args = ap.parse_args(argv)
    items, rounds = (128, 1) if args.quick else (args.items, args.rounds)
    torch.set_num_threads(1)
    if args.only != "views":
        loader(8 if args.quick else args.loader_items, min(args.batch, 32), rounds)
    if args.only == "loader":
        return
    for name, ds in training_sets(items).items():
        ds.set_epoch(1)
        fast, slow = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            batched(ds, items, args.batch)
            fast.append(time.perf_counter() - t)
            t = time.perf_counter()
            one_at_a_time(ds, items)
            slow.append(time.perf_counter() - t)
        ratios = [s / f for s, f in zip(slow, fast, strict=True)]
        print(f"{name} cpu training set, {items} items, {len(augs(ds))} views each, {rounds} round(s), 1 thread")
        print(f"  batched ({args.batch} a call): {items / statistics.median(fast):9.0f} items/s")
        print(f"  torch, one at a time:  {items / statistics.median(slow):9.0f} items/s")
        print(f"  ratio torch/batched time: median {statistics.median(ratios):.2f}x  min {min(ratios):.2f}x")


if __name__ == "__main__":
    main()
