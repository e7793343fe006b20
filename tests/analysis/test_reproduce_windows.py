"""Which part of a run a claim reads, and which runs count as stopped early: a claim's statistic does not
depend on which other settings were run, and a run that finished is never scored as one that stopped."""

import dataclasses
import json
import math

import pytest
from test_reproduce import T, write_offline_probe, write_run

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import paired as P
from emarule.analysis.reproduce import rules as R


STEP = [{"start_epoch": 0.0, "end_epoch": 5.0, "kappa": 1.0}, {"start_epoch": 5.0, "end_epoch": 10.0, "kappa": 4.0}]
CONSTANT = [{"start_epoch": 0.0, "end_epoch": 10.0, "kappa": 4.0}]


def byol_vit_runs(root):
    """Seeds 0–4: baselines, the standard κ=4 settings under a step at epoch 5, and the two constant arms."""
    standard, arms = [], []
    for s, o in enumerate((-0.3, 0.0, 0.3, 0.1, -0.2)):
        def m(d, o=o):
            return {"byol_loss": lambda t: 5 - 0.3 * t + o + (d if t >= 5 else 0.0),
                    "probe_top1": lambda t: 10 * t + o + (d if t >= 5 else 0.0)}
        standard.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s, m(0.0), experiment="byol-vit"))
        standard.append(write_run(root, f"k4-rule-s{s}", 4.0, "exponential", s, m(0.7 + 0.02 * s),
                                  experiment="byol-vit", layout=STEP))
        standard.append(write_run(root, f"k4-norule-s{s}", 4.0, None, s, m(2.0 - 0.01 * s), experiment="byol-vit",
                                  layout=STEP))
        arms.append(write_run(root, f"k4-rule-constant-arm-rule-only-s{s}", 4.0, "exponential", s, m(0.5),
                              experiment="byol-vit", layout=CONSTANT))
        arms.append(write_run(root, f"k4-norule-constant-arm-neither-s{s}", 4.0, None, s, m(0.8),
                              experiment="byol-vit", layout=CONSTANT))
    return standard, arms


def test_the_headline_reads_the_same_statistic_with_or_without_the_arms(tmp_path):
    """The constant arms once pulled the full reproduction's window back to epoch 0 for every claim, so
    the headline averaged in the κ=1 half, where every setting is its baseline, and `--headline` (no arms)
    read another statistic of the same runs."""
    standard, arms = byol_vit_runs(tmp_path)
    family = K.FAMILIES["byol-vit"]
    full = M.measure(family, load_runs(standard + arms))
    head = M.measure(K.headline_only(family), load_runs(standard))
    a, b = full["claims"][0], head["claims"][0]
    assert a["statistic"] == b["statistic"] == "mean Δ over the run from epoch 5"
    for key in ("effect", "effect_ci", "mde", "spread", "verdict"):
        assert a[key] == pytest.approx(b[key]) if key != "verdict" else a[key] == b[key]
    for pa, pb in zip(a["parts"], b["parts"], strict=True):
        assert pa["per_seed"] == pytest.approx(pb["per_seed"])
    # the step's offsets over epochs 5–10 only: a loss 2 − 0.01 s above without the rule, 0.7 + 0.02 s with it
    assert a["parts"][0]["per_seed"] == pytest.approx([2.0 - 0.01 * s for s in range(5)])
    assert a["parts"][1]["effect"] == pytest.approx(0.74) and a["effect"] == pytest.approx(1.98)
    against_constant = [c for c in full["claims"] if (c.get("settings") or {}).get("B", "").startswith("arm")]
    assert len(against_constant) == 2
    assert all(c["statistic"] == "mean |Δ| over the run" for c in against_constant)
    assert full["optimizer_check"]["statistic"] == "mean Δ over the run from epoch 5"


def with_total(d, total):
    h = json.loads((d / "hparams.json").read_text())
    (d / "hparams.json").write_text(json.dumps({**h, "total": total}))
    return d


def lars_runs(root, stop_seed=None, last=9.8):
    """byol-r50-lars baselines and κ=4 settings on one curve; every κ=4 run's last evaluation is at `last`
    (a finished run's last step can fall short of the baseline's: both pass their planned end, the baseline
    by more), `stop_seed`'s run with the rule stops at epoch 8. Every run's final teacher is probed, the
    stopped one's too (its claims read `offline_probe_top1`), at its seed's level."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        def f(t, o=o):
            return {"probe_top1": min(t, 8.0) + o, "byol_loss": 5 - 0.1 * t + o}
        metrics = {"probe_top1": lambda t, f=f: f(t)["probe_top1"], "byol_loss": lambda t, f=f: f(t)["byol_loss"]}
        dirs.append(with_total(write_run(root, f"k1-s{s}", 1.0, "exponential", s, metrics,
                                         experiment="byol-r50-lars"), 1000))
        for name, rule in (("rule", "exponential"), ("norule", None)):
            stopped = s == stop_seed and rule
            ts = T[:9] if stopped else T[:-1] + [last]
            d = write_run(root, f"k4-{name}-s{s}", 4.0, rule, s, metrics, experiment="byol-r50-lars", ts=ts)
            dirs.append(with_total(d, 960))  # its own planned end, which its last step passed
        for d in dirs[-3:]:
            write_offline_probe(d, 8.0 + o)
    return dirs


def test_a_finished_run_whose_last_step_falls_short_is_not_stopped(tmp_path):
    """A run that reached its planned samples is finished, wherever its last evaluation falls against the
    baseline's; 2 % short once read as 'stopped early' (an infinite gap) and the claim as contradicted."""
    runs = load_runs(lars_runs(tmp_path, last=9.75))
    assert all(M.stopped_early(r) is False for r in runs)
    family = dataclasses.replace(K.FAMILIES["byol-r50-lars"], arms=())
    table = M.measure(family, runs)["tables"]["byol_loss"]
    for key in (("with", 4.0), ("without", 4.0)):
        g = table["rows"][key]["gaps"]
        assert g["incomplete"] == 0 and math.isfinite(g["run"]) and math.isfinite(g["end"])


def test_a_run_that_stopped_has_an_infinite_gap_and_no_final_value(tmp_path):
    runs = load_runs(lars_runs(tmp_path, stop_seed=0))
    stopped = [r for r in runs if M.stopped_early(r)]
    assert [r.name for r in stopped] == ["k4-rule-s0"]
    lars = K.FAMILIES["byol-r50-lars"]
    family = dataclasses.replace(lars, arms=(), claims=lars.claims[:1])  # matches_or_better, with the rule at κ=4
    out = M.measure(family, runs)
    for metric in ("probe_top1", "offline_probe_top1"):  # a stopped run's final teacher is no final value either
        row = out["tables"][metric]["rows"][("with", 4.0)]
        assert math.isinf(row["gaps"]["per_seed_end"][0]) and row["finals"][0] is None, metric
    c = out["claims"][0]
    assert c["metric"] == "offline_probe_top1" and c["kind"] == "matches_or_better"
    # seed 0's run stopped: it has no final value, so no interval bounds the effect and no rule decides
    assert c["parts"][0]["per_seed"][0] == math.inf and c["parts"][0]["per_seed"][1:] == pytest.approx([0.0, 0.0])
    assert c["verdict"] == R.NOT_REPRODUCED and c["effect_ci"] == [-math.inf, math.inf] and math.isinf(c["mde"])


def test_a_speech_run_is_finished_by_its_seconds_of_audio(tmp_path):
    """A batch counted in seconds: `total` is seconds of audio, logged as `seconds_seen`; the samples (the
    utterances) seen are fewer than the seconds and say nothing about the end."""
    d = write_run(tmp_path, "k1-s0", 1.0, "exponential", 0, {"wer": lambda t: 50 - t}, experiment="ctc-polyak")
    h = json.loads((d / "hparams.json").read_text())
    (d / "hparams.json").write_text(json.dumps({**h, "total": 48.0, "batch_unit": "seconds"}))
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    done = [{**r, "samples_seen": r["samples_seen"] // 25, "seconds_seen": 5.03 * r["epoch"]} for r in rows]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
    assert M.stopped_early(load_runs([d])[0]) is False  # 50.3 s of its 48: finished, at 40 samples
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done[:9]))
    assert M.stopped_early(load_runs([d])[0]) is True  # 40.2 s


def _part(values):
    return J.Effects("a part", values, 0.3, "Δ at the end")


def test_seeds_stopped_on_both_sides_give_no_bound_and_no_verdict():
    d = P.differences([math.inf, 1.0, 1.0, 1.0, 1.0], [1.0, 4.0, 4.0, 4.0, math.inf])
    assert d[0] == -math.inf and d[-1] == math.inf
    for kind in ("rule_closer", "matches_or_better", "gap_remains"):
        decision, (rec,) = J.decide_parts(kind, [_part(d)])
        assert decision.verdict == R.NOT_REPRODUCED and rec["effect_ci"] == [-math.inf, math.inf]
        assert math.isnan(rec["effect"]) and math.isinf(rec["mde"])


def test_one_seed_gives_no_interval_to_decide_on():
    decision, (rec,) = J.decide_parts("matches_or_better", [_part([-5.0])])
    assert decision.verdict == R.NOT_REPRODUCED and rec["n"] == 1 and rec["effect"] == pytest.approx(-5.0)
    assert rec["effect_ci"] == [-math.inf, math.inf] and math.isinf(rec["mde"])
    decision, _ = J.decide_parts("matches_or_better", [_part([-5.0, -5.1])])
    assert decision.verdict == R.CONTRADICTED  # two seeds 17 spreads below: an interval, and a verdict
