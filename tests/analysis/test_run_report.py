"""`emarule.analysis.run_report`: the figures and the end-of-run summary, from a run directory alone."""

import json
import subprocess
import sys

from emarule.analysis import run_report as R


def write_run(root, rows, hparams=None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "hparams.json").write_text(json.dumps(hparams or {"kappa": 2, "ema_rule": True,
                                                              "ema_rule_form": "exponential", "seed": 1}))
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def rows():
    out = []
    for e in range(1, 5):
        out.append({"kind": "train", "epoch": e - 0.5, "step": 2 * e - 1, "samples_seen": (e - 0.5) * 10,
                    "kappa": 1 if e < 3 else 2, "lr": 0.1 * e, "ema_momentum": 0.9, "ema_momentum/0.9999": 0.99,
                    "loss": 2.0 / e, "ctc_loss": 1.0 / e, "grad_norm": 1.0, "wall_s": e})
        out.append({"kind": "eval", "epoch": float(e), "step": 2 * e, "samples_seen": e * 10, "kappa": 1,
                    "wer": 50.0 / e, "ema_wer": 40.0 / e, "ema_wer/0.9999": 45.0 / e,
                    "wer/test-clean": 60.0 / e, "ema_wer/test-clean": 55.0 / e,
                    "ema_wer/test-clean/0.9999": 58.0 / e, "probe_top1": "nan" if e == 4 else 10.0 * e})
    return out


def test_figures_and_summary_group_the_target_and_every_ema(tmp_path):
    run = write_run(tmp_path / "tiny-k2-rule-s1", rows())
    rep = R.report(run, wall_s=12.34)
    assert [p.name for p in rep.figures] == ["loss.png", "eval.png", "schedules.png"]
    for p in rep.figures:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (run / "figures").iterdir()) == ["eval.png", "loss.png", "schedules.png"]
    assert rep.final == {
        "target": {"loss": 0.5, "ctc_loss": 0.25, "wer": 12.5, "wer/test-clean": 15.0},
        "EMA": {"ema_wer": 10.0, "ema_wer/test-clean": 13.75, "probe_top1": 30.0},
        "EMA 0.9999": {"ema_wer/0.9999": 11.25, "ema_wer/test-clean/0.9999": 14.5},
    }
    text = rep.text()
    assert text.splitlines()[0] == (f"run finished: {run} (κ=2, with EMA rule, seed 1, epoch 4, step 8, "
                                    f"40 samples seen)")
    assert "wall time: 12.3 s" in text and f"figures: {run / 'figures' / 'loss.png'}" in text
    assert "EMA 0.9999: ema_wer/0.9999 11.25" in text
    # probe_top1 logged "nan" at epoch 4: its 30 is epoch 3's, not the headline's epoch 4
    assert rep.stale == {"probe_top1": "epoch 3; nan from epoch 4"}
    assert "probe_top1 30 (epoch 3; nan from epoch 4)" in text


def test_the_tracking_probe_is_the_emas(tmp_path):
    """BYOL and DINO's probe reads the EMA teacher: probe_loss and probe_top1 are listed with the
    EMA, never as the target's (the online network or student) — with and without further EMAs."""
    assert R.owner("probe_top1", []) == R.owner("probe_loss", ["0.9999"]) == "EMA"
    assert R.owner("probe_train_top1", []) == "EMA" and R.owner("loss", []) == "target"
    byol = [{"kind": "train", "epoch": 0.5, "step": 1, "loss": 3.0, "byol_loss": 0.6, "probe_loss": 2.4,
             "probe_train_top1": 20.0, "ema_momentum": 0.99},
            {"kind": "eval", "epoch": 1.0, "step": 2, "probe_top1": 11.0}]
    rep = R.report(write_run(tmp_path / "byol", byol), figures=False)
    assert rep.final == {"target": {"loss": 3.0, "byol_loss": 0.6}, "EMA": {"probe_loss": 2.4, "probe_top1": 11.0}}
    lines = rep.text().splitlines()
    assert lines[1].split() == ["target:", "loss", "3,", "byol_loss", "0.6"]
    assert lines[2].split() == ["EMA:", "probe_loss", "2.4,", "probe_top1", "11"]


def test_panels_pair_each_metric_with_its_emas():
    panels = dict(R.eval_panels([r for r in rows() if r["kind"] == "eval"]))
    assert [line[0] for line in panels["wer"]] == ["wer", "wer/test-clean", "ema_wer", "ema_wer/0.9999",
                                                  "ema_wer/test-clean", "ema_wer/test-clean/0.9999"]
    sched = dict(R.schedule_panels([r for r in rows() if r["kind"] == "train"]))
    assert [line[0] for line in sched["EMA momentum ρ̂"]] == ["ema_momentum", "ema_momentum/0.9999"]
    assert "κ" in sched  # Progressive Scaling changed it
    assert [name for name, _ in R.loss_panels([r for r in rows() if r["kind"] == "train"])] == ["loss", "ctc_loss"]


def test_a_study_without_metrics_has_no_report(tmp_path):
    assert R.report(tmp_path) is None
    R.print_report(None, None)  # nothing to print, no console needed


def test_no_torch(tmp_path):
    run = write_run(tmp_path / "r", rows())
    code = ("import sys; sys.modules['torch'] = None\n"
            f"from emarule.analysis.run_report import report\nprint(report({str(run)!r}).text())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "run finished" in p.stdout, p.stderr


def test_the_summary_says_how_long_training_waited_for_batches(tmp_path):
    """The last train row's data_wait_s against its wall_s; on a GPU, a loader-bound loop of a minute or more
    gets a hint."""
    train = [{"kind": "train", "epoch": e, "step": e, "loss": 1.0, "wall_s": 50.0 * e, "data_wait_s": 15.0 * e}
             for e in (1, 2)]
    cpu = {"kappa": 1, "seed": 0, "device": "cpu", "num_workers": 0}
    text = R.report(write_run(tmp_path / "cpu", train, cpu), figures=False).text()
    assert "  waiting for training batches: 30.0 s of the loop's 100.0 s (30 %)\n" in text + "\n"
    assert "--num-workers" not in text  # on the CPU workers would share the cores the steps use
    gpu = cpu | {"device": "cuda:0", "num_workers": 8}
    text = R.report(write_run(tmp_path / "gpu", train, gpu), figures=False).text()
    assert "(30 %); the DataLoader held the GPU back: more workers may help (--num-workers; this run had 8)" in text
    fast = [r | {"data_wait_s": 1.0 * r["epoch"]} for r in train]
    text = R.report(write_run(tmp_path / "fast", fast, gpu), figures=False).text()
    assert "(2 %)" in text and "--num-workers" not in text
    short = [r | {"wall_s": r["wall_s"] / 10, "data_wait_s": r["data_wait_s"] / 10} for r in train]
    text = R.report(write_run(tmp_path / "short", short, gpu), figures=False).text()
    assert "3.0 s of the loop's 10.0 s (30 %)" in text and "--num-workers" not in text  # mostly workers' start
    assert "waiting for" not in R.report(write_run(tmp_path / "old", rows()), figures=False).text()


def test_a_final_from_an_earlier_epoch_says_which(tmp_path):
    """A metric the last evaluations no longer log (a split evaluated less often, a probe that stopped) is
    shown with the epoch of its value, not under the headline's later epoch as if it were current."""
    evals = [{"kind": "eval", "epoch": 1.0, "step": 1, "top1": 10.0, "top1/test": 9.0},
             {"kind": "eval", "epoch": 2.0, "step": 2, "top1": 20.0}]
    rep = R.report(write_run(tmp_path / "r", evals), figures=False)
    assert rep.final == {"target": {"top1": 20.0, "top1/test": 9.0}} and rep.stale == {"top1/test": "epoch 1"}
    assert "top1 20, top1/test 9 (epoch 1)" in rep.text()


def test_a_run_batched_in_seconds_of_audio_says_its_seconds_too():
    h = {"kappa": 2.0, "ema_rule": True, "ema_rule_form": "exponential", "seed": 0}
    line = R._headline(h, {"epoch": 1, "step": 7, "samples_seen": 171, "seconds_seen": 176.62})
    assert line.endswith("epoch 1, step 7, 171 samples (176.6 s of audio) seen")
    assert R._headline(h, {"epoch": 1, "step": 7, "samples_seen": 40}).endswith("step 7, 40 samples seen")
