"""CIFAR-10's pickles are read by an unpickler that resolves only numpy's array globals: real batches (written by
Python 2's cPickle, or by numpy today) load, and a damaged or crafted one is one line naming the file, never a
traceback, and never runs what it names."""

import pickle
import struct

import numpy as np
import pytest
import torch

from emarule.errors import UserError
from emarule.vision.data import cifar10

NAMES = [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]


def _s(b: bytes) -> bytes:  # a Python 2 str: SHORT_BINSTRING or BINSTRING
    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)


def py2_batch(data: np.ndarray, labels: list) -> bytes:
    """A batch as the cifar-10-python.tar.gz holds it: cPickle protocol 2, str keys, numpy.core's names, the pixels
    one BINSTRING."""
    n, width = data.shape
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + _s(b"b") + b"\x87R(K\x01J"
             + struct.pack("<i", n) + b"J" + struct.pack("<i", width) + b"\x86cnumpy\ndtype\n" + _s(b"u1")
             + b"K\x00K\x01\x87R(K\x03" + _s(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89"
             + _s(data.tobytes()) + b"tb")
    return (b"\x80\x02}(" + _s(b"data") + array + _s(b"labels") + b"](" + b"".join(b"K" + bytes([v]) for v in labels)
            + b"e" + _s(b"batch_label") + _s(b"training batch") + b"u.")


def write(root, how="py2", n=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(0)
    for name in NAMES:
        data, labels = g.integers(0, 256, (n, 3072), dtype=np.uint8), [int(v) for v in g.integers(0, 10, n)]
        if how == "py2":
            (folder / name).write_bytes(py2_batch(data, labels))
        else:
            (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels, "filenames": ["a.png"] * n},
                                                     protocol=how))
    return folder


@pytest.mark.parametrize("how", ["py2", 2, 4, 5])
def test_real_batches_load(tmp_path, how):
    folder = write(tmp_path, how)
    test = cifar10(tmp_path, False)
    want = pickle.loads((folder / "test_batch").read_bytes(), encoding="latin1")
    assert np.array_equal(test.images.reshape(4, -1).numpy(), want["data"]) and test.labels.tolist() == want["labels"]
    assert len(cifar10(tmp_path, True)) == 5 * 4


def test_a_module_name_damaged_in_the_header_is_one_line(tmp_path):
    path = write(tmp_path, 2) / "test_batch"
    path.write_bytes(path.read_bytes().replace(b"numpy", b"numpz", 1))  # was ModuleNotFoundError
    with pytest.raises(UserError, match=r"test_batch: not a CIFAR-10 batch \(UnpicklingError: it names numpz") as e:
        cifar10(tmp_path, False)
    assert "incomplete or corrupt" in str(e.value) and "\n" not in str(e.value)


def test_a_pickle_that_asks_for_a_call_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    write(tmp_path, 2)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({"data": Payload(), "labels": []}))
    with pytest.raises(UserError, match=r"it names (posix|os)\.system, which a CIFAR-10 batch never holds"):
        cifar10(tmp_path, False)
    assert not marker.exists()


@pytest.mark.parametrize("value", [0x00, 0x7A, 0xFF])
def test_every_byte_of_the_header_damaged_loads_or_is_one_line(tmp_path, value):
    path = write(tmp_path, "py2", n=1) / "test_batch"
    good = path.read_bytes()
    for at in range(120):  # the opcodes, the keys, numpy's names and the array's shape and dtype
        path.write_bytes(good[:at] + bytes([value]) + good[at + 1:])
        try:
            cifar10(tmp_path, False)
        except UserError as e:
            assert "\n" not in str(e) and "CIFAR-10 at" in str(e)


@pytest.mark.parametrize("edit,says", [
    (lambda d: d.pop("labels"), "data_batch_3: no 'labels' entry in the batch"),
    (lambda d: d.pop("data"), "data_batch_3: no 'data' entry in the batch"),
    (lambda d: d["labels"].__setitem__(1, None), "data_batch_3: its entries are not image rows and integer labels"),
])
def test_a_batch_that_unpickles_but_lacks_its_entries_is_named(tmp_path, edit, says):
    """A batch whose pickle is whole but whose dict is not CIFAR-10's: the message names the file and the entry."""
    folder = write(tmp_path, 2)
    d = pickle.loads((folder / "data_batch_3").read_bytes())
    edit(d)
    (folder / "data_batch_3").write_bytes(pickle.dumps(d, protocol=2))
    with pytest.raises(UserError) as e:
        cifar10(tmp_path, True)
    assert says in str(e.value) and "\n" not in str(e.value)


# --- numerically invalid batches: a pickle that loads but whose numbers are not CIFAR-10's ---------------------

FIX = "the pickles are corrupt: extract cifar-10-python.tar.gz again"


def rewrite(folder, name, **entries):
    """The batch `name` of a tiny directory, re-pickled with `entries` replaced."""
    d = pickle.loads((folder / name).read_bytes())
    d.update(entries)
    (folder / name).write_bytes(pickle.dumps(d, protocol=2))
    return d


def refusal(root, train=True) -> str:
    with pytest.raises(UserError) as e:
        cifar10(root, train)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"CIFAR-10 at {root}: ") and line.endswith(FIX)
    return line


def test_pixel_values_above_255_in_an_int64_array_are_refused_not_wrapped(tmp_path):
    data = np.zeros((4, 3072), dtype=np.int64)
    data[2, 7] = 1785  # as uint8 it would have read as 249
    rewrite(write(tmp_path, 2), "data_batch_3", data=data)
    assert "data_batch_3: data holds int64 values up to 1785, outside 0..255" in refusal(tmp_path)


def test_negative_pixel_values_are_refused(tmp_path):
    rewrite(write(tmp_path, 2), "test_batch", data=np.full((4, 3072), -3, dtype=np.int16))
    assert "test_batch: data holds int16 values down to -3, outside 0..255" in refusal(tmp_path, False)


@pytest.mark.parametrize("nan,says", [(True, "data holds float32 pixels (NaN among them), not integers 0..255"),
                                      (False, "data holds float32 pixels, not integers 0..255")])
def test_float_or_nan_pixels_are_refused(tmp_path, nan, says):
    data = np.full((4, 3072), 0.5, dtype=np.float32)
    if nan:
        data[1, 100] = np.nan
    rewrite(write(tmp_path, 2), "data_batch_2", data=data)
    assert f"data_batch_2: {says}" in refusal(tmp_path)


@pytest.mark.parametrize("labels", [[1, 3.7, 2, 0], np.array([1.0, 3.7, 2.0, 0.0])])
def test_float_labels_are_refused_not_truncated(tmp_path, labels):
    rewrite(write(tmp_path, 2), "data_batch_4", labels=labels)
    assert "data_batch_4: labels are float64 (3.7 at item 1), not integer classes 0..9" in refusal(tmp_path)


@pytest.mark.parametrize("train,name,labels,says", [
    (True, "data_batch_5", [0, 12, 3, 4], "data_batch_5: labels: training label 12 at item 1 is not a class 0..9"),
    (False, "test_batch", [0, 1, 2, -1], "test_batch: labels: test label -1 at item 3 is not a class 0..9"),
])
def test_a_label_out_of_range_is_refused_naming_its_batch(tmp_path, train, name, labels, says):
    rewrite(write(tmp_path, 2), name, labels=labels)
    assert says in refusal(tmp_path, train)


@pytest.mark.parametrize("labels", [[0, 1, 2], [0, 1, 2, 3, 4]])
def test_labels_of_the_wrong_count_are_refused(tmp_path, labels):
    rewrite(write(tmp_path, 2), "data_batch_1", labels=labels)
    assert f"data_batch_1: labels: {len(labels)} labels for 4 image rows" in refusal(tmp_path)


def test_image_rows_of_the_wrong_width_are_refused(tmp_path):
    rewrite(write(tmp_path, 2), "data_batch_1", data=np.zeros((4, 3000), dtype=np.uint8))
    assert "data_batch_1: data has shape (4, 3000), not N×3072 image rows" in refusal(tmp_path)


def test_integer_pixels_and_labels_of_another_dtype_in_range_load_as_uint8_and_int64(tmp_path):
    folder = write(tmp_path, 2)
    d = rewrite(folder, "test_batch", data=np.arange(4 * 3072).reshape(4, 3072) % 256,
                labels=np.array([9, 0, 5, 1], dtype=np.int32))
    test = cifar10(tmp_path, False)
    assert test.images.dtype == torch.uint8 and test.labels.dtype == torch.int64
    assert np.array_equal(test.images.reshape(4, -1).numpy(), d["data"]) and test.labels.tolist() == [9, 0, 5, 1]
    assert len(cifar10(tmp_path, True)) == 5 * 4
