"""Every script `make bench` runs works in its --quick mode and prints its measured ratio."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RATIO = re.compile(r"ratio [^:]*: median \d+\.\d+x\s+min \d+\.\d+x")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["loop_overhead", "parabola_speed", "startup", "augment_speed", "memory_format"])
def test_quick_mode_prints_a_ratio(script, capsys):
    threads = torch.get_num_threads()
    try:
        load(script).main(["--quick"])
    finally:
        torch.set_num_threads(threads)  # loop_overhead pins the thread count
    out = capsys.readouterr().out
    assert RATIO.search(out), out


def test_ema_update_benchmark_quick_mode_prints_each_method_relative_to_emarule(capsys):
    load("run").main(["--quick", "--device", "cpu"])
    out = capsys.readouterr().out
    assert re.search(r"emarule\s+[\d.]+ ms\s+[\d.]+ ms\s+1\.00x\s+1\.00x", out), out
    assert "naive per-tensor loop" in out
