"""What the engine gives the later families: batches in seconds, task state, several EMAs, named evaluations.

Batches measured in seconds keep every guarantee batches in samples have: the same step however a
global batch is cut into micro-batches, one process equal to two when the parts are the same, and a
SIGKILL followed by --resume bitwise equal to a run never interrupted, with the task's state
(a center moved once per optimizer step) and two EMAs in the checkpoint.
"""

import json
import signal
import subprocess
import sys

import pytest
import torch

from emarule.engine import batching
from emarule.engine.evaluation import metric_name
from emarule.tasks.toy import duration_of
from engine_util import ROOT, cli, env, load_checkpoint, max_diff, run_toy, tensors_equal, toy_spec, write_spec
from test_resume import wait_for_checkpoint

# 128 items of 0.5–2.75 s (208 s an epoch) in batches of 24 s of audio, padding counted; a center
# (task state, once per step from the global batch) and a second EMA.
SECONDS = toy_spec(**{"batch": {"size": 24.0, "unit": "seconds", "sort_window": 32}, "toy.seconds": True,
                      "toy.center_momentum": 0.8, "ema.also": [0.5], "schedule.epochs": 3})


def rows(run_dir, kind):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# --- the batcher --------------------------------------------------------------------------------


def test_seconds_batches_count_padding_and_fill_the_budget():
    d = [duration_of(i) for i in range(128)]
    b = batching.Batcher(128, seed=1, durations=d, sort_window=32)
    order = b.order(0)
    assert sorted(order) == list(range(128)) and order == batching.Batcher(128, 1, d, 32).order(0)
    for s in range(0, 128, 32):  # sorted by duration within each window of the permutation
        window = [d[i] for i in order[s:s + 32]]
        assert window == sorted(window)
    pos, batches = 0, []
    while (got := b.take(0, pos, 24.0)) is not None:
        items, measure = got
        assert items == order[pos:pos + len(items)]
        assert len(items) * max(d[i] for i in items) <= 24.0  # padded cost within the budget
        nxt = order[pos + len(items)]
        assert (len(items) + 1) * max(d[i] for i in items + [nxt]) > 24.0  # and nothing more fits
        assert measure == pytest.approx(sum(d[i] for i in items))
        batches.append(items)
        pos += len(items)
    assert pos < 128 and b.take(0, pos, 24.0) is None  # the remainder is dropped


@pytest.mark.parametrize("world,acc", [(1, 1), (1, 3), (2, 1), (2, 2)])
def test_seconds_parts_are_contiguous_and_balanced_by_seconds(world, acc):
    d = [duration_of(i) for i in range(64)]
    b = batching.Batcher(64, seed=0, durations=d, sort_window=64)
    items, measure = b.take(0, 0, 40.0)
    lay = batching.layout(40.0, world, 40.0 / world / acc, "seconds")
    assert lay.accumulation == acc
    parts = b.parts(items, lay)
    assert len(parts) == world * acc and [i for p in parts for i in p] == items
    shares = [sum(d[i] for i in p) for p in parts]
    assert max(shares) - min(shares) <= max(d) + 1e-9  # balanced to within one utterance


def test_metric_names_follow_the_ema_prefix_convention():
    assert metric_name("top1", None) == "top1"
    assert metric_name("top1", "ema") == "ema_top1"
    assert metric_name("wer", "0.9999") == "ema_wer/0.9999"
    assert metric_name("wer", None, "test-clean") == "wer/test-clean"
    assert metric_name("wer", "0.9999", "test-clean") == "ema_wer/0.9999/test-clean"


# --- runs in seconds --------------------------------------------------------------------------


def test_seconds_run_logs_seconds_two_emas_and_a_center_moved_once_per_step(tmp_path):
    final, ctx = run_toy(tmp_path, SECONDS, kappa=2)
    train = rows(ctx.out, "train")
    assert {r["batch_size"] for r in train} == {48.0}  # κB seconds
    assert all(r["seconds_seen"] > 0 and "samples_seen" in r for r in train)
    assert [r["epoch"] for r in rows(ctx.out, "eval")] == [1.0, 2.0, 3.0]
    assert final["seconds_seen"] == pytest.approx(3 * sum(duration_of(i) for i in range(128)))
    assert train[-1]["ema_momentum"] == pytest.approx(0.9**2) and train[-1]["ema_momentum/0.5"] == pytest.approx(0.25)
    assert {"val_mse", "ema_val_mse", "ema_val_mse/0.5"} <= set(rows(ctx.out, "eval")[-1])
    ck = load_checkpoint(ctx.out)
    assert set(ck["emas"]) == {"ema", "0.5"}
    assert ck["task_state"]["updates"] == ck["clock"]["step"] > 0  # once per optimizer step
    assert ck["task_state"]["value"].abs().sum() > 0
    hp = json.loads((ctx.out / "hparams.json").read_text())
    assert hp["batch_unit"] == "seconds" and hp["emas"] == ["ema", "0.5"]


def test_seconds_micro_batching_does_not_change_the_step_or_the_center(tmp_path):
    one, _ = run_toy(tmp_path, SECONDS, kappa=2, out="one")
    acc, _ = run_toy(tmp_path, SECONDS, kappa=2, out="acc", max_device_batch=10.0)
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "acc")
    hp = json.loads((tmp_path / "acc" / "hparams.json").read_text())
    assert hp["layout"][0]["accumulation"] == 5
    assert a["clock"] == b["clock"]
    assert max_diff(a["model"], b["model"]) < 1e-6
    for name in ("ema", "0.5"):
        assert max_diff(a["emas"][name]["module"], b["emas"][name]["module"]) < 1e-6
    assert torch.allclose(a["task_state"]["value"], b["task_state"]["value"], atol=1e-6)


def test_seconds_two_gloo_processes_equal_one_process_with_the_same_parts(tmp_path):
    path = write_spec(tmp_path, SECONDS, "two.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--kappa", "2", "--out", str(tmp_path / "two")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    # one process cutting each 48 s batch into the same two parts: micro-batches of at most 24 s
    run_toy(tmp_path, SECONDS, kappa=2, out="one", max_device_batch=24.0)
    two, one = load_checkpoint(tmp_path / "two"), load_checkpoint(tmp_path / "one")
    assert two["clock"] == one["clock"]
    assert max_diff(two["model"], one["model"]) < 1e-5
    assert max_diff(two["emas"]["ema"]["module"], one["emas"]["ema"]["module"]) < 1e-5
    assert torch.allclose(two["task_state"]["value"], one["task_state"]["value"], atol=1e-5)
    assert rows(tmp_path / "two", "eval")[-1]["val_mse"] == pytest.approx(rows(tmp_path / "one", "eval")[-1]["val_mse"],
                                                                           rel=1e-4)


def test_seconds_a_rank_without_an_item_still_joins_the_step(tmp_path):
    """3 s batches hold one to three utterances: some steps give one of two ranks nothing to compute.
    That rank still contributes zeros to the one reduction (it used to send a shorter vector and abort)."""
    spec = {**SECONDS, "batch": {**SECONDS["batch"], "size": 3.0}, "toy": {**SECONDS["toy"], "samples": 32},
            "schedule": {**SECONDS["schedule"], "epochs": 1}}
    from emarule.engine import batching
    from emarule.tasks.toy import duration_of

    batcher = batching.Batcher(32, 0, [duration_of(i) for i in range(32)], 32)
    lay, pos, idle = batching.layout(3.0, 2, None, "seconds"), 0, 0
    while (got := batcher.take(0, pos, 3.0)) is not None:
        idle += any(not p for p in batcher.parts(got[0], lay))
        pos += len(got[0])
    assert idle > 0  # the case under test happens
    path = write_spec(tmp_path, spec, "idle.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--out", str(tmp_path / "two")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    run_toy(tmp_path, spec, out="one", max_device_batch=1.5)
    two, one = load_checkpoint(tmp_path / "two"), load_checkpoint(tmp_path / "one")
    assert two["clock"] == one["clock"]
    assert max_diff(two["model"], one["model"]) < 1e-5
    assert torch.allclose(two["task_state"]["value"], one["task_state"]["value"], atol=1e-5)


def test_seconds_sigkill_then_resume_is_bitwise_uninterrupted_with_state_and_two_emas(tmp_path):
    spec = {**SECONDS, "toy": {**SECONDS["toy"], "checkpoint_every_epochs": 0.4, "step_delay": 0.03,
                               "dropout": 0.2}, "schedule": {**SECONDS["schedule"], "epochs": 4}}
    run_toy(tmp_path, spec, out="ref")
    path = write_spec(tmp_path, spec, "killed.yaml")
    proc = subprocess.Popen(cli("--spec", str(path), "--kappa", "1", "--out", str(tmp_path / "killed")), cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(proc, tmp_path / "killed")
    import time

    time.sleep(0.25)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    mid = load_checkpoint(tmp_path / "killed")
    ref = load_checkpoint(tmp_path / "ref")
    assert not mid["finished"] and 0 < mid["clock"]["seen"] < ref["clock"]["seen"]
    run_toy(tmp_path, spec, out="killed", resume=True)
    done = load_checkpoint(tmp_path / "killed")
    assert done["finished"] and done["clock"] == ref["clock"]
    for key in ("model", "emas", "optimizer", "task_state"):
        assert tensors_equal(done[key], ref[key]), key
    got = [r["seconds_seen"] for r in rows(tmp_path / "killed", "train")]
    assert got == sorted(set(got)) == [r["seconds_seen"] for r in rows(tmp_path / "ref", "train")]


# --- Progressive Scaling in base steps; evaluation cadence in base steps ----------------------


def test_progressive_step_given_in_base_steps_switches_mid_epoch(tmp_path):
    """8 → 16 samples... as the speech recipe's κ=8 → 16 at 29k reference steps: here κ 2 → 4 at
    base step 12 (192 samples seen, 1.5 epochs of 128): a transition inside an epoch."""
    spec = toy_spec(**{"schedule.epochs": 4})
    prog = {"kind": "step", "base_step": 12, "from_kappa": 2}
    _, ctx = run_toy(tmp_path, spec, kappa=4, progressive=prog)
    train = rows(ctx.out, "train")
    assert [(r["samples_seen"], r["batch_size"]) for r in train][:8] == [
        (32, 32), (64, 32), (96, 32), (128, 32), (160, 32), (192, 32), (256, 64), (320, 64)]
    assert {r["kappa"] for r in train if r["samples_seen"] <= 192} == {2.0}
    assert {r["kappa"] for r in train if r["samples_seen"] > 192} == {4.0}
    assert train[-1]["ema_momentum"] == pytest.approx(0.9**4) and train[0]["ema_momentum"] == pytest.approx(0.9**2)
    hp = json.loads((ctx.out / "hparams.json").read_text())
    assert [(s["start_epoch"], s["kappa"], s["axis"]) for s in hp["layout"]] == [(0.0, 2.0, "base_steps"),
                                                                                  (12.0, 4.0, "base_steps")]


def test_evaluation_cadence_in_base_steps(tmp_path):
    spec = toy_spec(**{"schedule.epochs": 2, "eval": {"every_base_steps": 4}})  # 64 samples seen
    _, ctx = run_toy(tmp_path, spec, kappa=2)
    assert [r["samples_seen"] for r in rows(ctx.out, "eval")] == [64, 128, 192, 256]


def test_a_batch_larger_than_the_training_set_fails_before_anything_is_written(tmp_path):
    from emarule.errors import UserError

    with pytest.raises(UserError, match="larger than the training set"):
        run_toy(tmp_path, toy_spec(**{"toy.samples": 20}), kappa=2, out="big")
    assert not (tmp_path / "big").exists()
