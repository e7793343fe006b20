"""Image sources (CIFAR-10, ImageNet, scikit-learn digits, generated shapes, synthetic) and the two-view training set.

Nothing is ever downloaded: CIFAR-10 and ImageNet are read from a local directory (`--data`)
and a missing or malformed directory is a one-line `UserError` naming the layout expected.
The digits (1,797 8×8 images shipped inside scikit-learn) and the generated shapes
(`emarule.vision.shapes`, cached after their first use) need no directory at all.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import torch

from emarule.errors import UserError
from emarule.vision import augment as A

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DIGITS_MEAN, DIGITS_STD = (0.30, 0.30, 0.30), (0.38, 0.38, 0.38)

CIFAR_LAYOUT = ("torchvision's CIFAR-10 layout: DIR/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}"
                " (the extracted cifar-10-python.tar.gz)")
IMAGENET_LAYOUT = "an ImageFolder layout: DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG"

DIGITS_TEST = 360  # fixed held-out split of the 1,797 digits (20 %); the rest (1,437) train


class Source:
    """Images (uint8 or float C×H×W) and integer labels, indexable."""

    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    name: str = "?"
    num_classes: int = 10

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, i: int) -> torch.Tensor:
        return self.images[i]

    def label(self, i: int) -> int:
        return int(self.labels[i])

    def eval_view(self, i: int, size: int) -> torch.Tensor:
        return A.normalize(A.resize(A.to_float(self.image(i)), size).expand(3, -1, -1), self.mean, self.std)


class TensorSource(Source):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, name: str, mean, std, num_classes: int):
        self.images, self.labels, self.name = images, labels, name
        self.mean, self.std, self.num_classes = mean, std, num_classes

    def subset(self, n: int | None) -> "TensorSource":
        if n is None or n >= len(self):
            return self
        return TensorSource(self.images[:n], self.labels[:n], self.name, self.mean, self.std, self.num_classes)


@functools.lru_cache(maxsize=1)
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits as (images 1797×8×8 float64, labels), the arrays sklearn's load_digits returns;
    read once per process (a run reads its train and test split). Callers copy, never write, them.

    Read from the CSV inside the installed scikit-learn without importing it: `sklearn.datasets` imports
    scipy and half of scikit-learn, 2–3 s of every process that trains on the digits."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        csv = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            with gzip.open(csv, mode="rt", encoding="utf-8") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits  # another packaging of scikit-learn: its own loader finds the file

    d = load_digits()
    return d.images, d.target


def digits(train: bool) -> TensorSource:
    """scikit-learn's 1,797 8×8 digits as 1×8×8 floats in [0, 1]; a fixed 1,437 / 360 split."""
    images, target = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).div_(16.0)[:, None]
    y = torch.tensor(target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1797))
    idx = perm[DIGITS_TEST:] if train else perm[:DIGITS_TEST]
    return TensorSource(x[idx].contiguous(), y[idx].contiguous(), "digits", DIGITS_MEAN, DIGITS_STD, 10)


def shapes(train: bool, n: int | None) -> TensorSource:
    """The generated shapes (`emarule.vision.shapes`): the first n images of the split, built once and cached."""
    from emarule.vision import shapes as S

    size = S.TRAIN if train else S.TEST
    x, y = S.load(S.ShapesRequest(n or size, 0 if train else 1))
    return TensorSource(x, y, "shapes", S.MEAN, S.STD, len(S.CLASSES))


def cifar10(root: Path | None, train: bool) -> TensorSource:
    if root is None:
        raise UserError("CIFAR-10 is read from a local directory: pass --data DIR with " + CIFAR_LAYOUT +
                        ", or use --preset cpu (scikit-learn digits, no download)")
    root = Path(root).expanduser()
    if root.name == "cifar-10-batches-py":
        root = root.parent
    if not (root / "cifar-10-batches-py").is_dir():
        raise UserError(f"CIFAR-10 not found at {root}: expected {CIFAR_LAYOUT}; nothing is downloaded")
    try:
        x, y = read_cifar_batches(root / "cifar-10-batches-py", CIFAR_TRAIN if train else CIFAR_TEST)
    except BadBatch as e:  # the file is whole but its numbers are not CIFAR-10's: the layout is not the fix
        raise UserError(f"CIFAR-10 at {root}: {e}; the pickles are corrupt: extract cifar-10-python.tar.gz "
                        f"again") from None
    except (RuntimeError, OSError, ValueError, KeyError, TypeError, OverflowError, EOFError,
            pickle.UnpicklingError) as e:
        raise UserError(f"CIFAR-10 at {root} is incomplete or corrupt ({' '.join(str(e).split())}); "
                        f"expected {CIFAR_LAYOUT}") from None
    return TensorSource(x, y, "cifar10", CIFAR10_MEAN, CIFAR10_STD, 10)


CIFAR_TRAIN = tuple(f"data_batch_{k}" for k in range(1, 6))
CIFAR_TEST = ("test_batch",)


class BadBatch(ValueError):
    """A batch that unpickles to a dict but whose `data` or `labels` are not CIFAR-10's; the message names both."""


def read_cifar_batches(folder: Path, names: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The pickled batches torchvision's CIFAR10 reads (N×3072 uint8 rows, R then G then B planes),
    read the same way but without its md5 check, so that any directory in that layout loads: a
    subset, or the tiny one the tests write. Returns (N×3×32×32 uint8, N int64 labels).

    Every batch's numbers are checked (`cifar_rows`, `cifar_labels`): a cast would otherwise wrap
    pixels above 255, truncate float labels and turn NaN into a pixel, and train without a word."""
    xs, ys = [], []
    for name in names:
        with open(folder / name, "rb") as f:
            entry = unpickle(f, name)
        missing = [k for k in ("data", "labels") if k not in entry and not (k == "labels" and "fine_labels" in entry)]
        if missing:
            raise ValueError(f"{name}: no {' or '.join(map(repr, missing))} entry in the batch")
        try:
            data = np.asarray(entry["data"])
            labels = np.asarray(entry["labels"] if "labels" in entry else entry["fine_labels"])
        except (TypeError, ValueError, OverflowError) as e:  # ragged rows, an int too big for any dtype
            raise BadBatch(f"{name}: its entries are not image rows and integer labels ({e})") from None
        data = cifar_rows(name, data)
        ys.append(torch.from_numpy(cifar_labels(name, labels, len(data))))
        xs.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
    return torch.cat(xs), torch.cat(ys)


def cifar_rows(name: str, data: np.ndarray) -> np.ndarray:
    """`data` as N×3072 uint8, or a BadBatch. Another integer dtype is accepted when every value fits a
    byte (a batch re-pickled through int64 is still the same images); anything else is refused."""
    if data.dtype.kind not in "iu":
        if data.dtype.kind not in "bfc":  # None, strings: not numbers at all
            raise BadBatch(f"{name}: its entries are not image rows and integer labels (data holds {data.dtype})")
        nan = " (NaN among them)" if data.dtype.kind in "fc" and np.isnan(data).any() else ""
        raise BadBatch(f"{name}: data holds {data.dtype} pixels{nan}, not integers 0..255")
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise BadBatch(f"{name}: data has shape {data.shape}, not N×3072 image rows")
    if data.dtype != np.uint8 and data.size:  # one pass each over at most 30 MB
        lo, hi = int(data.min()), int(data.max())
        if lo < 0 or hi > 255:
            where = " and ".join(([f"down to {lo}"] if lo < 0 else []) + ([f"up to {hi}"] if hi > 255 else []))
            raise BadBatch(f"{name}: data holds {data.dtype} values {where}, outside 0..255 (integers in range "
                           f"of any dtype are read as uint8)")
    return data.astype(np.uint8, copy=False)


def cifar_labels(name: str, labels: np.ndarray, n: int) -> np.ndarray:
    """`labels` as n int64 classes 0..9, or a BadBatch naming the first bad one. Here, per batch, so that the
    message can name the file: a label out of range would otherwise fail inside the loss, mid-run."""
    if labels.dtype.kind not in "iu":
        if labels.dtype.kind not in "bfc":
            raise BadBatch(f"{name}: its entries are not image rows and integer labels (labels hold {labels.dtype})")
        flat = labels.reshape(-1)
        odd = np.flatnonzero(flat != np.round(flat.real)) if labels.dtype.kind in "fc" else []
        i = int(odd[0]) if len(odd) else 0
        example = f" ({flat[i]} at item {i})" if flat.size else ""
        raise BadBatch(f"{name}: labels are {labels.dtype}{example}, not integer classes 0..9")
    if labels.ndim != 1 or len(labels) != n:
        count = f"{len(labels)} labels" if labels.ndim == 1 else f"labels of shape {labels.shape}"
        raise BadBatch(f"{name}: labels: {count} for {n} image rows")
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if len(bad):
        i = int(bad[0])
        split = "test" if name.startswith("test") else "training"
        raise BadBatch(f"{name}: labels: {split} label {int(labels[i])} at item {i} is not a class 0..9 "
                       f"({len(bad)} such labels)")
    return labels.astype(np.int64)  # a copy: a protocol-5 pickle's array is read-only, which torch warns of


# What a CIFAR-10 batch pickle may name: numpy's array (and scalar) reconstruction, under numpy 1's and 2's
# module names, and the bytes of a protocol-2 pickle written by Python 3. Anything else, a damaged name or
# a call a crafted file asks for, is refused before it is imported.
CIFAR_GLOBALS = frozenset({(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
                           for n in ("_reconstruct", "scalar")}
                          | {(m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")}
                          | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")})


class CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR-10 batch never holds")
        return super().find_class(module, name)


def unpickle(f, name: str) -> dict:
    """A batch's dict, or a ValueError naming the file: every way a damaged pickle fails (a bad opcode, a
    name cut short, a length that asks for all memory) is one error here."""
    import warnings

    try:
        with warnings.catch_warnings():  # numpy 2.4 on the int `align` that Python 2's numpy wrote in every batch
            warnings.filterwarnings("ignore", message=r"dtype\(\): align should be passed")
            entry = CifarUnpickler(f, encoding="latin1").load()
    except Exception as e:  # noqa: BLE001 - any failure of a damaged data file is that file's fault
        raise ValueError(f"{name}: not a CIFAR-10 batch ({type(e).__name__}: {e})") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{name}: holds a {type(entry).__name__}, not a CIFAR-10 batch's dict")
    return entry


def synthetic(train: bool, n: int, size: int, num_classes: int) -> TensorSource:
    """Class-dependent noise images (deterministic): a stand-in to smoke-test full-size models."""
    g = torch.Generator().manual_seed(0 if train else 1)
    protos = torch.rand(num_classes, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = protos[y] + 0.3 * torch.rand(n, 3, 8, 8, generator=g)
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x.clamp(0, 1.3) / 1.3 * 255).to(torch.uint8)
    return TensorSource(x, y, "synthetic", (0.5,) * 3, (0.25,) * 3, num_classes)


class ImageFolderSource(Source):
    """ImageNet-style folders; images decoded on access (uint8 C×H×W)."""

    def __init__(self, root: Path, split: str, eval_size: int):
        from torchvision.datasets import ImageFolder

        self.dir = root / split
        if not self.dir.is_dir():
            raise UserError(f"ImageNet not found: {self.dir} is not a directory; "
                            f"pass --data DIR with {IMAGENET_LAYOUT}")
        from emarule.vision.folder_links import check_split

        check_split(root, self.dir)
        try:
            self.ds = ImageFolder(str(self.dir))
        except (FileNotFoundError, RuntimeError, OSError) as e:
            raise UserError(f"ImageNet at {self.dir}: {' '.join(str(e).split())}; expected {IMAGENET_LAYOUT}") from None
        self.name, self.mean, self.std = f"imagefolder:{split}", IMAGENET_MEAN, IMAGENET_STD
        self.num_classes = len(self.ds.classes)
        self.labels = [t for _, t in self.ds.samples]
        self.eval_size = eval_size

    def image(self, i: int) -> torch.Tensor:
        from torchvision.transforms.functional import pil_to_tensor

        return pil_to_tensor(self.pil(i))  # RGB uint8 C×H×W

    def pil(self, i: int):
        """Item i decoded whole (a PIL RGB image), or an ItemError naming its file: every reader of the folder
        decodes here, so that a damaged file is named (or skipped, `data.skip_bad_items`) wherever it is met."""
        from PIL import Image

        from emarule.engine.baditems import ItemError

        path = self.ds.samples[i][0]
        try:
            return self.ds.loader(path)  # torchvision's loader converts to RGB, which decodes every pixel
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:  # PIL's errors: truncated,
            raise ItemError(path, f"{type(e).__name__}: {e}") from None  # not an image, a bad header, too large

    def eval_view(self, i: int, size: int) -> torch.Tensor:
        """Resize the shorter side to size/0.875, center-crop size (the usual ImageNet evaluation)."""
        img = A.to_float(self.image(i))
        h, w = img.shape[-2:]
        short = int(round(size / 0.875))
        nh, nw = (short, max(1, round(w * short / h))) if h <= w else (max(1, round(h * short / w)), short)
        img = torch.nn.functional.interpolate(img[None], size=(nh, nw), mode="bilinear", align_corners=False,
                                              antialias=True)[0]
        i0, j0 = (nh - size) // 2, (nw - size) // 2
        return A.normalize(img[:, i0:i0 + size, j0:j0 + size], self.mean, self.std)


def imagenet(root: Path | None, image_size: int) -> tuple[ImageFolderSource, ImageFolderSource]:
    """(train, val) ImageFolder sources whose class folders agree, or a one-line UserError."""
    if root is None:
        raise UserError("ImageNet is read from a local directory: pass --data DIR with " + IMAGENET_LAYOUT)
    root = Path(root).expanduser()
    for split in ("train", "val"):  # both checked before scanning 1.28M training files
        if not (root / split).is_dir():
            raise UserError(f"ImageNet not found: {root / split} is not a directory; "
                            f"pass --data DIR with {IMAGENET_LAYOUT}")
    train, val = ImageFolderSource(root, "train", image_size), ImageFolderSource(root, "val", image_size)
    same_classes(train.ds.classes, val.ds.classes, root)
    return train, val


def same_classes(train: list, val: list, root: Path) -> None:
    """Labels are folder indices: val/<class>/ folders that differ from train's would score the wrong class."""
    if list(train) != list(val):
        only_t, only_v = sorted(set(train) - set(val)), sorted(set(val) - set(train))
        what = (f"{len(only_t)} class folder(s) only in train/ (e.g. {only_t[0]})" if only_t else "") + \
               (", " if only_t and only_v else "") + \
               (f"{len(only_v)} only in val/ (e.g. {only_v[0]})" if only_v else "")
        raise UserError(f"ImageNet at {root}: train/ and val/ hold different class folders ({what}); both "
                        f"splits need the same <class>/ folders")


class Subset(Source):
    def __init__(self, base: Source, n: int):
        self.base, self.n = base, min(n, len(base))
        self.mean, self.std, self.name, self.num_classes = base.mean, base.std, base.name, base.num_classes

    def __len__(self) -> int:
        return self.n

    def image(self, i: int) -> torch.Tensor:
        return self.base.image(self._map(i))

    def label(self, i: int) -> int:
        return self.base.label(self._map(i))

    def eval_view(self, i: int, size: int) -> torch.Tensor:
        return self.base.eval_view(self._map(i), size)

    def _map(self, i: int) -> int:
        # An evenly spread subset, so that a cap keeps every class of a class-sorted folder.
        return (i * len(self.base)) // self.n


def load_sources(source: str, root: Path | None, image_size: int, train_samples: int | None,
                 eval_samples: int | None, num_classes: int) -> tuple[Source, Source]:
    """(train, test) sources for `data.source`, each capped by the preset's sample counts."""
    if source == "digits":
        train, test = digits(True), digits(False)
    elif source == "cifar10":
        train, test = cifar10(root, True), cifar10(root, False)
    elif source == "shapes":
        train, test = shapes(True, train_samples), shapes(False, eval_samples)
    elif source == "synthetic":
        train = synthetic(True, train_samples or 512, max(image_size, 8), num_classes)
        test = synthetic(False, eval_samples or 256, max(image_size, 8), num_classes)
    elif source == "imagenet":
        train, test = imagenet(root, image_size)
    else:
        raise UserError(f"data.source {source!r}: use cifar10, imagenet, digits, shapes or synthetic")
    if train_samples is not None and train_samples < len(train):
        train = train.subset(train_samples) if isinstance(train, TensorSource) else Subset(train, train_samples)
    if eval_samples is not None and eval_samples < len(test):
        test = test.subset(eval_samples) if isinstance(test, TensorSource) else Subset(test, eval_samples)
    return train, test


class TwoViewSet(A.SeededViews):
    """BYOL's training set: item i at epoch e is (view1, view2, label), a pure function of (seed, e, i)."""

    def __init__(self, source: Source, augmentation: str, image_size: int, seed: int):
        if augmentation not in A.STACKS:
            raise UserError(f"data.augmentation {augmentation!r}: use one of {', '.join(sorted(A.STACKS))}")
        super().__init__(source, seed)
        self.size = image_size
        self.aug1, self.aug2 = A.STACKS[augmentation]
        self.augmentation = augmentation

    def __getitems__(self, indices: list) -> list:
        """A batch of items, made together (`augment.views`): each is bitwise the item `[i]` gives."""
        idx = [int(i) for i in indices]
        draws = [d for pair in self.draws(idx, 2) for d in pair]  # view 1, then view 2
        images = [self.source.image(i) for i in idx]
        m, s = self.source.mean, self.source.std
        v1 = A.normalized_views(images, self.aug1, self.size, draws[0::2], m, s)
        v2 = A.normalized_views(images, self.aug2, self.size, draws[1::2], m, s)
        return [(v1[k], v2[k], self.source.label(i)) for k, i in enumerate(idx)]
