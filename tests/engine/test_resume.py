"""Checkpoints: SIGKILL or SIGTERM then --resume ends bitwise equal to an uninterrupted run (CPU, 1 process)."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from emarule.errors import UserError
from emarule.errors import TrainingDiverged
from engine_util import ROOT, cli, env, load_checkpoint, run_toy, tensors_equal, toy_spec, write_spec

# 6 epochs of 8 steps, a checkpoint every 3 steps (so resuming mid-epoch is exercised), a
# teacher term so the EMA feeds back into the weights, Adam so optimizer state matters, dropout so
# the checkpointed RNG state matters.
SPEC = toy_spec(**{"schedule.epochs": 6, "toy.checkpoint_every_epochs": 0.375, "toy.step_delay": 0.02,
                   "optimizer.name": "adamw", "optimizer.lr": 0.01, "optimizer.betas": [0.9, 0.99],
                   "optimizer.eps": 1e-8, "ema.start_steps": 3, "toy.dropout": 0.2})


def start(tmp_path, name):
    path = write_spec(tmp_path, SPEC, f"{name}.yaml")
    return subprocess.Popen(cli("--spec", str(path), "--kappa", "1", "--out", str(tmp_path / name)), cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(proc, run_dir, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "checkpoint.pt").exists():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before its first checkpoint: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("no checkpoint within the timeout")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    run_toy(tmp, SPEC, out="ref")
    return load_checkpoint(tmp / "ref"), (tmp / "ref" / "metrics.jsonl").read_text().splitlines()


def assert_same_run(ck, ref_ck):
    assert ck["finished"] and ck["clock"] == ref_ck["clock"]
    assert tensors_equal(ck["model"], ref_ck["model"])
    assert tensors_equal(ck["emas"], ref_ck["emas"])
    assert tensors_equal(ck["optimizer"], ref_ck["optimizer"])


def train_rows(lines):
    return [json.loads(x) for x in lines if json.loads(x)["kind"] == "train"]


def resume_in_process(tmp_path, name):
    return run_toy(tmp_path, SPEC, out=name, resume=True)


def test_sigkill_then_resume_is_bitwise_uninterrupted(tmp_path, reference):
    ref_ck, ref_lines = reference
    proc = start(tmp_path, "killed")
    wait_for_checkpoint(proc, tmp_path / "killed")
    time.sleep(0.2)  # into the next half epoch: the kill lands between checkpoints
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed = load_checkpoint(tmp_path / "killed")
    assert not killed["finished"] and 0 < killed["clock"]["seen"] < ref_ck["clock"]["seen"]
    resume_in_process(tmp_path, "killed")
    assert_same_run(load_checkpoint(tmp_path / "killed"), ref_ck)
    # the log has each step once: the same rows as the uninterrupted run, no duplicates after resume
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    got = [r["samples_seen"] for r in train_rows(lines)]
    assert got == sorted(set(got)) == [r["samples_seen"] for r in train_rows(ref_lines)]
    evals = [json.loads(x) for x in lines if json.loads(x)["kind"] == "eval"]
    ref_evals = [json.loads(x) for x in ref_lines if json.loads(x)["kind"] == "eval"]
    assert evals == ref_evals


def test_sigterm_writes_a_checkpoint_and_resume_is_bitwise_uninterrupted(tmp_path, reference):
    ref_ck, _ = reference
    proc = start(tmp_path, "term")
    wait_for_checkpoint(proc, tmp_path / "term")
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "--resume" in err
    term = load_checkpoint(tmp_path / "term")
    assert not term["finished"]
    resume_in_process(tmp_path, "term")
    assert_same_run(load_checkpoint(tmp_path / "term"), ref_ck)


def test_ctrl_c_writes_a_checkpoint_says_how_to_resume_and_the_resumed_run_says_where(tmp_path, reference):
    ref_ck, _ = reference
    proc = start(tmp_path, "int")
    wait_for_checkpoint(proc, tmp_path / "int")
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "SIGINT: checkpoint written at" in err and "--resume --out" in err and "Traceback" not in err
    mid = load_checkpoint(tmp_path / "int")
    assert not mid["finished"]
    path = tmp_path / "int.yaml"
    r = subprocess.run(cli("--spec", str(path), "--kappa", "1", "--out", str(tmp_path / "int"), "--resume"), cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    step = mid["clock"]["step"]
    assert f"resuming {tmp_path / 'int'} at {mid['clock']['samples']} samples seen" in r.stderr
    assert f"step {step}" in r.stderr
    assert_same_run(load_checkpoint(tmp_path / "int"), ref_ck)


def test_resume_refuses_other_settings_and_fresh_runs_refuse_an_existing_dir(tmp_path):
    spec = toy_spec(**{"schedule.epochs": 1})
    run_toy(tmp_path, spec, out="r")
    with pytest.raises(UserError, match="already holds a run"):
        run_toy(tmp_path, spec, out="r")
    with pytest.raises(UserError, match=r"other settings \(kappa differ\)"):
        run_toy(tmp_path, spec, kappa=2, out="r", resume=True)
    with pytest.raises(UserError, match=r"\(kappa, spec.optimizer.lr differ\)"):
        run_toy(tmp_path, toy_spec(**{"schedule.epochs": 1, "optimizer.lr": 0.5}), kappa=2, out="r", resume=True)
    with pytest.raises(UserError, match="no checkpoint"):
        run_toy(tmp_path, spec, out="empty", resume=True)
    # resuming a finished run returns its final metrics without training again
    again, _ = run_toy(tmp_path, spec, out="r", resume=True)
    assert again["samples_seen"] == 128 and "val_mse" in again


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    from emarule.tasks import toy
    from engine_util import make_ctx

    torch.set_num_threads(1)
    ctx = make_ctx(tmp_path, toy_spec(**{"schedule.epochs": 4}), out="nan")
    ctx.checkpoint_every_epochs = 1
    parts = toy.make_parts(ctx)
    calls = {"n": 0}
    inner = parts.loss

    def loss(model, teacher, batch, now=None):
        calls["n"] += 1
        value, metrics = inner(model, teacher, batch, now)
        return (value * float("nan") if calls["n"] == 13 else value), metrics

    parts.loss = loss
    from emarule.engine.loop import train

    with pytest.raises(TrainingDiverged) as e:
        train(ctx, parts)
    msg = str(e.value)
    assert "\n" not in msg
    assert "192 samples seen" in msg and "checkpoint.pt (128 samples seen" in msg
    assert "train again with a new --out" in msg and "--resume" not in msg  # a resume keeps the settings that diverged
    ck = load_checkpoint(tmp_path / "nan")
    assert ck["clock"]["seen"] == 128 and not ck["finished"]
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    rows = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["samples_seen"] for r in rows) == 192


class Crash(Exception):
    pass


def test_crash_mid_epoch_then_resume_is_bitwise_uninterrupted(tmp_path, reference):
    """Deterministic twin of the SIGKILL test: the process dies at step 11, the last checkpoint is at
    step 9 (epoch 1, batch 1), so the resumed run re-enters an epoch part-way."""
    from engine_util import crash_toy

    ref_ck, _ = reference
    crash_toy(tmp_path, SPEC, "crash", checkpoint_every_epochs=0.375, at_call=11, error=Crash())
    want = {"seen": 144.0, "samples": 144, "step": 9, "epoch": 1, "pos": 16, "batch": 1, "skipped": 0}
    assert load_checkpoint(tmp_path / "crash")["clock"] == want
    resume_in_process(tmp_path, "crash")
    assert_same_run(load_checkpoint(tmp_path / "crash"), ref_ck)


def test_ctrl_c_in_a_sweep_says_to_run_the_sweep_again(tmp_path):
    """A sweep has no --resume: its hint is the same command, which keeps finished runs and resumes this one."""
    path = write_spec(tmp_path, SPEC, "sweep.yaml")
    cmd = [sys.executable, "-m", "emarule", "sweep", "--spec", str(path), "--kappas", "1",
           "--out", str(tmp_path / "sw")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(proc, tmp_path / "sw" / "toy" / "k1-rule-s0")
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "run the same command again: finished runs are kept and this one resumes" in err
    assert "--resume" not in err and "Traceback" not in err
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-2000:]
