"""The paired statistics of `emarule reproduce` (signed per-seed effects and the pair spread, by hand), and
every claim kind of a sweep family judged through `measure.measure` on synthetic run directories built so
that each verdict must come out: reproduced, not reproduced at this preset, contradicted; then what comes
before the rules (set aside, not testable, not measured) and the stand-ins beyond the paper's range."""

import dataclasses
import math

import pytest

from emarule.analysis import compare as C
from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import paired as P
from emarule.analysis.reproduce import render as D
from emarule.analysis.reproduce import rules as R
from test_reproduce import T, write_run

NR = R.NOT_REPRODUCED


# --- signed effects and the pair spread, by hand ---------------------------------------------------


def test_paired_gaps_signed_and_unsigned_by_hand():
    base = [(T, [t + o for t in T]) for o in (-1.0, 0.0, 2.0)]
    # seed 0: +0.5 throughout; seed 1: −0.5; seed 2: a ramp from 0 to +1 at the end (mean +0.5 over 11 points)
    runs = [(T, [t - 1.0 + 0.5 for t in T]), (T, [t - 0.5 for t in T]), (T, [t + 2.0 + t / 10 for t in T])]
    g = P.paired_gaps(runs, base)
    assert g["signed_run"] == pytest.approx([0.5, -0.5, 0.5])
    assert g["signed_end"] == pytest.approx([0.5, -0.5, 1.0])
    assert g["per_seed_run"] == pytest.approx([0.5, 0.5, 0.5]) and g["per_seed_end"] == pytest.approx([0.5, 0.5, 1.0])
    assert g["run"] == pytest.approx(0.5) and g["end"] == pytest.approx(2 / 3)
    # the gaps' t interval: [0.5, 0.5, 1] has mean 2/3, sd 1/√12·2 = 0.2887; t(0.975, 2) = 4.303
    h = 4.302652729911275 * (0.5 / math.sqrt(3)) / math.sqrt(3)
    assert g["ci_end"] == pytest.approx((2 / 3 - h, 2 / 3 + h), rel=1e-6)
    assert g["ci_run"] == pytest.approx((0.5, 0.5))


def test_the_pair_spread_is_the_rms_of_the_signed_differences_by_hand():
    base = [(T, [t + o for t in T]) for o in (-1.0, 0.0, 2.0)]
    s = P.pair_spread(base)
    # ordered pairs: −1−0, −1−2, 0+1, 0−2, 2+1, 2−0 → squares 1, 9, 1, 4, 9, 4
    assert s["signed_run"] == pytest.approx(math.sqrt(28 / 6)) and s["signed_end"] == pytest.approx(math.sqrt(28 / 6))
    assert s["run"] == pytest.approx((1 + 3 + 1 + 2 + 3 + 2) / 6) and s["pairs"] == 6 and s["seeds"] == 3
    # a difference that grows to 2 at the end: signed over the run is its mean (1), at the end 2
    s = P.pair_spread([(T, [0.0] * 11), (T, [t / 5 for t in T])])
    assert s["signed_run"] == pytest.approx(1.0) and s["signed_end"] == pytest.approx(2.0)
    assert P.pair_spread(base[:1]) is None
    assert P.pair_spread([([0.1025], [100.0]), ([0.1040], [98.0])], [False, False]) is None  # no shared point


def test_a_stopped_run_has_no_signed_effect_and_an_infinite_gap():
    base = [(T, [t + o for t in T]) for o in (-1.0, 0.0, 2.0)]
    runs = [(T[:5], [0.0] * 5), (T, [t + 0.3 for t in T]), (T, [t + 2.0 for t in T])]
    g = P.paired_gaps(runs, base)
    assert g["signed_run"][0] is None and g["signed_end"][0] is None and g["incomplete"] == 1
    assert g["signed_run"][1:] == pytest.approx([0.3, 0.0]) and math.isinf(g["run"]) and math.isinf(g["end"])
    assert g["ci_run"] == (-math.inf, math.inf)  # no bound from a run that stopped
    # a stopped baseline puts ∞ into every statistic of the pair spread
    s = P.pair_spread(base, [True, False, False])
    assert math.isinf(s["signed_run"]) and math.isinf(s["run"])


def test_mean_ci_is_students_t():
    lo, hi = P.mean_ci([1.0, 2.0, 3.0])
    assert (lo + hi) / 2 == pytest.approx(2.0) and hi - lo == pytest.approx(2 * 4.302652729911275 / math.sqrt(3))
    lo90, hi90 = P.mean_ci([1.0, 2.0, 3.0], 0.90)
    assert hi90 - lo90 == pytest.approx(2 * 2.919985580355516 / math.sqrt(3))
    assert P.mean_ci([1.0]) is None and P.mean_ci([1.0, None]) is None
    assert P.mean_ci([4.0, 4.0, 4.0]) == (4.0, 4.0)


def test_runs_that_both_stopped_early_differ_by_nothing():
    assert P.differences([math.inf, 1.0, 2.0], [math.inf, math.inf, 3.0]) == [0.0, math.inf, 1.0]
    assert P.differences([None, 1.0], [2.0, 3.0]) == [2.0]


# --- synthetic sweeps ---------------------------------------------------------------------------

OFFSETS = (-0.3, 0.0, 0.3, 0.1, -0.2)  # 5 seeds' baselines: signed pair spread √(2 × sample var) = 0.3376
SPREAD = math.sqrt(2 * 0.057)
JITTER = (0.02, -0.01, 0.0, -0.02, 0.01)  # per-seed setting noise, times a scale


def shifts(effect: float, noise: float = 1.0) -> list:
    """A setting's per-seed offset from its seed's baseline: `effect`, plus JITTER × `noise`."""
    return [effect + j * noise for j in JITTER]


def sweep(root, experiment: str, base: dict, settings: dict, arms: dict | None = None, spec=None, rho=0.99,
          layout=None, offsets=OFFSETS):
    """Run directories of a sweep: every seed's baseline is `base[metric](t) + offset`; a setting
    (κ, rule, arm name or None) → {metric: per-seed offsets from its seed's baseline}. Returns (runs, arm map)."""
    dirs, arm_map = [], {}
    for s, o in enumerate(offsets):
        metrics = {m: (lambda t, f=f, o=o: f(t) + o) for m, f in base.items()}
        dirs.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s, metrics, experiment, spec=spec, rho=rho,
                              layout=layout and layout(1.0)))
        for (k, rule, arm), by_metric in settings.items():
            ms = {m: (lambda t, f=f, o=o, d=by_metric.get(m, [0.0] * len(offsets))[s]: f(t) + o + d)
                  for m, f in base.items()}
            name = f"k{k:g}-{'rule' if rule else 'norule'}" + (f"-arm-{arm}" if arm else "") + f"-s{s}"
            d = write_run(root, name, k, rule, s, ms, experiment, spec=spec, rho=rho, layout=layout and layout(k))
            dirs.append(d)
            if arm:
                arm_map[str(d)] = arm
    return load_runs(dirs), arm_map


POLYAK_BASE = {"ema_top1": lambda t: t, "top1": lambda t: t - 1}


def polyak_with(root, claim: K.Claim, settings: dict, arms=None):
    """POLYAK cut to one claim, judged on a sweep of its metrics."""
    family = dataclasses.replace(K.POLYAK, claims=(claim,))
    runs, arm_map = sweep(root, "polyak-r50", POLYAK_BASE, settings)
    (c,) = M.measure(family, runs, arm_map)["claims"]
    return c


def claim(kind, metric="ema_top1", kappa=2.0, over="run", **kw) -> K.Claim:
    return K.Claim(f"A claim of kind {kind}", "§0", kind, metric, kappa, over, **kw)


def std(k, with_=None, without=None, metric="ema_top1"):
    """The standard settings at κ: the EMA metric's per-seed offsets with and without the rule."""
    out = {}
    if with_ is not None:
        out[(k, "exponential", None)] = {metric: with_}
    if without is not None:
        out[(k, None, None)] = {metric: without}
    return out


def check(c: dict, verdict: str, sign: int, parts: int):
    """The record's verdict, its shape as `rules.KINDS` has it, the sign of its effect, an interval that holds
    the effect, an MDE above 0 where the seeds disagree, a margin on equivalence and non-inferiority parts."""
    assert c["verdict"] == verdict, c
    assert c["shape"] == R.KINDS[c["kind"]].shape and len(c["parts"]) == parts
    assert (c["effect"] > 0) if sign > 0 else (c["effect"] < 0) if sign < 0 else abs(c["effect"]) < SPREAD
    lo, hi = c["effect_ci"]
    assert lo <= c["effect"] <= hi and lo < hi  # per-seed noise: an interval of non-zero width
    assert c["mde"] > 0 and c["spread"] == pytest.approx(c["parts"][0]["spread"]) and c["n"] == len(OFFSETS)
    for p in c["parts"]:
        # a margin where one is tested: equivalence, non-inferiority, and a stated size shown absent
        assert (p["margin"] is not None) == (p["shape"] in ("equivalence", "noninferior") or p["route"] == R.ABSENT)
        assert p["route"] in (R.ABOVE, R.OUTSIDE, R.INSIDE, R.OPPOSITE, R.ABSENT, R.BELOW, R.OPEN)
        assert (p["verdict"] == R.CONTRADICTED) == (p["route"] in (R.OPPOSITE, R.ABSENT, R.BELOW) or
                                                    (p["route"] == R.OUTSIDE and p["shape"] == "equivalence"))
        assert p["effect_ci"][0] <= p["effect"] <= p["effect_ci"][1]


# Each kind, three ways. The EMA metric is top-1 (higher is better): −3 is a drop, +3 a rise; noise 50 makes
# the per-seed offsets ±1 around the effect, an interval wider than the effect.
CASES = [
    # rule_needed: without drops (directional), with matches (equivalence ±1 spread)
    ("rule_needed", std(2.0, shifts(0.0), shifts(-3.0)), R.REPRODUCED, +1, 2),
    ("rule_needed", std(2.0, shifts(0.0), shifts(-0.3, 50)), NR, 0, 2),
    ("rule_needed", std(2.0, shifts(0.0), shifts(+3.0)), R.CONTRADICTED, -1, 2),  # without is better
    # rule_departs: the same, the departure in either direction; no departure: the claim states no size, so open
    ("rule_departs", std(2.0, shifts(0.0), shifts(+3.0)), R.REPRODUCED, -1, 2),
    ("rule_departs", std(2.0, shifts(0.0), shifts(-0.3, 50)), NR, 0, 2),
    ("rule_departs", std(2.0, shifts(0.0), shifts(0.0)), NR, 0, 2),
    # rule_closer (ratio 2): gap without − 2 × gap with
    ("rule_closer", std(4.0, shifts(-0.1), shifts(-3.0)), R.REPRODUCED, +1, 1),
    ("rule_closer", std(4.0, shifts(-1.0), shifts(-2.1, 50)), NR, 0, 1),
    ("rule_closer", std(4.0, shifts(-3.0), shifts(-0.1)), R.CONTRADICTED, -1, 1),
    # gap_remains: A (with) ends worse than the baseline
    ("gap_remains", std(4.0, shifts(-3.0), shifts(0.0)), R.REPRODUCED, +1, 1),
    ("gap_remains", std(4.0, shifts(-0.1, 50), shifts(0.0)), NR, 0, 1),
    ("gap_remains", std(4.0, shifts(+3.0), shifts(0.0)), R.CONTRADICTED, -1, 1),
    # same_either_way: both within ±1 spread
    ("same_either_way", std(4.0, shifts(0.0), shifts(0.0)), R.REPRODUCED, 0, 2),
    ("same_either_way", std(4.0, shifts(0.0), shifts(-0.2, 50)), NR, 0, 2),
    ("same_either_way", std(4.0, shifts(0.0), shifts(-3.0)), R.CONTRADICTED, +1, 2),  # without: 3 worse
    # matches_or_better: A − baseline at the end, no more than 1 spread below
    ("matches_or_better", std(4.0, shifts(+3.0), None), R.REPRODUCED, +1, 1),
    ("matches_or_better", std(4.0, shifts(-0.34, 50), None), NR, -1, 1),
    ("matches_or_better", std(4.0, shifts(-3.0), None), R.CONTRADICTED, -1, 1),
]


@pytest.mark.parametrize("kind,settings,verdict,sign,parts", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_every_kind_each_way(tmp_path, kind, settings, verdict, sign, parts):
    kappa = next(iter(settings))[0]
    extra = {"ratio": 2.0} if kind == "rule_closer" else {}
    if kind == "matches_or_better":
        extra["settings"] = ("with", "without")
    over = "end" if kind in ("matches_or_better", "gap_remains", "same_either_way") else "run"
    c = polyak_with(tmp_path, claim(kind, kappa=kappa, over=over, **extra), settings)
    check(c, verdict, sign, parts)
    if kind == "rule_closer":  # the paired effect is the claim's ratio at work, per seed
        p = c["parts"][0]
        assert "− 2 × gap of" in p["label"]
    if kind in ("rule_needed", "rule_departs", "same_either_way") and verdict == R.REPRODUCED:
        assert c["parts"][1]["shape"] == "equivalence" and c["parts"][1]["margin"] == pytest.approx(SPREAD)


ARM_CASES = [((0.1, -3.0), R.REPRODUCED, +1), ((0.5, -0.6), NR, 0), ((-3.0, 0.1), R.CONTRADICTED, -1)]


@pytest.mark.parametrize("offsets,verdict,sign", ARM_CASES)
def test_arm_closer_each_way(tmp_path, offsets, verdict, sign):
    """A = arm bn-scale, B = with the rule, both at κ=2: gap of B − gap of A."""
    a, b = offsets
    noise = 1.0 if verdict != NR else 40.0
    settings = {(2.0, "exponential", "bn-scale"): {"ema_top1": shifts(a, noise)},
                (2.0, "exponential", None): {"ema_top1": shifts(b, noise)}}
    c = polyak_with(tmp_path, K.POLYAK.claims[5], settings)
    check(c, verdict, sign, 1)
    assert c["settings"] == {"A": "arm bn-scale at κ=2", "B": "with the rule at κ=2"}
    # the effect is the mean over seeds of |Δ_B| − |Δ_A|
    want = sum(abs(y) - abs(x) for x, y in zip(shifts(a, noise), shifts(b, noise), strict=True)) / len(OFFSETS)
    assert c["effect"] == pytest.approx(want)


@pytest.mark.parametrize("at4,verdict,sign", [(-3.0, R.REPRODUCED, +1), (-0.2, NR, 0), (+3.0, R.CONTRADICTED, -1)])
def test_with_better_has_a_part_per_kappa(tmp_path, at4, verdict, sign):
    """σ·(Δ_with − Δ_without) at the end at κ=2 and κ=4; the claim's effect is κ=4's (the κ its row names), its
    verdict the join."""
    settings = {**std(2.0, shifts(0.0, 3), shifts(-3.0)),
                **std(4.0, shifts(0.0, 3), shifts(at4, 50 if verdict == NR else 1))}
    c = polyak_with(tmp_path, claim("with_better", kappa=None, over="end"), settings)
    assert c["verdict"] == verdict and len(c["parts"]) == 2 and c["kappa"] == 4.0
    assert [p["label"] for p in c["parts"]] == [f"with − without the rule at κ={k}, at the end" for k in (2, 4)]
    assert c["parts"][0]["verdict"] == R.REPRODUCED and c["parts"][0]["effect"] == pytest.approx(3.0)
    p4 = c["parts"][1]
    assert (c["effect"], c["effect_ci"], c["mde"]) == (p4["effect"], p4["effect_ci"], p4["mde"])
    assert (p4["effect"] > 0 if sign > 0 else p4["effect"] < 0 if sign < 0 else True)
    assert p4["effect_ci"][0] <= p4["effect"] <= p4["effect_ci"][1] and p4["mde"] > 0


@pytest.mark.parametrize("target,verdict,sign", [
    ([-1.0 + j for j in JITTER], R.REPRODUCED, +1),  # EMA 1 above the target, every seed
    ([-0.1 + 50 * j for j in JITTER], NR, 0),
    ([+1.0 + j for j in JITTER], R.CONTRADICTED, -1),
    # the claim states 0.2 points: an EMA 0.1 above, every seed agreeing, is short of it, and its interval
    # inside ±0.2 with the power to see 0.2 shows the stated size absent
    ([-0.1 + j for j in JITTER], R.CONTRADICTED, +1),
    ([-0.25 + 10 * j for j in JITTER], NR, +1)])  # above 0, not above 0.2: the stated size is not shown
def test_ema_above_target_each_way(tmp_path, target, verdict, sign):
    """On the baselines alone: EMA − target model of each seed at the end."""
    family = dataclasses.replace(K.POLYAK, claims=(K.POLYAK.claims[3],))
    dirs = []
    for s, o in enumerate(OFFSETS):
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o, d=target[s]: t + o + d}))
    (c,) = M.measure(family, load_runs(dirs))["claims"]
    assert c["verdict"] == verdict and c["n"] == 5 and len(c["parts"]) == 1
    assert c["parts"][0]["per_seed"] == pytest.approx([-d for d in target])
    assert c["effect"] == pytest.approx(-sum(target) / 5) and c["effect_ci"][0] <= c["effect"] <= c["effect_ci"][1]
    assert c["spread"] == pytest.approx(SPREAD) and c["mde"] > 0


@pytest.mark.parametrize("ema,top1,verdict", [
    (-3.0, shifts(-3.0), R.REPRODUCED),  # the EMA strays with the rule, and so does the target
    (-3.0, shifts(-0.2, 50), NR),
    (-3.0, shifts(+3.0), R.CONTRADICTED),  # the EMA strays, the target gets better
    (0.0, shifts(-3.0), R.NOT_TESTABLE),  # no EMA gap to explain
])
def test_target_explains_each_way(tmp_path, ema, top1, verdict):
    settings = {(4.0, "exponential", None): {"ema_top1": shifts(ema), "top1": top1},
                (4.0, None, None): {"ema_top1": shifts(ema)}}
    c = polyak_with(tmp_path, K.POLYAK.claims[2], settings)
    assert c["verdict"] == verdict and len(c["parts"]) == 1 and c["shape"] == "directional"
    assert c["parts"][0]["label"] == "the target model with the rule at κ=4 departs from the baseline"
    m = c["mechanism"]
    assert m["name"] == "an EMA gap with the rule, for the target model to explain"
    assert m["present"] is (ema != 0.0) and m["value"] == pytest.approx(-ema, abs=0.02)
    if verdict == R.NOT_TESTABLE:
        assert c["verdict_if_applicable"] == R.REPRODUCED and c["set_aside"] is None
        assert D.verdict(c) == f"{R.NOT_TESTABLE} (missing {m['name']}: {m['what']}); the rules alone: {R.REPRODUCED}"
    else:
        assert c["effect_ci"][0] <= c["effect"] <= c["effect_ci"][1] and c["mde"] > 0


@pytest.mark.parametrize("top1,verdict", [(shifts(-3.0), R.REPRODUCED), (shifts(+3.0), R.REPRODUCED),
                                          (shifts(-0.2, 50), NR), (shifts(0.0), NR)])
def test_optimizer_strays_each_way(tmp_path, top1, verdict):
    """The target model departs from the baseline with the rule, in either direction."""
    c = polyak_with(tmp_path, claim("optimizer_strays", "top1", 4.0), {(4.0, "exponential", None): {"top1": top1}})
    assert c["verdict"] == verdict and c["shape"] == "departure" and len(c["parts"]) == 1
    assert c["effect"] == pytest.approx(-sum(top1) / 5) and c["mde"] > 0
    if verdict == NR:  # no size stated, so no absence can be shown: open, with no margin
        assert c["margin"] is None


# --- the sign where lower is better -------------------------------------------------------------


def test_a_higher_loss_or_wer_is_the_positive_effect(tmp_path):
    """dino's loss (rule_departs) and ctc-polyak's WER (rule_needed): lower is better, so worse is higher."""
    dino = dataclasses.replace(K.DINO, claims=(K.DINO.claims[0],))
    base = {"dino_loss": lambda t: 5 - 0.3 * t, "probe_top1": lambda t: 10 * t}
    for name, d in (("up", +3.0), ("down", -3.0)):
        runs, _ = sweep(tmp_path / name, "dino-vit", base, {(2.0, "exponential", None): {"dino_loss": shifts(0.0)},
                                                            (2.0, None, None): {"dino_loss": shifts(d)}})
        (c,) = M.measure(dino, runs)["claims"]
        assert c["verdict"] == R.REPRODUCED and c["effect"] == pytest.approx(d)  # worse (higher) is positive
        assert c["parts"][0]["per_seed"] == pytest.approx(shifts(d)) and c["shape"] == "departure"
    ctc = dataclasses.replace(K.CTC_POLYAK, claims=(K.CTC_POLYAK.claims[0],))
    wer = {"ema_wer": lambda t: 58 - t, "wer": lambda t: 60 - t}
    for name, d, verdict in (("worse", +3.0, R.REPRODUCED), ("better", -3.0, R.CONTRADICTED)):
        runs, _ = sweep(tmp_path / name, "ctc-polyak", wer, std(4.0, shifts(0.0), shifts(d), "ema_wer"))
        (c,) = M.measure(ctc, runs)["claims"]
        assert c["verdict"] == verdict and c["effect"] == pytest.approx(d)


# --- set aside: the target model strays ---------------------------------------------------------


def test_an_ema_claim_where_the_target_strays_is_set_aside_with_the_targets_numbers(tmp_path):
    settings = {(4.0, "exponential", None): {"ema_top1": shifts(0.0), "top1": shifts(-3.0)},
                (4.0, None, None): {"ema_top1": shifts(-3.0), "top1": shifts(-3.0)}}
    c = polyak_with(tmp_path, claim("rule_needed", kappa=4.0), settings)
    assert c["verdict"] == R.SET_ASIDE and c["verdict_if_applicable"] == R.REPRODUCED
    assert c["set_aside"] == J.ASIDE_STRAYS
    eff = sum(-d for d in shifts(-3.0)) / 5
    assert c["why"].startswith(f"with the rule at κ=4: top1 worse by {eff:+.3g} [")
    assert c["why"].endswith(f"against a spread of {SPREAD:+.3g}")
    assert D.verdict(c) == f"{R.SET_ASIDE} ({J.ASIDE_STRAYS}: {c['why']}); the rules alone: {R.REPRODUCED}"
    # judged where the optimizer rule strays, as the paper makes the claim (gated=False)
    c = polyak_with(tmp_path / "ungated", claim("rule_needed", kappa=4.0, gated=False), settings)
    assert c["verdict"] == R.REPRODUCED and c["set_aside"] is None and c["verdict_if_applicable"] is None
    # a claim on the target's own metric (blind to the EMA) stands however far the target strays
    c = polyak_with(tmp_path / "own", claim("gap_remains", "top1", 4.0), settings)
    assert c["verdict"] == R.REPRODUCED and c["set_aside"] is None


def test_the_optimizer_check_names_the_first_kappa_where_the_target_strays(tmp_path):
    settings = {**{(2.0, r, None): {"top1": shifts(0.0)} for r in ("exponential", None)},
                **{(4.0, r, None): {"top1": shifts(-3.0)} for r in ("exponential", None)},
                **{(8.0, r, None): {"top1": shifts(-0.3, 50)} for r in ("exponential", None)}}
    runs, _ = sweep(tmp_path, "polyak-r50", POLYAK_BASE, settings)
    oc = M.measure(K.POLYAK, runs)["optimizer_check"]
    assert oc["metric"] == "top1" and oc["first_strays_kappa"] == 4.0 and oc["ema_blind"]
    states = {(r["setting"], r["kappa"]): r["state"] for r in oc["rows"]}
    assert states == {("with", 2.0): "tracks", ("without", 2.0): "tracks", ("with", 4.0): "strays",
                      ("without", 4.0): "strays", ("with", 8.0): "between", ("without", 8.0): "between"}
    at4 = next(r for r in oc["rows"] if r["kappa"] == 4.0 and r["setting"] == "with")
    assert at4["effect"] == pytest.approx(3.0) and at4["ci"][0] > SPREAD  # the CI95 lies above 1 spread
    assert oc["spread"] == pytest.approx(SPREAD) and "strays with the rule first at κ=4" in oc["summary"]


def test_a_target_that_depends_on_the_ema_sets_nothing_aside(tmp_path):
    family = dataclasses.replace(K.BYOL, arms=(), claims=(K.BYOL.claims[1],))  # the tracking probe's
    base = {"probe_top1": lambda t: 30 + t, "byol_loss": lambda t: 5 - 0.3 * t}
    runs, _ = sweep(tmp_path, "byol-r18", base, {
        (4.0, "exponential", None): {"probe_top1": shifts(0.0), "byol_loss": shifts(9.0)},
        (4.0, None, None): {"probe_top1": shifts(-5.0), "byol_loss": shifts(9.0)}})
    m = M.measure(family, runs)
    assert not m["optimizer_check"]["ema_blind"] and "depends on the EMA" in m["optimizer_check"]["summary"]
    assert m["optimizer_check"]["first_strays_kappa"] == 4.0
    (c,) = m["claims"]
    assert c["verdict"] == R.REPRODUCED and c["set_aside"] is None and c["verdict_if_applicable"] is None


def test_a_claim_on_the_students_wer_after_pretraining_is_set_aside_where_it_strayed_before():
    """ctc-pseudo-label's gate reads the student's WER in pre-training, where it is blind to ρ; the claim
    "without the rule, a higher test WER" reads it at the end; the claim on pre-training itself stands."""
    gate = {"blind": True, "metric": "wer", "rows": {("with", 4.0): {
        "metric": "wer", "effect": 8.9, "ci": (7.7, 9.9), "spread": 2.2, "state": "strays"}}}
    end, pre = K.CTC_PL.claims[1], K.CTC_PL.claims[2]
    assert end.metric == "wer" and end.over == "end" and not end.until
    assert J._strays(K.CTC_PL, end, gate, [("with", 4.0)]) == (
        "with the rule at κ=4: wer worse by +8.9 [+7.7, +9.9] against a spread of +2.2")
    assert J._strays(K.CTC_PL, pre, gate, [("with", 4.0)]) == ""
    assert J._strays(K.CTC_PL, K.CTC_PL.claims[3], gate, [("with", 4.0)]) == ""  # gated=False
    tracks = gate | {"rows": {("with", 4.0): gate["rows"][("with", 4.0)] | {"state": "tracks"}}}
    assert J._strays(K.CTC_PL, end, tracks, [("with", 4.0)]) == ""


# --- not testable: the preset lacks the mechanism -----------------------------------------------


@pytest.mark.parametrize("rho,value,verdict", [(0.9, 0.2, R.NOT_TESTABLE), (0.99, 2.0, R.REPRODUCED)])
def test_a_claim_whose_mechanism_is_absent_is_not_testable(tmp_path, rho, value, verdict):
    """polyak's "at the end" claim needs an EMA horizon 1/(1 − ρ_B) against the last lr stage: 10 steps an
    epoch, a decay at epoch 5 of 10: ρ_B = 0.9 is 1 epoch against 5 (0.2 < 0.4), 0.99 is 10 against 5."""
    family = dataclasses.replace(K.POLYAK, claims=(K.POLYAK.claims[1],))
    spec = {"schedule": {"epochs": 10, "milestones_epochs": [5]}}
    runs, _ = sweep(tmp_path, "polyak-r50", POLYAK_BASE, std(2.0, shifts(0.0), shifts(-3.0)), spec=spec, rho=rho,
                    layout=lambda k: [{"start_epoch": 0.0, "end_epoch": 10.0, "kappa": k, "steps_per_epoch": 10}])
    (c,) = M.measure(family, runs)["claims"]
    m = c["mechanism"]
    assert m["name"] == "the EMA's horizon against the last lr stage" and m["value"] == pytest.approx(value)
    assert m["paper"] == 0.8 and m["threshold"] == 0.4 and m["present"] is (verdict == R.REPRODUCED)
    assert c["verdict"] == verdict
    if verdict == R.NOT_TESTABLE:
        assert c["verdict_if_applicable"] == R.REPRODUCED  # what the rules would have said
        assert f"{value:.3g}, the paper's 0.8" in D.verdict(c) and D.verdict(c).startswith(R.NOT_TESTABLE)
    else:
        assert c["verdict_if_applicable"] is None


def test_a_claim_whose_mechanism_cannot_be_measured_is_not_testable(tmp_path):
    """Runs that record no lr milestones give the horizon-against-last-stage mechanism nothing to measure: the
    claim is not testable ("not measured", with what is missing), never judged as if it were present."""
    family = dataclasses.replace(K.POLYAK, claims=(K.POLYAK.claims[1],))
    runs, _ = sweep(tmp_path, "polyak-r50", POLYAK_BASE, std(2.0, shifts(0.0), shifts(-3.0)),
                    spec={"schedule": {"epochs": 10}},
                    layout=lambda k: [{"start_epoch": 0.0, "end_epoch": 10.0, "kappa": k, "steps_per_epoch": 10}])
    (c,) = M.measure(family, runs)["claims"]
    assert c["mechanism"]["present"] is None and c["verdict"] == R.NOT_TESTABLE
    assert c["verdict_if_applicable"] == R.REPRODUCED
    assert D.verdict(c) == (f"{R.NOT_TESTABLE} (the EMA's horizon against the last lr stage not measured: "
                            f"the run records no ρ_B, steps or milestones); the rules alone: {R.REPRODUCED}")


# --- stand-ins beyond the paper's range ---------------------------------------------------------


def test_an_up_to_claim_with_stand_ins_expands_past_its_kappa(tmp_path):
    claims = M.expand(K.CTC_POLYAK.claims[:1], [1.0, 2.0, 4.0, 8.0])
    assert [c.kappa for c in claims] == [2.0, 4.0, 8.0]
    assert [c.kappa for c in M.expand(K.POLYAK.claims[1:2], [0.5, 1.0, 2.0, 4.0, 8.0])] == [0.5, 2.0, 4.0]  # none
    ctc = dataclasses.replace(K.CTC_POLYAK, claims=(K.CTC_POLYAK.claims[0],))
    wer = {"ema_wer": lambda t: 58 - t, "wer": lambda t: 60 - t}
    runs, _ = sweep(tmp_path, "ctc-polyak", wer, {**std(4.0, shifts(0.0), shifts(3.0), "ema_wer"),
                                                  **std(8.0, shifts(0.0), shifts(3.0), "ema_wer")})
    rows = M.measure(ctc, runs)["claims"]
    assert [(c["kappa"], c["verdict"]) for c in rows] == [(4.0, R.REPRODUCED), (8.0, R.REPRODUCED)]
    assert rows[0]["stand_in"] == ""
    assert rows[1]["stand_in"] == "κ=8 lies beyond the paper's range (κ ≤ 4); judged as a stand-in for it"
    assert D.verdict(rows[1]).endswith("; a stand-in: " + rows[1]["stand_in"])


# --- not measured -------------------------------------------------------------------------------


def test_a_setting_not_run_leaves_its_claim_not_measured(tmp_path):
    c = polyak_with(tmp_path, K.POLYAK.claims[5], std(2.0, shifts(0.0), shifts(-3.0)))  # no bn-scale arm
    assert c["verdict"] == R.NOT_MEASURED and c["effect"] is None and c["parts"] == []
    assert "was not run" in c["why"] and D.verdict(c) == f"{R.NOT_MEASURED} ({c['why']})"


def test_arms_are_their_own_settings(tmp_path):
    """Polyak's bn-scale arm at κ=2 shares κ and rule with the standard run: only the arm map (or the run's
    name) tells them apart."""
    settings = {**std(2.0, shifts(0.5), shifts(-3.0)),
                (2.0, "exponential", "bn-scale"): {"ema_top1": shifts(0.3), "top1": shifts(0.3)}}
    runs, arms = sweep(tmp_path, "polyak-r50", POLYAK_BASE, settings)
    m = M.measure(K.POLYAK, runs, arms)
    assert m["kappas"] == [2.0]  # the arm's κ is not a κ of the sweep beyond the standard ones
    assert len(m["tables"]["top1"]["rows"][("with", 2.0)]["curves"]) == 5
    again = M.measure(K.POLYAK, runs)  # from the run names alone
    assert [c["verdict"] for c in again["claims"]] == [c["verdict"] for c in m["claims"]]
    labels = {g["label"] for g in C.compare([r.path for r in runs], "top1")["groups"]}
    assert "with EMA rule, arm bn-scale" in labels and "with EMA rule" in labels


def test_an_arm_takes_its_kappa_and_schedule_from_the_preset():
    k8, after, during = K.BYOL.arms
    assert k8.for_preset("tiny").kappa == 2.0 and k8.for_preset("cpu").kappa == 8.0
    assert after.schedule("byol-r18", "cpu") == "step:2"  # the cpu preset's warm-up ends at epoch 2
    assert during.schedule("byol-r18", "cpu") == "step:1"  # half-way through it
    (ramp,) = K.BYOL_R50_LARS.arms
    assert ramp.schedule("byol-r50-lars", "cpu") == "smooth:0.8-2.4"  # from epoch 0.8 over twice 0.8 → 1.6
    assert ramp.schedule("byol-r50-lars", None) == "smooth:60-180"  # the paper's 120-epoch ramp
    assert ramp.schedule("byol-r50-lars", "tiny") == "smooth:1-3.5"  # 4 epochs: it ends before training does


@pytest.mark.parametrize("ema", [-0.2, -0.3])
def test_target_explains_needs_an_ema_gap_above_0_not_above_a_spread(tmp_path, ema):
    """The mechanism is present when the EMA's gap with the rule has its CI95 above 0, as its record says, even
    where that gap is under one baseline pair spread."""
    assert -ema < SPREAD
    settings = {(4.0, "exponential", None): {"ema_top1": shifts(ema), "top1": shifts(-3.0)},
                (4.0, None, None): {"ema_top1": shifts(ema)}}
    c = polyak_with(tmp_path, K.POLYAK.claims[2], settings)
    m = c["mechanism"]
    assert m["threshold"] == 0.0 and m["value_ci"][0] > 0 and m["present"] is True
    assert c["verdict"] == R.REPRODUCED and c["verdict_if_applicable"] is None
