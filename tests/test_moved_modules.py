"""The imports the docs still show at the old module paths are the moved modules themselves."""

import importlib
import subprocess
import sys

import pytest

from emarule import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new and new.__spec__.name == MOVED[old]


def test_the_readme_and_model_ema_imports_work_in_a_fresh_process():
    code = ("from emarule.tasks.parts import Evaluation, TaskParts\nfrom emarule.train import train\n"
            "from emarule.posthoc import reconstruct, solve\nimport emarule.engine.loop as L\n"
            "assert train is L.train and L.__spec__.name == 'emarule.engine.loop'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("emarule.not_a_module")
