"""`emarule compare` on runs that did not get to their end: a run that stopped early or whose metric went
non-finite is no match, a baseline cut short says so, and runs of different presets are not pooled."""

import json
import math

import pytest
from typer.testing import CliRunner

from emarule.analysis import compare as C
from emarule.cli.main import app
from emarule.errors import UserError
from test_compare import T, line, make_run

runner = CliRunner()


def planned(run, total=1000.0, **extra):
    """Record the run's planned end (samples; make_run logs samples_seen = epoch × 100) as `emarule run` does."""
    h = json.loads((run / "hparams.json").read_text())
    (run / "hparams.json").write_text(json.dumps(h | {"total": total, "batch_unit": "samples"} | extra))
    return run


def test_a_run_that_stopped_early_or_went_nan_is_no_match(tmp_path):
    b = planned(make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t)))
    cut = planned(make_run(tmp_path, "k4-norule-s0", 4, None, line(T[:6], lambda t: t)))  # killed at epoch 5
    nan = planned(make_run(tmp_path, "k4-rule-s0", 4, "exponential", line(T[:10], lambda t: t) + [(10.0, "nan")]))
    rows = {x["name"]: x for x in C.compare([b, cut, nan])["runs"]}
    assert rows["k1-rule-s0"]["gap_mean"] == 0 and rows["k1-rule-s0"]["incomplete"] is None
    stopped = rows["k4-norule-s0"]
    assert stopped["gap_max"] == stopped["gap_mean"] == math.inf and stopped["gap_final"] is None
    assert stopped["final_epoch"] == 5 and stopped["stopped_early"] is True and stopped["incomplete"] == "stopped early"
    diverged = rows["k4-rule-s0"]
    assert diverged["gap_mean"] == math.inf and diverged["nonfinite_epoch"] == 10
    assert diverged["final"] == 9 and diverged["final_epoch"] == 9  # the last finite value, and where it is from
    assert diverged["incomplete"] == "nan from epoch 10"
    res = runner.invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "f.png"), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = {x["name"]: x for x in json.loads(res.output)["runs"]}  # strict JSON: ∞ as "inf" text
    assert out["k4-norule-s0"]["gap_mean"] == "inf" and out["k4-rule-s0"]["nonfinite_epoch"] == 10
    res = runner.invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "f.png")])
    table = res.output.replace("\n", " ")
    assert "5 (stopped early)" in table and "9 (nan from epoch 10)" in table and "∞" in table


def test_a_baseline_cut_short_by_one_seed_says_so(tmp_path):
    b0 = planned(make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t), seed=0))
    b1 = planned(make_run(tmp_path, "k1-rule-s1", 1, "exponential", line(T[:4], lambda t: t), seed=1))
    r = planned(make_run(tmp_path, "k4-rule-s0", 4, "exponential", line(T, lambda t: t), seed=0))
    res = C.compare([b0, b1, r])
    assert res["baseline"]["final_epoch"] == 3  # the mean ends where the shortest seed does
    assert res["notes"] == ["baseline k1-rule-s1 ends at epoch 3 (stopped early)",
                            "the baseline's mean ends at epoch 3, where its shortest seed (k1-rule-s1) ends; the "
                            "gaps are measured up to there, not to epoch 10"]
    out = runner.invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "f.png")]).output
    assert "note: baseline k1-rule-s1 ends at epoch 3" in out
    groups = {g["label"]: g for g in res["groups"]}
    assert groups["κ=1 baseline"]["incomplete"] == 1 and groups["κ=1 baseline"]["final_mean"] == 10


def test_runs_of_different_presets_are_not_pooled(tmp_path):
    make_run(tmp_path, "tiny-k1-rule-s0", 1, "exponential", line(T, lambda t: t))
    make_run(tmp_path, "cpu-k1-rule-s0", 1, "exponential", line(T, lambda t: t + 5))
    make_run(tmp_path, "tiny-k4-rule-s0", 4, "exponential", line(T, lambda t: t))
    for run, preset in (("tiny-k1-rule-s0", "tiny"), ("cpu-k1-rule-s0", "cpu"), ("tiny-k4-rule-s0", "tiny")):
        planned(tmp_path / run, preset=preset)
    with pytest.raises(UserError, match=r"runs of different presets \(cpu, tiny\); compare one preset at a time"):
        C.compare([tmp_path])
    res = runner.invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "f.png")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert C.compare([tmp_path / "tiny-k1-rule-s0", tmp_path / "tiny-k4-rule-s0"])["runs"][1]["gap_mean"] == 0


def test_a_run_that_stopped_before_its_first_evaluation_is_shown_not_refused(tmp_path):
    # A sweep's diverged run may not have logged the headline metric yet: it belongs in the table as stopped.
    b = planned(make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t)))
    train_only = [{"kind": "train", "samples_seen": 50, "epoch": 0.5, "loss": "nan"}]
    r = planned(make_run(tmp_path, "k8-norule-s0", 8, None, [], extra_rows=train_only))
    row = next(x for x in C.compare([b, r], "probe_top1")["runs"] if x["name"] == "k8-norule-s0")
    assert row["incomplete"] == "stopped early" and row["gap_mean"] == math.inf and row["final"] is None
    assert runner.invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "f.png")]).exit_code == 0
    unplanned = make_run(tmp_path / "u", "k8-norule-s0", 8, None, [], extra_rows=train_only)
    with pytest.raises(UserError, match="'probe_top1' is not in"):  # without a planned end: still refused
        C.compare([b, unplanned], "probe_top1")
