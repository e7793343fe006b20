"""emarule.integrations: the global batch, and `import emarule` importing no framework."""

import subprocess
import sys

import pytest

from emarule.integrations import global_batch


def test_global_batch_is_per_device_times_processes_times_accumulation():
    assert global_batch(8, 4, 2) == 64


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_global_batch_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match="whole number"):
        global_batch(bad, 1, 1)


def test_import_emarule_imports_no_framework():
    code = ("import sys, emarule, emarule.integrations\n"
            "bad = [m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch') if m in sys.modules]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
