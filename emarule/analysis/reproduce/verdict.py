"""Gaps to the baseline, the baseline's own seed spread, and the decision rule. Torch-free.

The statistics (docs/reproduce.md, "How a verdict is reached"), applied exactly as written:

- Pairing: every seed runs the κ=1 baseline and each setting from the same initial weights and the same
  data order, so each setting's run is compared with ITS OWN seed's baseline. Per-step training metrics
  are first smoothed by a trailing mean over `Metric.smooth_epochs`, the same window for every run.
- Paired gap of a setting (κ with or without the rule, or an arm), per seed s: the run's curve
  interpolated onto baseline s's evaluation grid (`emarule.analysis.compare.gap`); "run" is the mean |Δ| over the
  part both cover, "end" the |Δ| at the last grid point. The gap is the mean over seeds, shown with a
  95 % percentile bootstrap interval of that mean (10,000 resamples of the seeds, RNG seed 0, the values
  sorted first so that the seeds' order changes nothing; no interval from one seed).
- Pair spread, the noise reference: each baseline seed against each OTHER baseline seed, one run against
  one run as a paired gap is, the same two statistics averaged over the n(n − 1) ordered pairs.
  Undefined below 2 seeds. Two baselines differ in initial weights and data order; a paired run shares
  both with its baseline, so this is an upper bound on the gap of a setting the rule makes exact.
- Paired difference of two settings A and B (A = with the rule, B = without, unless the claim names
  others): per seed gap_B − gap_A (two runs that both stopped early differ by 0), its mean and interval.
- A run that stops before its baseline's end (it diverged) has an infinite gap; a setting with a run that
  never logged the metric (its pseudo-labeling never started) has no gap, and its claims are not measured.
- Beside them, for comparison only: the unpaired gap against the baselines' mean curve, and the
  leave-one-out spread (each baseline seed against the mean of the others).

Decision rules (FACTOR = 2; g_A, g_B, spread are the claim's statistic, "run" or "end"; CI(D) the paired
difference g_B − g_A's interval; "with" is A and "without" B):

    rule_needed      reproduced   g_B ≥ 2·g_A and g_A ≤ 2·spread and CI(D) above 0
                     contradicted g_A ≥ g_B and max(g_A, g_B) > 2·spread,
                                  or g_B < 2·g_A, g_B ≤ 2·spread and CI(D) inside (−spread, +spread): no
                                  drop to prevent (where g_B ≥ 2·g_A the predicted ratio is there, and a
                                  CI(D) that reaches 0 leaves the claim inconclusive)
    rule_closer      paired (a CI(D) exists):
                     reproduced   g_B ≥ 2·g_A and CI(D) above 0
                     contradicted g_A ≥ g_B, and max(g_A, g_B) > 2·spread or CI(D) below 0
                     unpaired:
                     reproduced   g_B ≥ 2·g_A and g_B > 2·spread
                     contradicted g_A ≥ g_B and max(g_A, g_B) > 2·spread
    same_either_way  reproduced   g_A ≤ 2·spread and g_B ≤ 2·spread
                     contradicted g_B > 2·spread and g_B > 2·g_A and CI(D) above 0
    arm_closer       reproduced   CI(D) above 0 (A closer); contradicted CI(D) below 0
    matches_or_better d = final(A) − final(own seed's baseline), per seed, > 0 better; mean and CI
                     reproduced   d ≥ −2·spread_end; contradicted d < −2·spread_end and CI(d) below 0
    target_explains  (needs an EMA gap: g_with > 2·spread, else inconclusive)
                     reproduced   the target metric strays with the rule (below)
                     contradicted the target metric's g_with ≤ its spread
    optimizer_strays reproduced   the target metric strays with the rule (below)
                     contradicted the target metric's g_with ≤ spread
    with_better      d_κ = final(with) − final(without) per seed, > 0 better; mean and CI per κ
                     paired (a CI at every κ):
                     reproduced   CI(d_κ) above 0 at every κ run
                     contradicted CI(d_κ) below 0 at some κ
                     unpaired:
                     reproduced   d_κ > 0 at every κ run, and d_κ > 2·spread_end at one κ
                     contradicted d_κ < −2·spread_end at some κ
    ema_above_target d_i = final EMA metric − final target metric of baseline seed i (> 0 better)
                     reproduced   d_i > 0 for every seed; contradicted d_i < 0 for every seed

Why the paired rules of rule_closer and with_better leave the spread out: both claims compare two settings
with each other ("the gap with the rule is ≈ 3× smaller", "the rule gives the better probe"), not a setting
with the baseline's noise. The pair spread measures two unpaired baselines, an upper bound on what a paired
comparison sees; the paired difference's interval is the noise of the comparison the claim makes, as for
arm_closer. Claims that a curve matches the baseline (rule_needed, same_either_way) keep the spread.

The target model STRAYS at a setting when its paired gap over the run is > 2·spread and its interval
lies above 1·spread; it TRACKS when the gap is ≤ 1·spread. The optimizer-rule check lists this for every
setting. A claim of kind rule_needed, rule_closer, same_either_way, arm_closer, matches_or_better or
with_better on an EMA-dependent metric, at a setting where a target metric blind to the EMA strays, is
"inconclusive", with the target's numbers as the reason (the verdict it would have had is kept), and SET
ASIDE: the claim does not apply at that setting. So is a target_explains row with no EMA gap to explain.
The tally (`table.tally`) judges a claim at the κ where it applies: decided when every row not set
aside is reproduced or contradicted, and at least one is not set aside.

Anything else is "inconclusive"; so is every claim with fewer than 2 baseline seeds (no spread), and every
claim on a metric whose κ=1 baseline stopped before its end on some seed (it diverged): its pair spread is
then unbounded, and judging the other seeds alone would hide the run that diverged (`measure.judge`).
"""

from __future__ import annotations

import math

from emarule.analysis.compare import finite_number, gap, mean_curve

FACTOR = 2.0
VERDICTS = ("reproduced", "contradicted", "inconclusive")
# Without its run's planned end (`stopped`), a curve that ends before this share of the baseline's last
# epoch counts as a run stopped early.
INCOMPLETE = 0.99


# --- curves -------------------------------------------------------------------------------------


def smooth(curve: tuple[list, list], window: float) -> tuple[list, list]:
    """Trailing mean over the points within `window` (in x units) before each point."""
    xs, ys = curve
    if window <= 0 or not xs:
        return list(xs), list(ys)
    out, lo, total = [], 0, 0.0
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        total += y
        while xs[lo] < x - window - 1e-12:
            total -= ys[lo]
            lo += 1
        out.append(total / (i - lo + 1))
    return list(xs), out


def run_curve(run, metric: str, window: float = 0.0) -> tuple[list, list]:
    return smooth(run.curve(metric), window)


# --- statistics ---------------------------------------------------------------------------------


def _mean(v: list) -> float | None:
    return sum(v) / len(v) if v else None


def _stopped(stopped: list | None, i: int, end: float, reference: float) -> bool:
    """Whether curve i's run stopped before its own end: from the run's record where known (`stopped[i]`
    True or False), else from where its curve ends against the reference's."""
    known = stopped[i] if stopped is not None else None
    return bool(known) if known is not None else end < INCOMPLETE * reference


def gaps(curves: list, base: tuple[list, list], stopped: list | None = None) -> dict:
    """Mean over seeds of each seed's mean |Δ| ("run") and |Δ| at the end ("end") against `base`.
    `stopped[i]`: whether run i stopped before its planned end (None: judged from the curves)."""
    runs, ends, incomplete = [], [], 0
    bx = base[0]
    missing = sum(1 for c in curves if not c[0])
    if missing:  # a run that never logged the metric (pseudo-labeling never started): nothing to compare
        return {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": missing,
                "per_seed_run": [], "per_seed_end": []}
    for i, c in enumerate(curves):
        g = gap(c, base)
        if _stopped(stopped, i, c[0][-1], bx[-1]):
            incomplete += 1
            runs.append(math.inf)
            ends.append(math.inf)
            continue
        if g["gap_mean"] is None:  # it ran to the end but starts after the baseline's last point: no overlap
            return {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": 0, "no_overlap": 1,
                    "per_seed_run": [], "per_seed_end": []}
        runs.append(g["gap_mean"])
        ends.append(abs(g["gap_final"]))
    return {"run": _mean(runs), "end": _mean(ends), "seeds": len(curves), "incomplete": incomplete, "missing": 0,
            "per_seed_run": runs, "per_seed_end": ends}


# --- paired statistics --------------------------------------------------------------------------

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed: the same runs give the same intervals
CI_LEVEL = 0.95


def bootstrap_ci(values: list, resamples: int = BOOTSTRAP_RESAMPLES, level: float = CI_LEVEL,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean over seeds: `resamples` draws of n seeds with
    replacement. The values are sorted first, so the order of the seeds changes nothing; a constant's
    interval is that constant. None without values. An infinite value (a run that stopped early)
    makes every resample that draws it infinite. None below 2 values: one seed gives no interval."""
    import numpy as np

    vals = sorted(float(v) for v in values if v is not None)
    if len(vals) < 2:
        return None
    if vals[0] == -math.inf and vals[-1] == math.inf:  # seeds stopped early on both sides: no bound either way
        return -math.inf, math.inf
    if vals[0] == vals[-1]:
        return vals[0], vals[0]
    a = np.array(vals)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    with np.errstate(invalid="ignore"):
        means = np.sort(a[idx].mean(axis=1))
    tail = (1.0 - level) / 2.0
    lo = means[int(math.floor(tail * resamples))]
    hi = means[min(resamples - 1, int(math.ceil((1.0 - tail) * resamples)) - 1)]
    clip = lambda v: min(max(float(v), vals[0]), vals[-1])  # noqa: E731  (rounding of a mean of equal values)
    return clip(lo), clip(hi)


def bootstrap_ci_unpaired(a: list, b: list, resamples: int = BOOTSTRAP_RESAMPLES, level: float = CI_LEVEL,
                          seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """The same interval for mean(b) − mean(a) when the two samples are NOT paired: each is resampled on
    its own. Only for comparison with the paired interval (`bootstrap_ci` of b_i − a_i)."""
    import numpy as np

    a, b = sorted(float(v) for v in a), sorted(float(v) for v in b)
    if not a or not b:
        return None
    rng = np.random.default_rng(seed)
    ma = np.array(a)[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1)
    mb = np.array(b)[rng.integers(0, len(b), size=(resamples, len(b)))].mean(axis=1)
    d = np.sort(mb - ma)
    tail = (1.0 - level) / 2.0
    return float(d[int(math.floor(tail * resamples))]), float(d[min(resamples - 1,
                                                                    int(math.ceil((1 - tail) * resamples)) - 1)])


def differences(a: list, b: list) -> list:
    """Per seed b_i − a_i (paired: the same seed's runs). Two runs that both stopped early differ by 0."""
    out = []
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            continue
        out.append(0.0 if math.isinf(x) and math.isinf(y) else y - x)
    return out


def paired_gaps(curves: list, base_curves: list, stopped: list | None = None) -> dict:
    """Each seed's run against ITS OWN seed's baseline (`curves[i]` and `base_curves[i]` share the seed,
    hence the initial weights and the data order): per seed mean |Δ| ("run") and |Δ| at the end ("end"),
    their means over seeds and a bootstrap interval of each mean. `stopped` as in `gaps`."""
    runs, ends, incomplete = [], [], 0
    missing = sum(1 for c in curves if not c[0])
    if missing:  # a run that never logged the metric (pseudo-labeling never started): nothing to compare
        return {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": missing,
                "per_seed_run": [], "per_seed_end": [], "ci_run": None, "ci_end": None}
    for i, (c, b) in enumerate(zip(curves, base_curves, strict=True)):
        if not b[0]:
            return {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": 1,
                    "per_seed_run": [], "per_seed_end": [], "ci_run": None, "ci_end": None}
        if _stopped(stopped, i, c[0][-1], b[0][-1]):
            incomplete += 1
            runs.append(math.inf)
            ends.append(math.inf)
            continue
        g = gap(c, b)
        if g["gap_mean"] is None:  # it ran to the end but starts after the baseline's last point: no overlap
            return {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": 0, "no_overlap": 1,
                    "per_seed_run": [], "per_seed_end": [], "ci_run": None, "ci_end": None}
        runs.append(g["gap_mean"])
        ends.append(abs(g["gap_final"]))
    return {"run": _mean(runs), "end": _mean(ends), "seeds": len(curves), "incomplete": incomplete, "missing": 0,
            "per_seed_run": runs, "per_seed_end": ends, "ci_run": bootstrap_ci(runs), "ci_end": bootstrap_ci(ends)}


def pair_spread(curves: list, stopped: list | None = None) -> dict | None:
    """The noise reference of a paired gap: each baseline seed against each OTHER baseline seed, one run
    against one run as a paired gap is, mean |Δ| over the run and |Δ| at the end, averaged over the
    n(n − 1) ordered pairs that share evaluation points. None below 2 seeds, or without such a pair.
    `stopped` as in `gaps`."""
    keep = [i for i, c in enumerate(curves) if c[0]]
    if len(keep) < 2:
        return None
    runs, ends = [], []
    for i in keep:
        for j in keep:
            if i != j:
                g = gaps([curves[i]], (curves[j][0], curves[j][1]), None if stopped is None else [stopped[i]])
                if g["run"] is not None:
                    runs.append(g["run"])
                    ends.append(g["end"])
    if not runs:
        return None
    return {"run": _mean(runs), "end": _mean(ends), "seeds": len(keep), "pairs": len(runs)}


def baseline_curve(curves: list) -> tuple[list, list, list]:
    return mean_curve(curves)


def spread(curves: list) -> dict | None:
    """Leave-one-out: each baseline seed against the mean of the others, averaged. None below 2 seeds."""
    curves = [c for c in curves if c[0]]
    if len(curves) < 2:
        return None
    runs, ends = [], []
    for i, c in enumerate(curves):
        others = mean_curve(curves[:i] + curves[i + 1:])
        g = gaps([c], (others[0], others[1]))
        if g["run"] is not None:
            runs.append(g["run"])
            ends.append(g["end"])
    if not runs:
        return None
    return {"run": _mean(runs), "end": _mean(ends), "seeds": len(curves)}


def loo_spread(values: list) -> float | None:
    """The spread of scalars as the baseline's: each against the mean of the others, |Δ| averaged."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    total = sum(vals)
    return sum(abs(v - (total - v) / (len(vals) - 1)) for v in vals) / len(vals)


def final(curve: tuple[list, list]) -> float | None:
    return finite_number(curve[1][-1]) if curve[1] else None


# --- decisions ----------------------------------------------------------------------------------


NO_SPREAD = "the baseline spread is undefined (fewer than 2 baseline seeds)"
# A κ=1 baseline that stopped early puts an infinite gap into the pair spread; every "within 2× spread" would
# then hold and every "beyond it" fail, so no claim is judged against it.
STOPPED_BASELINE = "a κ=1 baseline stopped before its end (it diverged), so the baseline spread is unbounded"
NO_GAP = "a setting has no gap (not run, or a run never logged the metric)"


class Why(str):
    """A decision's reason, "numbers: decision", that keeps its two parts apart for the README's table
    (`numbers`: what was measured; `decision`: the rule's words). It is the string everywhere else."""

    numbers: str
    decision: str

    def __new__(cls, numbers: str, decision: str):
        self = super().__new__(cls, f"{numbers}: {decision}" if decision and decision != numbers else numbers)
        self.numbers, self.decision = numbers, decision
        return self

    def __getnewargs__(self) -> tuple[str, str]:  # copy and pickle rebuild it from its two parts
        return self.numbers, self.decision

    @classmethod
    def unmeasured(cls, reason: str) -> Why:
        """Inconclusive for want of data: the reason is both what there is to show and the decision."""
        return cls(reason, reason)


def unbounded(*spreads: float | None) -> bool:
    """Whether a spread is infinite: a baseline seed stopped early (`pair_spread`)."""
    return any(v is not None and math.isinf(v) for v in spreads)


def _ci(ci) -> str:
    return "—" if ci is None else f"[{_n(ci[0], signed=True)}, {_n(ci[1], signed=True)}]"


def decide(kind: str, g_with: float | None, g_without: float | None, s: float | None,
           diff_ci: tuple | None = None) -> tuple[str, Why]:
    """(verdict, why) for the gap-based kinds, by the rules in the module docstring. `diff_ci`: the
    bootstrap interval of the paired difference g_without − g_with over seeds; None where there are no
    seeds to pair (the parabola's exact numbers), and then the rules without it apply."""
    if s is None:
        return "inconclusive", Why.unmeasured(NO_SPREAD)
    if g_with is None or g_without is None:
        return "inconclusive", Why.unmeasured(NO_GAP)
    f, big = FACTOR, max(g_with, g_without)
    r = f"gap with {_n(g_with)}, without {_n(g_without)}, baseline spread {_n(s)}"
    if unbounded(s):
        return "inconclusive", Why(r, STOPPED_BASELINE)
    if math.isinf(g_with) and math.isinf(g_without):
        return "inconclusive", Why(r, "runs stopped early in both settings, so their gaps cannot be compared")
    if diff_ci is not None:
        r += f"; paired difference without − with, 95 % CI {_ci(diff_ci)}"
    apart = diff_ci is None or diff_ci[0] > 0  # the paired difference excludes 0: without is farther
    if kind == "rule_needed":
        if g_without >= f * g_with and g_with <= f * s:
            if apart:
                return "reproduced", Why(r, "without ≥ 2× with, with ≤ 2× spread" + (
                    ", and the paired CI excludes 0" if diff_ci is not None else ""))
            return "inconclusive", Why(r, "without ≥ 2× with and with ≤ 2× spread, but the paired CI includes 0")
        if g_with >= g_without and big > f * s:
            return "contradicted", Why(r, "the rule does not bring the curve closer, and the gaps exceed 2× spread")
        if g_without >= f * g_with:
            return "inconclusive", Why(r, "the rule closes most of the gap, but with > 2× spread")
        if diff_ci is not None and g_without <= f * s and -s < diff_ci[0] and diff_ci[1] < s:
            return "contradicted", Why(r, "without the rule the curve stays within 2× spread, and the paired CI "
                                          "lies inside ±1× spread: " + _absence(diff_ci))
        return "inconclusive", Why(r, "without < 2× with")
    if kind == "rule_closer" and diff_ci is not None:
        if g_without >= f * g_with and diff_ci[0] > 0:
            return "reproduced", Why(r, "without ≥ 2× with, and the paired CI lies above 0")
        if g_with >= g_without and (big > f * s or diff_ci[1] < 0):
            return "contradicted", Why(r, "the rule does not bring the curve closer" + (
                ", and the paired CI lies below 0" if diff_ci[1] < 0 else ", and the gaps exceed 2× spread"))
        if g_without >= f * g_with:
            return "inconclusive", Why(r, "without ≥ 2× with, but the paired CI includes 0")
        return "inconclusive", Why(r, "without < 2× with")
    if kind == "rule_closer":  # unpaired: no interval
        if g_without >= f * g_with and g_without > f * s:
            return "reproduced", Why(r, "without ≥ 2× with, and without > 2× spread")
        if g_with >= g_without and big > f * s:
            return "contradicted", Why(r, "the rule does not bring the curve closer, and the gaps exceed 2× spread")
        return "inconclusive", Why(r, "neither rule applies")
    if kind == "same_either_way":
        if g_with <= f * s and g_without <= f * s:
            return "reproduced", Why(r, "both within 2× spread")
        if g_without > f * s and g_without > f * g_with:
            if apart:
                return "contradicted", Why(r, "without > 2× spread and > 2× with" + (
                    ", and the paired CI excludes 0" if diff_ci is not None else ""))
            return "inconclusive", Why(r, "without > 2× spread and > 2× with, but the paired CI includes 0")
        return "inconclusive", Why(r, "neither rule applies")
    raise ValueError(f"decide: unknown kind {kind!r}")


def _absence(diff_ci: tuple) -> str:
    """What a paired interval inside ±1× spread says of the drop the claim predicts without the rule."""
    if diff_ci[0] > 0:
        return ("the rule brings the curve closer on the paired seeds (CI above 0), but by less than one spread, "
                "far short of the drop the claim predicts without it")
    if diff_ci[1] < 0:
        return ("the rule leaves the curve farther (CI below 0), by less than one spread: there is no drop for it "
                "to prevent")
    return "there is no drop for the rule to prevent"


def strays(g: float | None, s: float | None, ci: tuple | None = None) -> bool | None:
    """The target model strays: its paired gap > 2× the spread, and the gap's CI lies above 1× the spread.
    False when it tracks or sits in between; None when it cannot be told (no gap, no spread, or a spread
    made unbounded by a baseline that stopped early)."""
    if g is None or s is None or unbounded(s):
        return None
    return g > FACTOR * s and (ci is None or ci[0] > s)


def nothing_to_explain(g_ema_with: float | None, s_ema: float | None, g_target_with: float | None,
                       s_target: float | None) -> bool:
    """target_explains has nothing to explain: every number is measured, and the EMA's gap with the rule
    is within 2× its spread. `decide_target`'s verdict and the row's set-aside both read this."""
    return None not in (g_ema_with, s_ema, g_target_with, s_target) and not unbounded(s_ema, s_target) \
        and g_ema_with <= FACTOR * s_ema


def decide_target(g_ema_with: float | None, s_ema: float | None, g_target_with: float | None,
                  s_target: float | None, target_ci: tuple | None = None) -> tuple[str, Why]:
    """target_explains: an EMA gap with the rule is the optimizer rule's when the target strays too."""
    if s_ema is None or s_target is None:
        return "inconclusive", Why.unmeasured(NO_SPREAD)
    if g_ema_with is None or g_target_with is None:
        return "inconclusive", Why.unmeasured(NO_GAP)
    r = (f"EMA metric: gap with {_n(g_ema_with)}, spread {_n(s_ema)}; target metric: gap with "
         f"{_n(g_target_with)}" + (f" (95 % CI {_ci(target_ci)})" if target_ci else "") + f", spread {_n(s_target)}")
    if unbounded(s_ema, s_target):
        return "inconclusive", Why(r, STOPPED_BASELINE)
    if nothing_to_explain(g_ema_with, s_ema, g_target_with, s_target):
        return "inconclusive", Why(r, "no EMA gap with the rule to explain (≤ 2× spread)")
    if strays(g_target_with, s_target, target_ci):
        return "reproduced", Why(r, "the target model strays too (> 2× its spread, CI above 1×)")
    if g_target_with <= s_target:
        return "contradicted", Why(r, "the target model tracks (≤ its spread) while the EMA strays")
    if g_target_with > FACTOR * s_target:
        return "inconclusive", Why(r, "the target's gap is > 2× its spread, but its CI reaches down to 1×")
    return "inconclusive", Why(r, "the target's gap lies between 1× and 2× its spread")


def decide_optimizer(g_with: float | None, s: float | None, ci: tuple | None = None) -> tuple[str, Why]:
    """optimizer_strays: the target model's gap with every rule applied, against its spread."""
    if s is None:
        return "inconclusive", Why.unmeasured(NO_SPREAD)
    if g_with is None:
        return "inconclusive", Why.unmeasured(NO_GAP)
    r = f"target gap with the rule {_n(g_with)}" + (f" (95 % CI {_ci(ci)})" if ci else "") + \
        f", baseline spread {_n(s)}"
    if unbounded(s):
        return "inconclusive", Why(r, STOPPED_BASELINE)
    if strays(g_with, s, ci):
        return "reproduced", Why(r, "it strays (> 2× spread, CI above 1×)")
    if g_with <= s:
        return "contradicted", Why(r, "it tracks (≤ spread)")
    if g_with > FACTOR * s:
        return "inconclusive", Why(r, "> 2× the spread, but the CI reaches down to 1×")
    return "inconclusive", Why(r, "between 1× and 2× the spread")


def decide_with_better(diffs: dict, s_end: float | None, cis: dict | None = None) -> tuple[str, Why]:
    """with_better: `diffs` maps κ → final(with) − final(without), signed so that > 0 is better, the mean
    over seeds of the paired per-seed differences; `cis` their bootstrap intervals."""
    if s_end is None:
        return "inconclusive", Why.unmeasured(NO_SPREAD)
    if not diffs or any(d is None for d in diffs.values()):
        return "inconclusive", Why.unmeasured(NO_GAP)
    cis = cis or {}
    r = "with − without at the end " + ", ".join(
        f"κ={k:g}: {_n(d, signed=True)}" + (f" {_ci(cis[k])}" if cis.get(k) else "")
        for k, d in sorted(diffs.items())) + f"; end spread {_n(s_end)}"
    if unbounded(s_end):
        return "inconclusive", Why(r, STOPPED_BASELINE)
    if all(cis.get(k) is not None for k in diffs):  # paired: the interval is the comparison's own noise
        if any(cis[k][1] < 0 for k in diffs):
            return "contradicted", Why(r, "without is better somewhere (CI below 0)")
        if all(cis[k][0] > 0 for k in diffs):
            return "reproduced", Why(r, "better at every κ (every CI above 0)")
        return "inconclusive", Why(r, "a CI includes 0")
    if any(d < -FACTOR * s_end for d in diffs.values()):
        return "contradicted", Why(r, "without is better by > 2× spread somewhere")
    if all(d > 0 for d in diffs.values()) and any(d > FACTOR * s_end for d in diffs.values()):
        return "reproduced", Why(r, "better at every κ, by > 2× spread at one")
    return "inconclusive", Why(r, "neither rule applies")


def decide_arm_closer(g_a: float | None, g_b: float | None, diff_ci: tuple | None) -> tuple[str, Why]:
    """arm_closer: A is closer to the baseline than B, judged on the paired difference g_B − g_A alone
    (both settings are measured against the same seeds' baselines, so no spread enters)."""
    if g_a is None or g_b is None:
        return "inconclusive", Why.unmeasured(NO_GAP)
    if diff_ci is None:
        return "inconclusive", Why.unmeasured("no paired interval: fewer than 2 seeds ran both settings")
    r = f"gap of A {_n(g_a)}, of B {_n(g_b)}; paired difference B − A, 95 % CI {_ci(diff_ci)}"
    if diff_ci[0] > 0:
        return "reproduced", Why(r, "A is closer, the CI excludes 0")
    if diff_ci[1] < 0:
        return "contradicted", Why(r, "A is farther, the CI excludes 0")
    return "inconclusive", Why(r, "the CI includes 0")


def decide_matches_or_better(d: float | None, d_ci: tuple | None, s_end: float | None) -> tuple[str, Why]:
    """matches_or_better: d = final(A) − final(baseline), paired per seed and signed so that > 0 is
    better; A matches when d ≥ −2× the end spread, and falls short when below it with a CI below 0."""
    if s_end is None:
        return "inconclusive", Why.unmeasured(NO_SPREAD)
    if d is None:
        return "inconclusive", Why.unmeasured(
            "a setting has no final value (not run, or a run never logged the metric)")
    r = f"A − baseline at the end {_n(d, signed=True)} (95 % CI {_ci(d_ci)}), end spread {_n(s_end)}"
    if unbounded(s_end):
        return "inconclusive", Why(r, STOPPED_BASELINE)
    if d >= -FACTOR * s_end:
        return "reproduced", Why(r, "level with the baseline (within 2× spread) or above it")
    if d_ci is not None and d_ci[1] < 0:
        return "contradicted", Why(r, "below the baseline by > 2× spread")
    if d_ci is None:
        return "inconclusive", Why(r, "below by > 2× spread, but one seed gives no interval")
    return "inconclusive", Why(r, "below by > 2× spread, but the CI includes 0")


def decide_ema_above(diffs: list) -> tuple[str, Why]:
    """ema_above_target: `diffs` are final EMA − final target per baseline seed, > 0 better."""
    if len(diffs) < 2:
        return "inconclusive", Why.unmeasured(
            "the baseline spread is undefined (fewer than 2 baseline seeds logged both metrics)")
    r = "EMA − target at the end, per baseline seed: " + ", ".join(_n(d, signed=True) for d in diffs)
    if all(d > 0 for d in diffs):
        return "reproduced", Why(r, "the EMA is better for every seed")
    if all(d < 0 for d in diffs):
        return "contradicted", Why(r, "the EMA is worse for every seed")
    return "inconclusive", Why(r, "mixed")


def _n(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    if math.isinf(v):
        return "∞ (a run stopped early)"
    return f"{v:+.3g}" if signed else f"{v:.3g}"
