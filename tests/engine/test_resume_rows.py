"""--resume writes the log an uninterrupted run writes, row for row, when the checkpoint falls between two logged
train rows (an epoch of more than 50 steps, so rows average a window of steps, and a checkpoint mid-epoch)."""

import os
import signal

import pytest
import torch

from emarule.engine import loop
from engine_util import crash_toy, load_checkpoint, rows_without_wall_clock, run_toy, toy_spec

# 408 samples at B = 4: 102 steps an epoch, a train row every ceil(102 / 50) = 3 steps (steps 1, 3, 6, 9, ...
# of each epoch, and its last), each the mean of the steps since the row before. AdamW and dropout, so the
# optimizer state and the RNG states matter too.
OVERRIDES = {"batch.size": 4, "schedule.epochs": 2, "toy.samples": 408, "optimizer.name": "adamw",
             "optimizer.lr": 0.01, "optimizer.betas": [0.9, 0.99], "optimizer.eps": 1e-8, "ema.start_steps": 3,
             "toy.dropout": 0.2}
SPEC = toy_spec(**OVERRIDES)
# Progressive Scaling at κ = 2 from base step 50: steps 1-50 at B = 4, then B = 8 from batch 50 of epoch 0 on (a
# new segment of 26 more batches, whose first step logs a row of its own).
PROGRESSIVE = toy_spec(**OVERRIDES, progressive={"kind": "step", "base_step": 50})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    run_toy(tmp, SPEC, out="ref")
    run_toy(tmp, PROGRESSIVE, kappa=2.0, out="prog")
    return {"ref": rows_without_wall_clock(tmp / "ref"), "prog": rows_without_wall_clock(tmp / "prog")}


def interrupt_after(monkeypatch, step):
    """SIGINT once step `step` is counted: the loop sees it at the next step, checkpoints there and exits 130."""
    inner = loop.advance_clock

    def advance_clock(run, count, seen_after):
        i = inner(run, count, seen_after)
        if run.clock.step == step:
            os.kill(os.getpid(), signal.SIGINT)
        return i

    monkeypatch.setattr(loop, "advance_clock", advance_clock)


def interrupted_then_resumed(tmp_path, monkeypatch, spec, kappa, checkpoint_step):
    with monkeypatch.context() as m:
        interrupt_after(m, checkpoint_step - 1)
        with pytest.raises(SystemExit) as e:
            run_toy(tmp_path, spec, kappa=kappa, out="int")
    assert e.value.code == 130
    clock = load_checkpoint(tmp_path / "int")["clock"]
    assert clock["step"] == checkpoint_step and clock["batch"] == checkpoint_step  # mid-epoch 0
    run_toy(tmp_path, spec, kappa=kappa, out="int", resume=True)
    return rows_without_wall_clock(tmp_path / "int")


@pytest.mark.parametrize("checkpoint_step,case", [
    (51, "right after a row: the window is empty, the next step is no row"),
    (52, "between rows: the window holds step 52, step 53 is no row"),
    (53, "the step just before a row: the window holds steps 52-53, step 54 is a row"),
])
def test_a_checkpoint_between_rows_resumes_to_the_uninterrupted_log(tmp_path, monkeypatch, uninterrupted,
                                                                    checkpoint_step, case):
    ref = uninterrupted["ref"]
    assert [r["step"] for r in ref if r["kind"] == "train"][:5] == [1, 3, 6, 9, 12]  # the windowed cadence
    assert interrupted_then_resumed(tmp_path, monkeypatch, SPEC, 1.0, checkpoint_step) == ref, case


def test_a_periodic_checkpoint_between_rows_then_a_crash_resumes_to_the_uninterrupted_log(tmp_path, uninterrupted):
    """The SIGKILL case: the last checkpoint is a periodic one (every 0.5 epoch: step 51, batch 51), written
    between two rows, and the run dies later; the resumed run rewrites the rows after it exactly."""
    crash_toy(tmp_path, SPEC, "crash", checkpoint_every_epochs=0.5, at_call=80, error=RuntimeError("killed"))
    assert load_checkpoint(tmp_path / "crash")["clock"]["step"] == 51
    run_toy(tmp_path, SPEC, out="crash", resume=True)
    assert rows_without_wall_clock(tmp_path / "crash") == uninterrupted["ref"]


def test_a_checkpoint_at_a_stage_change_still_logs_the_new_stages_first_step(tmp_path, monkeypatch, uninterrupted):
    """The checkpoint falls on the last step at κ = 1 (step 50, between rows): the resumed run's first step is the
    first of the κ = 2 stage, a row in the uninterrupted run, and a row after --resume too."""
    ref = uninterrupted["prog"]
    assert [(r["step"], r["kappa"]) for r in ref if r["kind"] == "train" and 48 <= r["step"] <= 52] == \
        [(48, 1.0), (51, 2.0), (52, 2.0)]
    assert interrupted_then_resumed(tmp_path, monkeypatch, PROGRESSIVE, 2.0, 50) == ref


def test_a_checkpoint_without_the_window_resumes_as_before(tmp_path, monkeypatch, uninterrupted):
    """A checkpoint written before checkpoints kept the window of the next row (here at step 52, between rows)
    still resumes as it did: the resumed run's first step, 53, is a row of its own, and the row at step 54
    averages step 54 alone; every other row is the uninterrupted run's."""
    with monkeypatch.context() as m:
        interrupt_after(m, 51)
        with pytest.raises(SystemExit):
            run_toy(tmp_path, SPEC, out="old")
    ck = load_checkpoint(tmp_path / "old")
    assert ck["clock"]["step"] == 52
    ck.pop("window", None)  # what a checkpoint of an earlier version holds
    torch.save(ck, tmp_path / "old" / "checkpoint.pt")
    run_toy(tmp_path, SPEC, out="old", resume=True)
    ref, got = uninterrupted["ref"], rows_without_wall_clock(tmp_path / "old")
    train = [r for r in got if r["kind"] == "train"]
    assert [r["step"] for r in train if 51 <= r["step"] <= 57] == [51, 53, 54, 57]

    def at(rows, step):
        return next(r for r in rows if r["kind"] == "train" and r["step"] == step)

    assert [r for r in got if r["step"] not in (53, 54)] == [r for r in ref if r["step"] != 54]
    averaged = {k for k in at(ref, 54) if at(ref, 54)[k] != at(got, 54)[k]}
    assert "loss" in averaged and averaged <= {"loss", "grad_norm", *at(ref, 54)} - {
        "kind", "samples_seen", "epoch", "step", "kappa", "batch_size", "accumulation", "lr", "ema_momentum"}
