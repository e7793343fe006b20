"""Micro-batching (--max-device-batch) leaves a CTC step's gradient what the whole batch gives, in pseudo-labeling's
pre-training too, where an unlabeled slot is planned by its own seconds but trains on a labeled stand-in of
another length. The gradient is read where the engine clips it, after every micro-batch's backward."""

import json

import pytest
import torch

from cli_util import invoke
from emarule.engine import step
from emarule.speech import pseudo_label

# no randomness in the forward pass: the two runs differ only in how the batch is cut
EXACT = ["--preset", "tiny", "--set", "model.dropout=0", "--set", "model.layer_drop=0",
         "--set", "model.positional=sinusoidal", "--set", "schedule.total_steps=1"]


class LabelingFromTheStart(pseudo_label.Phase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pseudo_labeling, self.started_at = True, 0.0


def first_step(monkeypatch, out, experiment: str, *extra) -> tuple[torch.Tensor, dict]:
    """The first step's accumulated gradient, all parameters flattened, and its train row."""
    grads = []
    clip = step.clip_gradients

    def capture(params, aux_ids, max_norm):
        if not grads:
            grads.append(torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.detach().reshape(-1).clone()
                                    for p in params]))
        return clip(params, aux_ids, max_norm)

    monkeypatch.setattr(step, "clip_gradients", capture)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order for both runs
    try:
        res = invoke("run", experiment, *EXACT, "--out", out, *extra)
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return grads[0], next(r for r in rows if r["kind"] == "train" and r["step"] == 1)


@pytest.mark.parametrize("experiment, phase", [("ctc-polyak", None), ("ctc-pseudo-label", 0.0),
                                               ("ctc-pseudo-label", 1.0)])
def test_two_micro_batches_give_the_whole_batch_gradient(tmp_path, monkeypatch, experiment, phase):
    if phase == 1.0:
        monkeypatch.setattr(pseudo_label, "Phase", LabelingFromTheStart)
    whole, row = first_step(monkeypatch, tmp_path / "whole", experiment)
    split, split_row = first_step(monkeypatch, tmp_path / "split", experiment, "--max-device-batch", "4")
    assert (row["accumulation"], split_row["accumulation"]) == (1, 2)  # 8 s batches, 4 s per micro-batch
    assert row.get("phase") == split_row.get("phase") == phase
    assert phase != 1.0 or row["unlabeled_share"] > 0  # pseudo-labeled rows in the batch
    assert split_row["ctc_loss"] == pytest.approx(row["ctc_loss"], rel=1e-6)
    # Summing two halves reorders float sums differently on each CPU (up to 4e-6 on a 2-core Intel Xeon, on
    # gradients up to 13): the bound is relative to the gradient's scale, far below a mis-weighted micro-batch.
    scale = float(whole.abs().max())
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5 * scale)
    assert float((split - whole).norm()) <= 1e-5 * float(whole.norm())


def test_two_gloo_processes_give_pre_training_the_whole_batch_step(tmp_path):
    """Across ranks the weights are the stand-ins' seconds summed over every process (one all-reduce a step):
    pre-training's first step on two processes moves the model as one process does."""
    import subprocess
    import sys

    from engine_util import ROOT, env, load_checkpoint, max_diff

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "ctc-pseudo-label", *EXACT, "--out", str(tmp_path / "two")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = invoke("run", "ctc-pseudo-label", *EXACT, "--out", tmp_path / "one")
    assert res.exit_code == 0, res.output
    two, one = load_checkpoint(tmp_path / "two"), load_checkpoint(tmp_path / "one")
    assert two["clock"] == one["clock"] and two["task_state"] == one["task_state"]
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("two", "one")]
    step = [next(r for r in rs if r["kind"] == "train" and r["step"] == 1) for rs in rows]
    assert step[0]["phase"] == step[1]["phase"] == 0.0
    # the gradient before clipping: with the slots' planned seconds as weights its norm was 0.06 % off
    assert step[0]["grad_norm"] == pytest.approx(step[1]["grad_norm"], rel=1e-6)
    assert step[0]["ctc_loss"] == pytest.approx(step[1]["ctc_loss"], rel=1e-6)
    # Adam's first step divides each gradient by its own size, so summation order shows in the weights
    assert max_diff(two["model"], one["model"]) < 1e-4
