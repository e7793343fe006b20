"""What the data checks made before the first step cost per file (docs/faults.md).

    .venv/bin/python benchmarks/data_checks.py [--classes 100] [--per-class 200]

Writes an ImageNet-style folder of small JPEGs under a temporary directory and times, per file:
  listing   what an ImageNet run does before its first step: ImageFolder's scan of train/ and val/
            plus emarule's comparison of their class folders (`vision.data.same_classes`)
  header    what it does not do: opening each JPEG to read its header (PIL.Image.open), the
            cheapest per-file check of the image itself; a truncated file still passes it, so
            decoding errors are caught when an item is read in training instead
and, on a LibriSpeech-layout split of short FLACs, `speech.librispeech.list_split` (reads every
header and decodes every transcript) per utterance. Prints µs per file and the total for
ImageNet's 1,281,167 training files (and LibriSpeech train-clean-100's 28,539 utterances).
The page cache is warm (the files were just written): a cold network file system is slower.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IMAGENET_TRAIN = 1_281_167
LIBRISPEECH_100 = 28_539


def write_images(root: Path, classes: int, per_class: int) -> int:
    from PIL import Image

    g = np.random.default_rng(0)
    img = Image.fromarray(g.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    for split, n in (("train", per_class), ("val", max(1, per_class // 10))):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True)
            for i in range(n):
                img.save(d / f"{i}.JPEG", quality=85)
    return classes * (per_class + max(1, per_class // 10))


def write_speech(root: Path, n: int) -> None:
    import soundfile

    g = np.random.default_rng(0)
    d = root / "train-clean-100" / "1" / "1"
    d.mkdir(parents=True)
    lines = []
    for k in range(n):
        uid = f"1-1-{k:04d}"
        soundfile.write(str(d / f"{uid}.flac"), 0.1 * g.standard_normal(8000), 16000, format="FLAC")
        lines.append(f"{uid} A SHORT LINE OF WORDS")
    (d / "1-1.trans.txt").write_text("\n".join(lines) + "\n")


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--utterances", type=int, default=2000)
    a = ap.parse_args()

    from PIL import Image
    from torchvision.datasets import ImageFolder

    from emarule.speech.librispeech import list_split
    from emarule.vision.data import same_classes

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = write_images(root / "imagenet", a.classes, a.per_class)

        def listing():
            tr, va = ImageFolder(str(root / "imagenet" / "train")), ImageFolder(str(root / "imagenet" / "val"))
            same_classes(tr.classes, va.classes, root / "imagenet")

        paths = sorted((root / "imagenet").rglob("*.JPEG"))

        def headers():
            for p in paths:
                with Image.open(p) as im:
                    im.size  # noqa: B018 - the header is parsed on open

        write_speech(root / "ls", a.utterances)
        rows = [("ImageNet listing + class check", best(listing) / files, IMAGENET_TRAIN),
                ("ImageNet JPEG header (not done)", best(headers) / len(paths), IMAGENET_TRAIN),
                ("LibriSpeech list_split", best(lambda: list_split(root / "ls", "train-clean-100"))
                 / a.utterances, LIBRISPEECH_100)]
    for name, per_file, n in rows:
        print(f"{name:34s} {per_file * 1e6:8.1f} µs/file   × {n:,} files = {per_file * n:7.1f} s")


if __name__ == "__main__":
    main()
