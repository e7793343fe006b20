"""The CTC task (ctc-polyak, ctc-pseudo-label): tiny presets through the CLI, the pseudo-labeling phase and its
start rules, the full-size 36-layer model on a tiny LibriSpeech tree, and the one-line data errors."""

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from emarule.request import checks
from emarule.cli.main import app
from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.scaling import plan
from emarule.config.load import load_spec
from emarule.speech import pseudo_label
from emarule.speech.data import collate_train
from emarule.tasks import ctc
from emarule.engine.interface import Now
from engine_util import full_size_autocast
from speech_util import write_tree

runner = CliRunner()


def rows(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def run_cli(*args):
    torch.set_num_threads(1)
    res = runner.invoke(app, ["run", *args])
    assert res.exit_code == 0, res.output
    return res


def test_polyak_tiny_kappa2_logs_seconds_batches_wers_and_scaled_momenta(tmp_path):
    out = tmp_path / "k2"
    run_cli("ctc-polyak", "--preset", "tiny", "--kappa", "2", "--out", str(out))
    train, evals = rows(out, "train"), rows(out, "eval")
    assert all(r["batch_size"] == 16.0 for r in train)  # 2 × 8 s
    assert all(r["ema_momentum"] == pytest.approx(0.99995**2) for r in train)
    assert all(r["ema_momentum/0.9999"] == pytest.approx(0.9999**2) for r in train)
    assert all(math.isfinite(r["ctc_loss"]) and r["ctc_loss"] > 0 for r in train)
    last = evals[-1]
    for key in ("wer", "ema_wer", "ema_wer/0.9999", "ema_wer/0.999", "wer/test-clean", "ema_wer/test-clean"):
        assert 0.0 <= last[key] <= 400.0, key
    hp = json.loads((out / "hparams.json").read_text())
    assert hp["batch_unit"] == "seconds" and hp["task"]["labeled_utterances"] == 72


def test_pseudo_label_tiny_starts_on_time_and_logs_pl_wer(tmp_path):
    out = tmp_path / "pl"
    run_cli("ctc-pseudo-label", "--preset", "tiny", "--out", str(out))
    train, evals = rows(out, "train"), rows(out, "eval")
    base = lambda r: r["seconds_seen"] / 8.0  # noqa: E731 - base steps of 8 s
    assert all(r["phase"] == (1.0 if base(r) > 4.0 + 1.0 else r["phase"]) for r in train)
    first_pl = next(r for r in train if r["phase"] == 1.0)
    assert all(r["phase"] == 0.0 for r in train if r["step"] < first_pl["step"])
    assert all(r["unlabeled_share"] == 0.0 for r in train if r["phase"] == 0.0)
    shares = [r["unlabeled_share"] for r in train if r["phase"] == 1.0]
    assert 0.3 < sum(shares) / len(shares) < 0.95  # 1 : 3 labeled : unlabeled by duration
    assert all(r["ema_momentum"] == 0.0 for r in train if base(r) <= 3.0)  # the EMA copies until step 3
    pl_rows = [r for r in evals if "pl_wer" in r]
    assert pl_rows and all(base(r) >= 4.0 for r in pl_rows)  # pseudo-label quality once labeling starts
    assert any("wer" in r and "pl_wer" not in r for r in evals)
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["task_state"]["pseudo_labeling"] and ck["task_state"]["started_at"] >= 4.0
    # `sweep --metric` is checked against checks.TASK_METRICS before training: it must be what a run logs
    logged = {k for r in train + evals for k in r}
    assert {*checks.LOOP_METRICS, *checks.TASK_METRICS["ctc"]} <= logged


def test_pseudo_labels_replace_only_the_unlabeled_rows():
    targets = torch.tensor([5, 6, 7, 8, 9])  # rows: [5, 6], unlabeled, [7, 8, 9], unlabeled
    lengths = torch.tensor([2, 0, 3, 0])
    unlabeled = torch.tensor([False, True, False, True])
    t, n = ctc.with_pseudo_labels(targets, lengths, unlabeled, [[11], [12, 13, 14, 15]])
    assert t.tolist() == [5, 6, 11, 7, 8, 9, 12, 13, 14, 15] and n.tolist() == [2, 1, 3, 4]
    t, n = ctc.with_pseudo_labels(targets[:2], lengths[:2], unlabeled[:2], [[]])  # an empty transcript
    assert t.tolist() == [5, 6] and n.tolist() == [2, 0]


def test_phase_modes_threshold_and_resume_reapplies_dropout():
    steps = pseudo_label.Phase("steps", 20000, 1000, None)
    assert not steps.due(19999.5) and steps.due(20000)
    wer = pseudo_label.Phase("wer", 20000, 1000, threshold=30.0)
    wer.last_dev_wer = 35.0
    assert not wer.threshold_reached(25000) and not wer.due(25000)
    wer.last_dev_wer = 29.0
    assert wer.threshold_reached(25000) and wer.reason == "wer"
    capped = pseudo_label.Phase("wer", 20000, 1000, threshold=30.0, latest=30000)
    capped.last_dev_wer = 35.0  # never reached: the EMA starts 1k base steps before the latest start
    assert not capped.threshold_reached(28999) and capped.threshold_reached(29000)
    assert capped.reason == "latest_start_steps"
    wer.ema_started_at = 23000.0
    assert not wer.due(23999) and wer.due(24000)  # 1k base steps after the EMA's start, as in the baseline
    calls = []
    wer.on_start = lambda: calls.append(1)
    wer.start(24000)
    again = pseudo_label.Phase("wer", 20000, 1000, 30.0)
    again.on_start = lambda: calls.append(2)
    again.load_state_dict(wer.state_dict())
    assert again.pseudo_labeling and again.started_at == 24000 and calls == [1, 2]


def pl(**section):
    """The typed `pseudo_label` section of a ctc spec that gives `section`."""
    from emarule.config.typed import typed

    return typed({"task": "ctc", "pseudo_label": section}).pseudo_label


def test_choose_start_rule_and_baseline_threshold(tmp_path):
    base = tmp_path / "k1"
    base.mkdir()
    (base / "hparams.json").write_text(json.dumps({"kappa": 1.0, "spec": {"batch": {"size": 10.0}}}))
    evals = [{"kind": "eval", "seconds_seen": 10.0 * s, "wer": w} for s, w in ((10, 80.0), (20.3, 50.0), (30, 40.0))]
    (base / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in evals) + "\n")
    assert pseudo_label.baseline_wer(base, 20) == 50.0  # its WER at its own start (the step past base step 20)
    assert pseudo_label.choose(pl(), 2.0, None, base, 20) == ("steps", None, None)  # κ ≤ 2: steps
    assert pseudo_label.choose(pl(), 4.0, tmp_path / "k4", base, 20)[:2] == ("wer", 50.0)  # the sibling baseline
    assert pseudo_label.choose(pl(start_wer=12.5), 8.0, None, None, 20)[:2] == ("wer", 12.5)
    assert pseudo_label.choose(pl(start="steps"), 16.0, None, base, 20)[0] == "steps"
    assert pseudo_label.choose(pl(), 4.0, None, tmp_path / "nothing", 20)[0] == "steps"
    with pytest.raises(UserError, match="needs a threshold"):
        pseudo_label.choose(pl(start="wer"), 4.0, None, None, 20)
    with pytest.raises(UserError, match="no dev WER logged from base step 35 on"):
        pseudo_label.baseline_wer(base, 35)


def test_pseudo_label_kappa4_takes_the_threshold_from_the_baseline_beside_it(tmp_path):
    root = tmp_path / "ctc-pseudo-label"
    run_cli("ctc-pseudo-label", "--preset", "tiny", "--out", str(root / "tiny-k1-rule-s0"))
    res = run_cli("ctc-pseudo-label", "--preset", "tiny", "--kappa", "4", "--out", str(root / "tiny-k4-rule-s0"))
    assert "pseudo-labeling starts when the dev WER reaches" in res.output
    hp = json.loads((root / "tiny-k4-rule-s0" / "hparams.json").read_text())
    assert hp["task"]["pseudo_label_start"] == "wer" and hp["task"]["start_wer_threshold"] is not None


def test_librispeech_needs_data_and_names_missing_splits(tmp_path):
    res = runner.invoke(app, ["run", "ctc-polyak", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "pass --data ROOT" in res.output and "Traceback" not in res.output
    write_tree(tmp_path / "ls", "train-clean-100", {(1, 1): [(1.0, "A B")]})
    res = runner.invoke(app, ["run", "ctc-polyak", "--data", str(tmp_path / "ls"), "--out", str(tmp_path / "r2"),
                              "--set", "batch.size=1"])
    assert res.exit_code == 2 and "split 'dev-clean' not found" in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_full_size_model_trains_on_a_tiny_librispeech_tree(tmp_path):
    """The paper's 36-layer, 768-wide model (about 255M parameters) built by the task from real-layout FLAC
    files, a gradient step of its loss in bf16 autocast (fp32 where the CPU lacks native bf16), and a greedy
    decode. (Through the task's parts rather than `emarule run`, whose final checkpoint of this model and its
    EMA would be 4 GB.)"""
    torch.set_num_threads(2)
    data = tmp_path / "LibriSpeech"
    write_tree(data, "train-clean-100", {(19, 198): [(1.0, "HELLO WORLD"), (0.8, "IT'S A TEST")]})
    write_tree(data, "dev-clean", {(84, 121): [(0.6, "OK")]})
    spec = load_spec("ctc-polyak", overrides=["data.eval_splits=[dev-clean]"])
    ctx = RunContext(spec=spec, kappa=1.0, ema_rule="exponential", plan=plan(spec, 1.0), out=tmp_path / "unused",
                     data=tmp_path)
    parts = ctc.build(ctx)
    model = parts.model
    assert 250e6 < sum(p.numel() for p in model.parameters()) < 260e6
    assert len(model.layers) == 36 and model.layers[0].self_attn.num_heads == 4 and model.layer_drop == 0.3
    assert model.layers[0].linear1.out_features == 3072 and model.conv.stride == (3,)
    batch = collate_train([parts.train_set[i] for i in range(len(parts.train_set))])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)  # Adam's first step alone takes ~20 s for 255M weights
    now = Now(seen=0.0, samples=0, epoch=0.0, base_step=6000.0, step=0, kappa=1.0, plan=ctx.plan)  # SpecAugment on
    for _ in range(1):
        with full_size_autocast():
            loss, metrics = parts.loss(model, None, batch, now)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        assert math.isfinite(metrics["ctc_loss"]) and metrics["ctc_loss"] > 0
    model.eval()
    ev = parts.evaluations[0]
    with torch.no_grad():
        sums = ev.score(model, ev.collate([ev.data[0]]), now)
    assert sums["words"] == 1 and ev.finish(sums)["wer"] >= 0


def test_pseudo_label_run_stopped_after_the_start_resumes_exactly(tmp_path):
    """SIGTERM once pseudo-labeling is on, then --resume: the same weights, EMA and phase as a run never stopped."""
    import os
    import signal

    from emarule.engine.loop import train

    torch.set_num_threads(1)
    spec = load_spec("ctc-pseudo-label", preset="tiny")

    def context(name, resume=False):
        return RunContext(spec=spec, kappa=1.0, ema_rule="exponential", plan=plan(spec, 1.0), out=tmp_path / name,
                          quiet=True, resume=resume)

    train(context("whole"), ctc.build(context("whole")))
    parts = ctc.build(context("cut"))
    inner = parts.on_step

    def on_step(now, reduced):
        inner(now, reduced)
        if now.step == 7:
            assert parts.state.pseudo_labeling
            os.kill(os.getpid(), signal.SIGTERM)  # the loop checkpoints at the next step and exits

    parts.on_step = on_step
    with pytest.raises(SystemExit):
        train(context("cut"), parts)
    train(context("cut", resume=True), ctc.build(context("cut", resume=True)))
    a, b = (torch.load(tmp_path / n / "checkpoint.pt", weights_only=False) for n in ("whole", "cut"))
    assert a["clock"] == b["clock"] and a["task_state"] == b["task_state"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k in a["emas"]["ema"]["module"]:
        assert torch.equal(a["emas"]["ema"]["module"][k], b["emas"]["ema"]["module"][k]), k
