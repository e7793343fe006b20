"""The paired statistics of `emarule reproduce`: the bootstrap interval's properties, the paired rules, the
optimizer-rule check and the gate it puts on EMA claims, and the arms (on synthetic run directories)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emarule.analysis import compare as C
from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import report as R
from emarule.analysis.reproduce import verdict as V
from test_reproduce import T, polyak_runs, write_offline_probe, write_run

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


# --- the bootstrap interval ---------------------------------------------------------------------


@given(st.floats(-1e9, 1e9, allow_nan=False), st.integers(2, 30))
def test_the_interval_of_a_constant_is_that_constant(c, n):
    assert V.bootstrap_ci([c] * n) == (c, c)
    assert V.bootstrap_ci([c]) is None  # one seed: no interval


@settings(max_examples=30, deadline=None)
@given(st.lists(finite, min_size=2, max_size=12), st.randoms(use_true_random=False))
def test_permuting_the_seeds_changes_nothing(values, rnd):
    shuffled = list(values)
    rnd.shuffle(shuffled)
    assert V.bootstrap_ci(shuffled) == V.bootstrap_ci(values)


@settings(max_examples=30, deadline=None)
@given(st.lists(finite, min_size=2, max_size=12))
def test_the_interval_lies_within_the_values_and_holds_the_middle(values):
    lo, hi = V.bootstrap_ci(values)
    assert min(values) <= lo <= hi <= max(values)
    mean = sum(values) / len(values)
    assert lo <= mean + 1e-9 * (1 + abs(mean)) and mean - 1e-9 * (1 + abs(mean)) <= hi


def test_the_interval_is_fixed_and_narrows_with_more_seeds():
    vals = [0.3, 1.1, -0.4, 0.8, 0.2]
    assert V.bootstrap_ci(vals) == V.bootstrap_ci(vals)  # a fixed RNG seed: the same runs, the same interval
    wide, narrow = V.bootstrap_ci(vals), V.bootstrap_ci(vals * 8)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_the_interval_is_the_documented_percentile_bootstrap():
    """docs/reproduce.md: 10,000 resamples of the seeds, RNG seed 0, the values sorted first, the 2.5 % and
    97.5 % points of the resampled means; here by numpy's percentile, not the module's indexing."""
    import numpy as np

    vals = [0.3, 1.1, -0.4, 0.8, 0.2]
    a = np.sort(np.array(vals))
    means = a[np.random.default_rng(0).integers(0, len(a), size=(10_000, len(a)))].mean(axis=1)
    # the 251st and the 9,750th of the 10,000 sorted means: numpy's "higher" and "lower" points there
    lo, hi = np.percentile(means, 2.5, method="higher"), np.percentile(means, 97.5, method="lower")
    got = V.bootstrap_ci(list(reversed(vals)))
    assert got == (float(lo), float(hi)) and got[0] < sum(vals) / len(vals) < got[1]
    assert got != V.bootstrap_ci(vals, seed=1) and got != V.bootstrap_ci(vals, resamples=1_000)


def test_with_two_or_three_seeds_the_interval_is_their_range():
    """As docs/reproduce.md says: every seed must agree in sign there; with 5, one seed may disagree."""
    assert V.bootstrap_ci([1.0, 2.0]) == (1.0, 2.0) and V.bootstrap_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert V.bootstrap_ci([-0.5, 1.0, 2.0, 3.0, 4.0])[0] > 0


def test_a_paired_shift_is_detected_where_an_unpaired_test_is_not():
    """Seeds far apart (init and data order), each shifted by 0.5 in the second setting: the per-seed
    differences are all 0.5, but the two samples overlap completely."""
    a = [0.0, 10.0, 20.0, 30.0, 40.0]
    b = [x + 0.5 for x in a]
    paired = V.bootstrap_ci(V.differences(a, b))
    unpaired = V.bootstrap_ci_unpaired(a, b)
    assert paired == (0.5, 0.5) and paired[0] > 0
    assert unpaired[0] < 0 < unpaired[1]


def test_runs_that_both_stopped_early_differ_by_nothing():
    assert V.differences([math.inf, 1.0, 2.0], [math.inf, math.inf, 3.0]) == [0.0, math.inf, 1.0]
    assert V.bootstrap_ci([1.0, math.inf])[1] == math.inf


# --- gaps against each seed's own baseline ------------------------------------------------------


def test_paired_gaps_and_the_pair_spread_by_hand():
    base = [(T, [t + o for t in T]) for o in (-1.0, 0.0, 2.0)]
    runs = [(T, [t + o + d for t in T]) for o, d in zip((-1.0, 0.0, 2.0), (0.5, -0.5, 1.0), strict=True)]
    g = V.paired_gaps(runs, base)
    assert g["per_seed_run"] == pytest.approx([0.5, 0.5, 1.0]) and g["run"] == pytest.approx(2 / 3)
    assert g["per_seed_end"] == pytest.approx([0.5, 0.5, 1.0]) and g["ci_run"][0] >= 0.5
    # Ordered pairs of baselines: |−1 − 0|, |−1 − 2|, |0 − 2|, each twice.
    assert V.pair_spread(base)["run"] == pytest.approx((1 + 3 + 2) / 3) and V.pair_spread(base[:1]) is None
    stopped = [(T[:5], [0.0] * 5)] + runs[1:]
    assert math.isinf(V.paired_gaps(stopped, base)["run"])


@pytest.mark.parametrize("ci,verdict", [((0.5, 3.0), "reproduced"), ((-0.2, 3.0), "inconclusive"),
                                        (None, "reproduced")])
def test_rule_needed_needs_the_paired_ci_to_exclude_zero(ci, verdict):
    assert V.decide("rule_needed", 0.5, 3.0, 1.0, ci)[0] == verdict


@pytest.mark.parametrize("g_with,g_without,ci,verdict", [
    (0.9, 1.0, (-0.3, 0.4), "contradicted"),  # without stays near the baseline, and pairing bounds the difference
    (0.9, 1.0, (-0.3, 1.2), "inconclusive"),  # the interval reaches past 1× spread: a drop cannot be ruled out
    (0.9, 1.0, (-1.1, 0.4), "inconclusive"),
    (1.5, 2.5, (0.2, 0.8), "inconclusive"),  # without is beyond 2× spread: the curve moved, the rule is not 2× better
    (0.2, 0.45, (-0.01, 0.5), "inconclusive"),  # without ≥ 2× with: the predicted ratio is there, the CI reaches 0
    (0.4, 0.7, (-0.1, 0.6), "contradicted"),  # without < 2× with (1.6×, byol-vit's headline on seeds 100–104)
    (0.9, 1.0, None, "inconclusive"),  # unpaired: no interval to bound the difference
])
def test_rule_needed_is_contradicted_when_pairing_shows_no_drop(g_with, g_without, ci, verdict):
    assert V.decide("rule_needed", g_with, g_without, 1.0, ci)[0] == verdict


@settings(max_examples=300, deadline=None)
@given(gw=st.floats(0, 10), gwo=st.floats(0, 10), s=st.floats(0.01, 10), lo=st.floats(-10, 10),
       width=st.floats(0, 10))
def test_paired_rule_needed_is_the_written_rule(gw, gwo, s, lo, width):
    """verdict.py's docstring, which every report prints as the rules applied: reproduced and contradicted
    exactly where it says, and inconclusive everywhere else."""
    ci = (lo, lo + width)
    reproduced = gwo >= 2 * gw and gw <= 2 * s and ci[0] > 0
    contradicted = (gw >= gwo and max(gw, gwo) > 2 * s) or (
        gwo < 2 * gw and gwo <= 2 * s and -s < ci[0] and ci[1] < s)
    expected = "reproduced" if reproduced else "contradicted" if contradicted else "inconclusive"
    assert V.decide("rule_needed", gw, gwo, s, ci)[0] == expected


def test_same_either_way_is_contradicted_only_on_a_real_difference():
    assert V.decide("same_either_way", 0.5, 3.0, 1.0, (1.0, 4.0))[0] == "contradicted"
    assert V.decide("same_either_way", 0.5, 3.0, 1.0, (-1.0, 4.0))[0] == "inconclusive"


def test_strays_needs_the_ci_above_the_spread():
    assert V.strays(3.0, 1.0, (2.0, 4.0)) is True
    assert V.strays(3.0, 1.0, (0.5, 4.0)) is False  # > 2× on average, but one seed's worth of noise
    assert V.strays(None, 1.0) is None
    assert V.decide_optimizer(3.0, 1.0, (0.5, 4.0))[0] == "inconclusive"
    assert V.decide_target(3.0, 1.0, 3.0, 1.0, (0.5, 4.0))[0] == "inconclusive"
    assert V.decide_target(3.0, 1.0, 3.0, 1.0, (2.0, 4.0))[0] == "reproduced"


def test_arm_closer_and_matches_or_better():
    assert V.decide_arm_closer(1.0, 2.0, (0.2, 1.8))[0] == "reproduced"
    assert V.decide_arm_closer(2.0, 1.0, (-1.8, -0.2))[0] == "contradicted"
    assert V.decide_arm_closer(1.0, 1.1, (-0.3, 0.5))[0] == "inconclusive"
    assert V.decide_matches_or_better(-1.0, (-2.0, 0.0), 1.0)[0] == "reproduced"  # within 2× spread
    assert V.decide_matches_or_better(3.0, (1.0, 5.0), 1.0)[0] == "reproduced"  # surpasses
    assert V.decide_matches_or_better(-5.0, (-7.0, -3.0), 1.0)[0] == "contradicted"
    assert V.decide_matches_or_better(-5.0, (-9.0, 1.0), 1.0)[0] == "inconclusive"


def test_with_better_needs_the_paired_ci():
    assert V.decide_with_better({2.0: 0.5, 4.0: 3.0}, 1.0, {2.0: (0.1, 0.9), 4.0: (2.0, 4.0)})[0] == "reproduced"
    assert V.decide_with_better({2.0: 0.5, 4.0: 3.0}, 1.0, {2.0: (0.1, 0.9), 4.0: (-1.0, 6.0)})[0] == "inconclusive"
    assert V.decide_with_better({4.0: -3.0}, 1.0, {4.0: (-6.0, 1.0)})[0] == "inconclusive"


# --- the optimizer-rule check and the gate ------------------------------------------------------


def test_the_optimizer_check_names_the_first_kappa_where_the_target_strays(tmp_path):
    """The target tracks at κ=2 and strays at κ=4 (the same offset, but runs at κ=4 also add 2)."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o: t - 1 + o}))
        for k, target in ((2.0, 0.1), (4.0, 2.0)):
            for rule, ema in (("exponential", 0.1), (None, -3.0)):
                dirs.append(write_run(tmp_path, f"k{k:g}-{rule}-s{s}", k, rule, s,
                                      {"ema_top1": lambda t, o=o, e=ema: t + o + e,
                                       "top1": lambda t, o=o, g=target: t - 1 + o + g}))
    m = M.measure(K.POLYAK, load_runs(dirs))
    oc = m["optimizer_check"]
    assert oc["metric"] == "top1" and oc["first_strays_kappa"] == 4.0 and oc["ema_blind"]
    states = {(r["setting"], r["kappa"]): r["state"] for r in oc["rows"]}
    assert states == {("with", 2.0): "tracks", ("without", 2.0): "tracks", ("with", 4.0): "strays",
                      ("without", 4.0): "strays"}
    by = {(c["kind"], c["kappa"], c["statistic"]): c for c in m["claims"]}
    at2 = by[("rule_needed", 2.0, M.STATISTIC["run"])]
    assert at2["verdict"] == "reproduced" and "set_aside" not in at2  # the target tracks: the EMA claim stands
    at4 = by[("rule_needed", 4.0, M.STATISTIC["end"])]
    assert at4["verdict"] == "inconclusive" and at4["verdict_if_target_tracked"] == "reproduced"
    assert at4["set_aside"] == M.ASIDE_STRAYS
    assert "the target model strays (with the rule at κ=4: top1 gap 2" in at4["why"]
    # target_explains is about the target itself, not gated; here the EMA has no gap for it to explain
    explains = by[("target_explains", 4.0, M.STATISTIC["run"])]
    assert explains["verdict"] == "inconclusive" and explains["set_aside"] == M.ASIDE_NO_GAP
    assert "verdict_if_target_tracked" not in explains
    # The report marks both rows and says what setting aside does to the tally.
    data = m | {"timing": {"wall_s": 1.0, "cpus": 2, "load_start": 0.0, "load_end": 0.0, "omp_threads": "1"},
                "command": "emarule reproduce polyak", "figures": [], "decision_rule": "rules",
                "not_judged_here": [], "settings": []}
    report = R.markdown(data, K.POLYAK)
    assert report.count("**inconclusive** (set aside)") == 2
    assert report.count("- Set aside: the target model strays. The claim does not apply at this κ") == 1
    assert report.count("- Set aside: no EMA gap to explain.") == 1


def test_a_target_that_depends_on_the_ema_gates_nothing(tmp_path):
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s,
                              {"probe_top1": lambda t, o=o: t + o, "byol_loss": lambda t, o=o: 1 + o}, "byol-r18"))
        for rule, e in (("exponential", 0.1), (None, -5.0)):
            dirs.append(write_run(tmp_path, f"k4-{rule}-s{s}", 4.0, rule, s,
                                  {"probe_top1": lambda t, o=o, e=e: t + o + e,
                                   "byol_loss": lambda t, o=o: 10 + o}, "byol-r18"))
    m = M.measure(K.BYOL, load_runs(dirs))
    assert not m["optimizer_check"]["ema_blind"] and "depends on the EMA" in m["optimizer_check"]["summary"]
    c = next(c for c in m["claims"] if c["kappa"] == 4.0 and c["statistic"] == M.STATISTIC["run"])
    assert c["verdict"] == "reproduced" and "verdict_if_target_tracked" not in c and "set_aside" not in c


def test_a_claim_on_the_students_wer_after_pretraining_is_set_aside_where_it_strayed_before():
    """ctc-pseudo-label's gate reads the student's WER in pre-training, where it is blind to ρ; the claim
    "without the rule, a higher test WER" reads the same metric at the end, after the EMA's labels."""
    gate = {"blind": True, "metric": "wer", "rows": {("with", 4.0): {
        "metric": "wer", "gap": 8.9, "ci": (7.7, 9.9), "spread": 2.2, "state": "strays"}}}
    claim = K.CTC_PL.claims[1]
    assert claim.metric == "wer" and claim.over == "end" and not claim.until
    out = M.gated(K.CTC_PL, claim, {"verdict": "contradicted", "why": "gap with 14.2, without 13"}, gate,
                  [("with", 4.0)])
    assert out["verdict"] == "inconclusive" and out["verdict_if_target_tracked"] == "contradicted"
    assert "the target model strays" in out["why"] and "gap with 14.2" in out["why"]
    # Polyak's top1 is blind to ρ throughout: a claim on it is the target's own and stands.
    top1 = next(c for c in K.POLYAK.claims if c.metric == "top1" and c.kind in M.GATED)
    polyak_gate = gate | {"metric": "top1"}
    kept = M.gated(K.POLYAK, top1, {"verdict": "reproduced", "why": "w"}, polyak_gate, [("with", 4.0)])
    assert kept["verdict"] == "reproduced"


# --- arms ---------------------------------------------------------------------------------------


def test_arms_are_their_own_settings_and_claims_compare_them(tmp_path):
    """Polyak's bn-scale arm at κ=2 shares κ and rule with the standard run: only the arm map tells them
    apart. Its top1 sits 0.2 closer to each seed's baseline than the standard run's."""
    runs = polyak_runs(tmp_path, ema_with=0.5, ema_without=-3.0, target_with=0.5)
    arm_dirs, arms = [], {}
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        d = write_run(tmp_path, f"k2-rule-arm-bn-scale-s{s}", 2.0, "exponential", s,
                      {"ema_top1": lambda t, o=o: t + o + 0.3, "top1": lambda t, o=o: t - 1 + o + 0.3})
        arm_dirs.append(d)
        arms[str(d)] = "bn-scale"
    m = M.measure(K.POLYAK, runs + load_runs(arm_dirs), arms)
    assert m["kappas"] == [2.0, 4.0]  # the arm's κ is not a κ of the sweep
    assert ("bn-scale", 2.0) in m["tables"]["top1"]["rows"]
    assert len(m["tables"]["top1"]["rows"][("with", 2.0)]["curves"]) == 3  # the arm's runs are not mixed in
    closer = [c for c in m["claims"] if c["kind"] == "arm_closer"]
    assert {c["metric"] for c in closer} == {"top1", "ema_top1"}
    for c in closer:
        assert c["verdict"] == "reproduced"
        assert c["settings"] == {"A": "arm bn-scale at κ=2", "B": "with the rule at κ=2"}
        assert c["paired_difference"]["ci"] == pytest.approx((0.2, 0.2))
    # The run names say which runs are the arm's: without the map, the same verdicts; `emarule compare`
    # keeps the arm apart from the standard setting at its κ too.
    again = M.measure(K.POLYAK, runs + load_runs(arm_dirs))
    assert [c["verdict"] for c in again["claims"]] == [c["verdict"] for c in m["claims"]]
    labels = {g["label"] for g in C.compare([r.path for r in runs] + arm_dirs, "top1")["groups"]}
    assert "with EMA rule, arm bn-scale" in labels and "with EMA rule" in labels
    # Without the arm's runs its claims say what was not run.
    m = M.measure(K.POLYAK, polyak_runs(tmp_path / "b", ema_with=0.5, ema_without=-3.0, target_with=0.5))
    c = next(c for c in m["claims"] if c["kind"] == "arm_closer")
    assert c["verdict"] == "inconclusive" and "arm bn-scale at κ=2 was not run" in c["why"]


def test_matches_or_better_on_final_values_per_seed(tmp_path):
    """byol-r50-lars's claims read each final teacher's converged probe (offline_probe.json), paired per seed;
    the tracking probe, the same in every setting here, does not enter them."""
    dirs, arms = [], {}
    for s, o in enumerate((-2.0, 0.0, 2.0)):
        for name, k, rule, d in (("base", 1.0, "exponential", 0.0), ("with", 4.0, "exponential", 1.0),
                                 ("without", 4.0, None, -9.0), ("slower-ramp", 4.0, "exponential", -30.0)):
            p = write_run(tmp_path, f"k{k:g}-{name}-s{s}", k, rule, s,
                          {"probe_top1": lambda t: 50 + t, "byol_loss": lambda t: 1.0}, "byol-r50-lars")
            write_offline_probe(p, 50 + o + d)
            dirs.append(p)
            if name == "slower-ramp":
                arms[str(p)] = name
    m = M.measure(K.BYOL_R50_LARS, load_runs(dirs), arms)
    first, second = [c for c in m["claims"] if c["kind"] == "matches_or_better"]
    assert first["verdict"] == "reproduced" and first["a_minus_baseline"]["mean"] == pytest.approx(1.0)
    assert second["verdict"] == "contradicted" and second["a_minus_baseline"]["ci"] == pytest.approx((-30.0, -30.0))


def test_an_arm_takes_its_kappa_and_schedule_from_the_preset():
    k8, after = K.BYOL.arms
    assert k8.for_preset("tiny").kappa == 2.0 and k8.for_preset("cpu").kappa == 8.0
    assert after.schedule("byol-r18", "cpu") == "step:2"  # the cpu preset's warm-up ends at epoch 2
    (ramp,) = K.BYOL_R50_LARS.arms
    assert ramp.schedule("byol-r50-lars", "cpu") == "smooth:0.8-2.4"  # from epoch 0.8 over twice 0.8 → 1.6
    assert ramp.schedule("byol-r50-lars", None) == "smooth:60-180"  # the paper's 120-epoch ramp
    assert ramp.schedule("byol-r50-lars", "tiny") == "smooth:1-3.5"  # 4 epochs: it ends before training does


@pytest.mark.parametrize("g_with,g_without,ci,verdict", [
    (0.044, 0.142, (0.06, 0.136), "reproduced"),  # dino-vit's κ=4 shape: both gaps inside the spread, every pair agrees
    (0.044, 0.142, (-0.01, 0.2), "inconclusive"),  # the ratio holds on average, but the CI includes 0
    (0.1, 0.15, (0.02, 0.08), "inconclusive"),  # closer for every seed, but not by the stated ratio
    (0.2, 0.1, (-0.15, -0.05), "contradicted"),  # the rule leaves the curve farther, every pair agrees
    (0.2, 0.1, (-0.3, 0.1), "inconclusive"),  # farther on average, inside the noise of the comparison
])
def test_rule_closer_paired_is_decided_by_the_ratio_and_the_interval(g_with, g_without, ci, verdict):
    assert V.decide("rule_closer", g_with, g_without, 0.317, ci)[0] == verdict


def test_rule_closer_unpaired_still_needs_a_gap_beyond_the_spread():
    assert V.decide("rule_closer", 0.044, 0.142, 0.317)[0] == "inconclusive"
    assert V.decide("rule_closer", 0.3, 0.9, 0.317)[0] == "reproduced"


def test_with_better_paired_is_decided_by_the_intervals_alone():
    # dino-vit's shape: better at both κ for every resample, each difference inside the end spread
    assert V.decide_with_better({2.0: 0.65, 4.0: 0.74}, 1.83, {2.0: (0.31, 0.98), 4.0: (0.15, 1.34)})[0] == "reproduced"
    assert V.decide_with_better({2.0: 0.65, 4.0: -0.4}, 1.83, {2.0: (0.31, 0.98), 4.0: (-0.7, -0.1)})[0] == \
        "contradicted"
    assert V.decide_with_better({2.0: 0.65, 4.0: 0.2}, 1.83, {2.0: (0.31, 0.98), 4.0: (-0.1, 0.5)})[0] == \
        "inconclusive"
    # one κ without an interval: the unpaired rule, which asks > 2× the end spread at one κ
    assert V.decide_with_better({2.0: 0.65, 4.0: 0.74}, 1.83, {2.0: (0.31, 0.98)})[0] == "inconclusive"


def test_an_ema_claim_already_inconclusive_where_the_target_strays_is_set_aside_too():
    """Where the optimizer rule fails, the EMA claim does not apply, whatever its own rule said there."""
    gate = {"blind": True, "metric": "wer", "rows": {("with", 8.0): {
        "metric": "wer", "gap": 6.5, "ci": (5.4, 7.4), "spread": 2.3, "state": "strays"}}}
    claim = K.CTC_POLYAK.claims[0]
    out = M.gated(K.CTC_POLYAK, claim, {"verdict": "inconclusive", "why": "gap with 5.8, without 8.8: without < 2× "
                                         "with"}, gate, [("with", 8.0), ("without", 8.0)])
    assert out["verdict"] == "inconclusive" and out["set_aside"] == M.ASIDE_STRAYS
    assert out["verdict_if_target_tracked"] == "inconclusive" and "without < 2× with" in out["why"]
    tracks = gate | {"rows": {("with", 8.0): gate["rows"][("with", 8.0)] | {"state": "tracks"}}}
    kept = M.gated(K.CTC_POLYAK, claim, {"verdict": "inconclusive", "why": "w"}, tracks, [("with", 8.0)])
    assert "set_aside" not in kept and "verdict_if_target_tracked" not in kept


def test_target_explains_with_an_ema_gap_is_not_set_aside(tmp_path):
    """The same sweep as above but the EMA strays with the rule at κ=4: the claim applies there."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o: t - 1 + o}))
        for rule in ("exponential", None):
            dirs.append(write_run(tmp_path, f"k4-{rule}-s{s}", 4.0, rule, s,
                                  {"ema_top1": lambda t, o=o: t + o + 5.0, "top1": lambda t, o=o: t - 1 + o + 5.0}))
    m = M.measure(K.POLYAK, load_runs(dirs))
    c = next(c for c in m["claims"] if c["kind"] == "target_explains")
    assert c["verdict"] == "reproduced" and "set_aside" not in c
