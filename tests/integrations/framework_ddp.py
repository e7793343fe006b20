"""One check for the framework callbacks under torchrun: a 2-process gloo run at 8 samples per device ends with
the EMA of one process at 16."""

import os
import subprocess
import sys
from pathlib import Path

import torch


def assert_two_processes_give_the_ema_of_one(script_name: str, tmp_path: Path) -> None:
    script = str(Path(__file__).parent / script_name)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # gloo checks: Lightning would take a GPU
    runs = {1: [sys.executable, script, str(tmp_path / "1.pt"), "1"],
            2: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script,
                str(tmp_path / "2.pt"), "2"]}
    for cmd in runs.values():
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
    one, two = (torch.load(tmp_path / f"{n}.pt") for n in (1, 2))
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["global_batch"] == two["global_batch"] == 16
    for k in one["ema"]:
        torch.testing.assert_close(two["ema"][k], one["ema"][k])
