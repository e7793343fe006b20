"""Batch layout and data order independent of world size; 2 processes (gloo) = 1 process; accumulation."""

import subprocess
import sys

import pytest
import torch

from emarule import distributed
from emarule.errors import UserError
from engine_util import ROOT, env, load_checkpoint, max_diff, run_toy, toy_spec, write_spec


def test_layout_accumulates_to_fit_max_device_batch():
    lay = distributed.layout(64, 2, 10)
    assert (lay.per_rank, lay.accumulation) == (32, 4)
    assert lay.micro_sizes == [8, 8, 8, 8] and lay.max_micro <= 10
    lay = distributed.layout(30, 1, 7)
    assert sum(lay.micro_sizes) == 30 and max(lay.micro_sizes) <= 7 and lay.accumulation == 5
    assert distributed.layout(32, 4, None).accumulation == 1


def test_layout_errors_name_the_fix():
    with pytest.raises(UserError, match="does not split over 3 processes"):
        distributed.layout(64, 3, None)
    with pytest.raises(UserError, match="not a whole number"):
        distributed.layout(16 * 1.5 + 0.5, 1, None)


@pytest.mark.parametrize("world,max_dev", [(1, None), (1, 3), (2, None), (2, 5), (4, 2)])
def test_global_batches_are_the_same_samples_in_the_same_order(world, max_dev):
    perm = distributed.epoch_permutation(100, seed=3, epoch=2)
    assert torch.equal(perm, distributed.epoch_permutation(100, seed=3, epoch=2))
    assert not torch.equal(perm, distributed.epoch_permutation(100, seed=3, epoch=1))
    lay = distributed.layout(24, world, max_dev)
    for b in range(100 // 24):
        got = [i for r in range(world) for mb in distributed.rank_micro_batches(perm, b, lay, r) for i in mb]
        assert got == perm[b * 24:(b + 1) * 24].tolist()


def test_accumulation_matches_one_big_batch(tmp_path):
    """max_device_batch < batch: the same weights as without accumulation (no BatchNorm)."""
    spec = toy_spec(**{"schedule.epochs": 3})
    full, _ = run_toy(tmp_path, spec, kappa=2, out="full")
    acc, ctx = run_toy(tmp_path, spec, kappa=2, out="acc", max_device_batch=5)
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "acc")
    assert max_diff(a["model"], b["model"]) < 1e-6
    assert max_diff(a["ema"]["module"], b["ema"]["module"]) < 1e-6
    assert a["clock"] == b["clock"]
    # 32 samples over micro-batches of ≤ 5: 7 micro-batches per step, recorded in hparams and the log
    import json

    hp = json.loads((tmp_path / "acc" / "hparams.json").read_text())
    assert hp["layout"][0]["accumulation"] == 7 and hp["layout"][0]["micro_batch"] == 5
    rows = [json.loads(x) for x in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    assert {r["accumulation"] for r in rows if r["kind"] == "train"} == {7}
    assert full["val_mse"] == pytest.approx(acc["val_mse"], rel=1e-4)


def test_two_gloo_processes_equal_one_process(tmp_path):
    spec = toy_spec(**{"schedule.epochs": 3})
    path = write_spec(tmp_path, spec, "two.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--kappa", "2", "--out", str(tmp_path / "two")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    run_toy(tmp_path, spec, kappa=2, out="one")
    two, one = load_checkpoint(tmp_path / "two"), load_checkpoint(tmp_path / "one")
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["clock"] == one["clock"]
    # equal up to the order of floating-point sums (gradients reduced across processes)
    assert max_diff(two["model"], one["model"]) < 1e-5
    assert max_diff(two["ema"]["module"], one["ema"]["module"]) < 1e-5
    moved = max_diff(two["model"], {k: torch.zeros_like(v) for k, v in two["model"].items()})
    assert moved > 1e-2  # the comparison is not between two untrained models


def test_resume_on_another_world_size_continues_the_same_trajectory(tmp_path):
    """Killed in one process, resumed in two: data order and views depend on (seed, epoch, index) only."""
    import signal
    import time

    from engine_util import cli

    # no dropout: in-model randomness is per rank and is re-seeded when the world size changes
    spec = toy_spec(**{"schedule.epochs": 4, "toy.checkpoint_every_epochs": 0.5, "toy.step_delay": 0.03})
    path = write_spec(tmp_path, spec, "ws.yaml")
    run_toy(tmp_path, spec, kappa=2, out="ref")
    proc = subprocess.Popen(cli("--spec", str(path), "--kappa", "2", "--out", str(tmp_path / "ws")), cwd=ROOT,
                            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not (tmp_path / "ws" / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint within the timeout"
        time.sleep(0.02)
    time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = load_checkpoint(tmp_path / "ws")
    assert not first["finished"] and first["world_size"] == 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--kappa", "2", "--out", str(tmp_path / "ws"), "--resume"]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    done, ref = load_checkpoint(tmp_path / "ws"), load_checkpoint(tmp_path / "ref")
    assert done["finished"] and done["world_size"] == 2 and done["clock"] == ref["clock"]
    assert max_diff(done["model"], ref["model"]) < 1e-5
    assert max_diff(done["ema"]["module"], ref["ema"]["module"]) < 1e-5
