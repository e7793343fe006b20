"""Batch layout and data order independent of world size; 2 processes (gloo) = 1 process; accumulation."""

import subprocess
import sys

import pytest
import torch

from emarule.engine import batching
from emarule.errors import UserError
from engine_util import ROOT, env, load_checkpoint, max_diff, run_toy, toy_spec, write_spec


def test_layout_accumulates_to_fit_max_device_batch():
    lay = batching.layout(64, 2, 10)
    assert (lay.per_rank, lay.accumulation) == (32, 4)
    assert lay.micro_sizes == [8, 8, 8, 8] and lay.max_micro <= 10
    lay = batching.layout(30, 1, 7)
    assert sum(lay.micro_sizes) == 30 and max(lay.micro_sizes) <= 7 and lay.accumulation == 5
    assert batching.layout(32, 4, None).accumulation == 1
    lay = batching.layout(100.0, 2, 20, unit="seconds")  # 50 s per rank in micro-batches of ≤ 20 s
    assert lay.accumulation == 3 and lay.max_micro == pytest.approx(50 / 3)


def test_layout_errors_name_the_fix():
    with pytest.raises(UserError, match="does not split over 3 processes"):
        batching.layout(64, 3, None)
    with pytest.raises(UserError, match="not a whole number"):
        batching.layout(16 * 1.5 + 0.5, 1, None)


@pytest.mark.parametrize("world,max_dev", [(1, None), (1, 3), (2, None), (2, 5), (4, 2)])
def test_global_batches_are_the_same_samples_in_the_same_order(world, max_dev):
    b = batching.Batcher(100, seed=3)
    order = b.order(2)
    assert order == batching.Batcher(100, seed=3).order(2) and order != b.order(1)
    order = b.order(2)
    lay = batching.layout(24, world, max_dev)
    for k in range(100 // 24):
        items, measure = b.take(2, k * 24, 24)
        assert items == order[k * 24:(k + 1) * 24] and measure == 24
        assert [i for part in b.parts(items, lay) for i in part] == items
        assert len(b.parts(items, lay)) == world * lay.accumulation
    assert b.take(2, 96, 24) is None  # the remainder of 4 is dropped


def world_of(run_dir) -> int:
    import json

    return json.loads((run_dir / "hparams.json").read_text())["world_size"]


def test_accumulation_matches_one_big_batch(tmp_path):
    """max_device_batch < batch: the same weights as without accumulation (no BatchNorm)."""
    spec = toy_spec(**{"schedule.epochs": 3})
    full, _ = run_toy(tmp_path, spec, kappa=2, out="full")
    acc, ctx = run_toy(tmp_path, spec, kappa=2, out="acc", max_device_batch=5)
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "acc")
    assert max_diff(a["model"], b["model"]) < 1e-6
    assert max_diff(a["emas"]["ema"]["module"], b["emas"]["ema"]["module"]) < 1e-6
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
    assert world_of(tmp_path / "two") == 2 and world_of(tmp_path / "one") == 1
    assert two["clock"] == one["clock"]
    # equal up to the order of floating-point sums (gradients reduced across processes)
    assert max_diff(two["model"], one["model"]) < 1e-5
    assert max_diff(two["emas"]["ema"]["module"], one["emas"]["ema"]["module"]) < 1e-5
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
    assert not first["finished"] and world_of(tmp_path / "ws") == 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--kappa", "2", "--out", str(tmp_path / "ws"), "--resume"]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    done, ref = load_checkpoint(tmp_path / "ws"), load_checkpoint(tmp_path / "ref")
    assert done["finished"] and world_of(tmp_path / "ws") == 2 and done["clock"] == ref["clock"]
    assert max_diff(done["model"], ref["model"]) < 1e-5
    assert max_diff(done["emas"]["ema"]["module"], ref["emas"]["ema"]["module"]) < 1e-5


def test_a_sweep_under_torchrun_trains_run_after_run_in_one_process_group(tmp_path):
    """The process group outlives each run: joining the launcher's store again could wait forever."""
    spec = toy_spec(**{"schedule.epochs": 1})
    path = write_spec(tmp_path, spec, "sweep.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "sweep", "--spec", str(path), "--kappas", "1,2", "--seeds", "1",
           "--out", str(tmp_path / "sw")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "sw").glob("*/*") if (p / "hparams.json").exists())
    assert len(runs) == 3, runs
    for run in runs:
        assert world_of(run) == 2 and load_checkpoint(run)["finished"]


def test_more_processes_on_a_node_than_gpus_is_one_line_before_the_group(monkeypatch):
    """Two ranks on one GPU: nccl would fail only at the first collective, with a long trace."""
    from emarule.engine import distributed as D

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail("a device was chosen"))
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "EMARULE_DEVICE": "auto"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(D, "_STATE", None)
    with pytest.raises(UserError, match=r"started 2 processes on this node, which has 1 GPU\(s\); use "
                                        r"--nproc-per-node 1, or CUDA_VISIBLE_DEVICES= to train on the CPU"):
        D.setup()
    assert D._STATE is None


def test_emarule_device_chooses_the_device_and_names_a_bad_value(monkeypatch):
    from emarule.engine import distributed as D

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for asked, got in (("", "cuda"), ("auto", "cuda"), ("CUDA", "cuda"), ("cpu", "cpu")):
        monkeypatch.setenv("EMARULE_DEVICE", asked)
        assert D.device_type() == got
    monkeypatch.setenv("EMARULE_DEVICE", "gpu")
    with pytest.raises(UserError, match="EMARULE_DEVICE='gpu': use auto, cpu or cuda"):
        D.device_type()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("EMARULE_DEVICE", "cuda")
    with pytest.raises(UserError, match="sees no CUDA GPU; unset it to train on the CPU"):
        D.device_type()
    monkeypatch.setenv("EMARULE_DEVICE", "auto")
    assert D.device_type() == "cpu"
