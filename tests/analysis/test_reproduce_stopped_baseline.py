"""A κ=1 baseline that stopped early leaves every claim not measured and names its seed; the optimizer-rule
check reads the target model over the run, for a claim at the end too."""

import json
import math

import pytest

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import paired as P
from emarule.analysis.reproduce import render as D
from emarule.analysis.reproduce import rules as R
from test_reproduce import POLYAK_SPEC, T, polyak_layout, polyak_runs, write_run


def test_a_stopped_baseline_makes_the_spread_unbounded():
    base = [(T, [t + o for t in T]) for o in (-0.3, 0.0, 0.3)]
    base[2] = (T[:4], base[2][1][:4])
    s = P.pair_spread(base, [False, False, True])
    assert math.isinf(s["signed_run"]) and math.isinf(s["signed_end"]) and math.isinf(s["run"])
    assert P.unbounded(s["run"]) and not P.unbounded(1.0, None)


def _stop_baseline(runs, seed: int, at_epoch: float) -> list:
    """The κ=1 run of `seed` cut at `at_epoch` of its 10, its planned end recorded as a diverged run's is."""
    run = next(r for r in runs if r.is_baseline and r.seed == seed)
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["epoch"] <= at_epoch))
    h = json.loads((run.path / "hparams.json").read_text())
    (run.path / "hparams.json").write_text(json.dumps(h | {"total": 1000}))  # 10 epochs of 100 samples
    return load_runs([r.path for r in runs])


def test_a_diverged_baseline_leaves_every_claim_not_measured_and_names_its_seed(tmp_path):
    runs = polyak_runs(tmp_path, ema_with=0.1, ema_without=-3.0, target_with=0.0)
    intact = M.measure(K.POLYAK, runs)
    assert {c["verdict"] for c in intact["claims"]} >= {R.REPRODUCED}  # so the test below is not vacuous
    m = M.measure(K.POLYAK, _stop_baseline(runs, seed=2, at_epoch=3))
    assert math.isinf(m["tables"]["ema_top1"]["rows"][("baseline", 1.0)]["gaps"]["signed_run"])
    assert len(m["claims"]) == len(intact["claims"]) == 7
    for c in m["claims"]:
        assert c["verdict"] == R.NOT_MEASURED, c
        assert "baseline of seed 2 stopped before its end" in c["why"], c
        assert c["set_aside"] is None and c["effect"] is None and c["parts"] == []
        assert D.verdict(c) == f"{R.NOT_MEASURED} ({c['why']})"
    check = m["optimizer_check"]
    assert all(r["state"] is None for r in check["rows"]) and check["first_strays_kappa"] is None
    assert "not judged" in check["summary"] and "seed 2" in check["summary"]


def _fading_target_runs(root, target_with: float) -> list:
    """polyak's settings with the EMA worse with the rule, and a target whose drop with the rule fades from
    `target_with` at epoch 0 to 0 at the end: at the end it tracks, over the run it does not."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        dirs.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o: t - 1 + o},
                              layout=polyak_layout(1.0), spec=POLYAK_SPEC))
        for k in (2.0, 4.0):
            for rule, name, ema in (("exponential", "rule", -8.0), (None, "norule", -1.0)):
                dirs.append(write_run(root, f"k{k:g}-{name}-s{s}", k, rule, s, {
                    "ema_top1": lambda t, o=o, e=ema: t + o + e,
                    "top1": lambda t, o=o, r=rule: t - 1 + o - (target_with * (1 - t / 10) if r else 0.0)},
                    layout=polyak_layout(k), spec=POLYAK_SPEC))
    return load_runs(dirs)


def test_the_gate_reads_the_target_over_the_run_for_a_claim_at_the_end(tmp_path):
    """A drop of 1.2 fading to 0: 0.6 over the run, above the pair spread √0.18 = 0.42 for every seed."""
    m = M.measure(K.POLYAK, _fading_target_runs(tmp_path, target_with=1.2))
    row = next(r for r in m["optimizer_check"]["rows"] if r["setting"] == "with" and r["kappa"] == 4.0)
    assert row["state"] == "strays" and row["effect"] == pytest.approx(0.6) and row["ci"] == pytest.approx((0.6, 0.6))
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 4.0
             and c["statistic"] == "Δ at the end")
    assert c["verdict"] == R.SET_ASIDE and c["verdict_if_applicable"] == R.CONTRADICTED
    assert c["why"] == "with the rule at κ=4: top1 worse by +0.6 [+0.6, +0.6] against a spread of +0.424"
    # half the drop: 0.3 over the run, inside ±1 spread: the target tracks and the claim is judged
    m = M.measure(K.POLYAK, _fading_target_runs(tmp_path / "half", target_with=0.6))
    row = next(r for r in m["optimizer_check"]["rows"] if r["setting"] == "with" and r["kappa"] == 4.0)
    assert row["state"] == "tracks"
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 4.0
             and c["statistic"] == "Δ at the end")
    assert c["verdict"] == R.CONTRADICTED and c["set_aside"] is None
