"""A κ=1 baseline that stopped early, the words of a measured absence, and a diagnosis that reads the target
model as the optimizer-rule check does."""

import json
import math

import pytest

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import verdict as V
from test_reproduce import polyak_runs, write_run

INF = math.inf


@pytest.mark.parametrize("call", [
    lambda: V.decide("rule_needed", 0.1, 3.0, INF, (2.0, 3.0)),
    lambda: V.decide("same_either_way", 0.1, 0.2, INF, (0.0, 0.2)),
    lambda: V.decide("rule_closer", 0.1, 3.0, INF, (2.0, 3.0)),
    lambda: V.decide_optimizer(0.5, INF, (0.4, 0.6)),
    lambda: V.decide_target(5.0, INF, 5.0, 0.4),
    lambda: V.decide_with_better({2.0: -9.0}, INF),
    lambda: V.decide_matches_or_better(-9.0, (-10.0, -8.0), INF),
])
def test_an_unbounded_spread_decides_nothing(call):
    """Against an infinite spread every "within 2× spread" would hold and every "beyond it" fail."""
    verdict, why = call()
    assert verdict == "inconclusive" and why.decision == V.STOPPED_BASELINE
    assert V.strays(9.0, INF, (8.0, 10.0)) is None


def _stop_baseline(runs, seed: int, at_epoch: float) -> list:
    """The κ=1 run of `seed` cut at `at_epoch` of its 10, its planned end recorded as a diverged run's is."""
    run = next(r for r in runs if r.is_baseline and r.seed == seed)
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["epoch"] <= at_epoch))
    h = json.loads((run.path / "hparams.json").read_text())
    (run.path / "hparams.json").write_text(json.dumps(h | {"total": 1000}))  # 10 epochs of 100 samples
    return load_runs([r.path for r in runs])


def test_a_diverged_baseline_leaves_every_claim_inconclusive_and_names_its_seed(tmp_path):
    runs = polyak_runs(tmp_path, ema_with=0.1, ema_without=-3.0, target_with=0.0)
    intact = M.measure(K.POLYAK, runs)
    assert {c["verdict"] for c in intact["claims"]} >= {"reproduced"}  # so the test below is not vacuous
    m = M.measure(K.POLYAK, _stop_baseline(runs, seed=2, at_epoch=3))
    assert math.isinf(m["tables"]["ema_top1"]["rows"][("baseline", 1.0)]["gaps"]["run"])
    judged = [c for c in m["claims"] if not c["why"].startswith("not measured")]  # arms these runs lack
    assert len(judged) >= 5
    for c in judged:
        assert c["verdict"] == "inconclusive", c
        assert "baseline of seed 2 stopped before its end" in c["why"], c
        assert "set_aside" not in c and "diagnosis" not in c
    needed = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 2.0)
    assert needed["numbers"].startswith("gap with 0.1, without 3, baseline spread ∞")  # measured, not judged
    check = m["optimizer_check"]
    assert all(r["state"] is None for r in check["rows"]) and check["first_strays_kappa"] is None
    assert "not judged" in check["summary"] and "seed 2" in check["summary"]
    assert m["goal"]["met"] is None and "seed 2" in m["goal"]["why"]


@pytest.mark.parametrize("ci,says,not_says", [
    ((0.2, 0.6), "closer on the paired seeds (CI above 0), but by less than one spread", "no drop for the rule"),
    ((-0.6, -0.2), "farther (CI below 0), by less than one spread", "closer"),
    ((-0.3, 0.4), "there is no drop for the rule to prevent", "CI above 0"),
])
def test_a_measured_absence_says_which_side_of_zero_its_interval_lies(ci, says, not_says):
    verdict, why = V.decide("rule_needed", 0.9, 1.0, 1.0, ci)
    assert verdict == "contradicted"
    assert says in why.decision and not_says not in why.decision


def _fading_target_runs(root, target_with: float) -> list:
    """polyak's settings with the EMA worse with the rule (contradicted), and a target whose gap with the rule
    fades from `target_with` at epoch 0 to 0 at the end: the end reads "tracks", the run does not."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        dirs.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o: t - 1 + o}))
        for k in (2.0, 4.0):
            for rule, name, ema in (("exponential", "rule", -3.0), (None, "norule", -1.0)):
                dirs.append(write_run(root, f"k{k:g}-{name}-s{s}", k, rule, s, {
                    "ema_top1": lambda t, o=o, e=ema: t + o + e,
                    "top1": lambda t, o=o, r=rule: t - 1 + o + (target_with * (1 - t / 10) if r else 0.0)}))
    return load_runs(dirs)


def test_the_diagnosis_reads_the_target_as_the_optimizer_check_does(tmp_path):
    """An "end" claim's diagnosis used to judge the target at the end (gap 0: "tracks") beside a check that
    lists it "between" over the run; both now read the check's state, over the run, with its interval."""
    m = M.measure(K.POLYAK, _fading_target_runs(tmp_path, target_with=1.2))  # run gap 0.6, pair spread 0.4
    row = next(r for r in m["optimizer_check"]["rows"] if r["setting"] == "with" and r["kappa"] == 4.0)
    assert row["state"] == "between" and row["gap"] == pytest.approx(0.6)
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 4.0
             and c["statistic"] == M.STATISTIC["end"])
    assert c["verdict"] == "contradicted"
    assert "between 1× and 2× its spread (0.4)" in c["diagnosis"] and "tracks" not in c["diagnosis"]
    assert not c["diagnosis"].startswith("noise:")  # a contradicted claim has measured past the noise
