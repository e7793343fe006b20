"""The image sources of emarule/vision/data.py that need no directory."""

import subprocess
import sys

import numpy as np

from emarule.vision import data as VD


def test_digits_are_scikit_learns_arrays_read_without_importing_it():
    from sklearn.datasets import load_digits

    images, target = VD.digits_arrays()
    d = load_digits()
    assert images.dtype == d.images.dtype and target.dtype == d.target.dtype
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target)
    train, test = VD.digits(True), VD.digits(False)
    assert (len(train), len(test)) == (1437, 360) and train.images.shape[1:] == (1, 8, 8)
    code = "import sys; from emarule.vision import data; data.digits(True); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
