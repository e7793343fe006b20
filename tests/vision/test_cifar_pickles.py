"""CIFAR-10's pickles are read by an unpickler that resolves only numpy's array globals: real batches (written by
Python 2's cPickle, or by numpy today) load, and a damaged or crafted one is one line naming the file, never a
traceback, and never runs what it names."""

import pickle
import struct

import numpy as np
import pytest

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
