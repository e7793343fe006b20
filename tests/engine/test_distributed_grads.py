"""2 processes (gloo) = 1 process for a parameter no rank gave a gradient: DINO's last layer, frozen in epoch 1."""

import subprocess
import sys

from engine_util import ROOT, env, load_checkpoint, max_diff, run_cli


def test_a_parameter_without_a_gradient_is_not_stepped_by_two_processes(tmp_path):
    """With grad None the optimizer skips a parameter (no weight decay, no step); zeros would step it."""
    args = ["dino-vit", "--preset", "tiny"]
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", *args, "--out", str(tmp_path / "two")]
    r = subprocess.run(two, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(*args, "--out", str(tmp_path / "one"), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "two")
    assert a["clock"] == b["clock"] and a["clock"]["epoch"] == 2
    steps = [[float(s["step"]) for s in ck["optimizer"]["state"].values()] for ck in (a, b)]
    assert steps[0] == steps[1] and min(steps[0]) < max(steps[0])  # the frozen layer took fewer steps
    last = {k: v for k, v in a["model"].items() if ".last_layer." in k}
    assert last and max_diff(last, b["model"]) < 1e-5
