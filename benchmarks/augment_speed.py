"""The self-supervised training sets' items: made a batch at a time (what the loop does) against one image at a
time in torch (the oracle the batch matches bitwise, tests/augment_reference.py).

For byol-vit's and dino-vit's `cpu` training sets (the generated shapes at 16 px; BYOL's two views, DINO's
two global crops), each round makes the same `--items` items both ways, taking turns, on one torch thread:

  batched   the data set's `__getitems__` on micro-batches of `--batch` indices (as the DataLoader asks)
  torch     `reference_view` per view and image, then the same normalization

Prints items/s of each (median over rounds) and torch/batched wall time as the median and the minimum of the
per-round ratios (above 1.00x: the batch is faster).
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smoke test: 128 items, one round")
    args = ap.parse_args(argv)
    items, rounds = (128, 1) if args.quick else (args.items, args.rounds)
    torch.set_num_threads(1)
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
