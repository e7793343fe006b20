"""Decision rules by the shape of a claim, on signed per-seed paired effects. Pure Python, torch-free.

Every effect handed to `decide` is one number per seed, signed so that the paper's direction is positive,
and in units of the family's baseline pair spread (so a margin of 1 is one spread). The rules are written in
docs/reproduce.md ("Decision rules") and applied here exactly as written; a change to them once verdicts
have been seen may only make them stricter, never move a verdict towards the paper:

    directional    reproduced     CI95 lies above the part's size (0 for a sign alone)
                   contradicted   CI95 lies below 0 (the opposite effect), or, where the paper states the
                                  size, TOST shows |effect| < margin AND the seeds run had the power
                                  (the MDE against no effect ≤ the paper's effect)
                   otherwise      not reproduced at this preset, with the MDE
    departure      (a directional claim whose paper gives no sign: "diverges", "does not match")
                   reproduced     CI95 lies wholly above +size or wholly below −size
                   contradicted   where the paper states the size, TOST shows |effect| < margin AND the MDE
                                  against no effect ≤ the paper's effect
                   otherwise      not reproduced at this preset, with the MDE
    comparative    (on paired differences of gaps: "closer", "≈ 3× smaller")
                   reproduced     CI95 lies above the size the claim states
                   contradicted   CI95 lies below 0 (the opposite ordering, at the ratio the claim states)
                   otherwise      not reproduced at this preset, with the MDE. A difference of two gaps
                                  cannot bound an absent effect (each gap has a noise floor), so no
                                  equivalence test contradicts a comparative claim.
    equivalence    reproduced     TOST at level 0.05: the CI90 lies inside ±margin
                   contradicted   CI95 lies wholly outside ±margin
                   otherwise      not reproduced at this preset, with the MDE
    noninferior    reproduced     CI95's low end lies above −margin ("matches or surpasses")
                   contradicted   CI95's high end lies below −margin
                   otherwise      not reproduced at this preset, with the MDE

CI95 and CI90 are paired Student-t intervals of the mean effect (two-sided 95 % and 90 %); a t interval keeps
its coverage at 5 seeds, where a percentile bootstrap of the mean covers about 84 % (docs/reproduce.md,
"Rules by claim shape", prints both, measured). The minimum detectable effect is the true effect that a
one-sample t test at two-sided level 0.05 detects with 80 % power at the seeds run, from the effects' own
standard deviation: (t₀.₉₇₅ + t₀.₈₀) · sd / √n, on n − 1 degrees of freedom; for a signed part with a size,
that much beyond the size, as its interval must clear the size. An absence's power condition compares
the MDE against no effect, (t₀.₉₇₅ + t₀.₈₀) · sd / √n, with the paper's effect.

A claim that joins parts ("with the rule the EMA matches, without it it does not") is judged on each part:
reproduced only when every part is, contradicted when any part is, otherwise not reproduced. Its "does not
match" part has the size of its "matches" part's margin (one spread), so the two parts cannot both hold of
one setting; that size is ours, not the paper's, so no absence contradicts it.

Every number a rule's words print is in spreads.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

SHAPES = ("directional", "departure", "comparative", "equivalence", "noninferior")
REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
NOT_REPRODUCED = "not reproduced at this preset"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, CONTRADICTED)
# Verdicts no rule gives, which `judge` gives before any rule is applied:
NOT_TESTABLE = "not testable at this preset"  # the preset lacks the mechanism the claim needs
SET_ASIDE = "set aside"  # the optimizer rule itself strays where the claim is about the EMA
NOT_MEASURED = "not measured"  # a run the claim needs is missing, or never logged the metric
ALL_VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, CONTRADICTED, SET_ASIDE, NOT_MEASURED)
# Which test of its rule decided a part (`Decision.route`), so that no reader re-derives it from the numbers:
ABOVE = "above"  # CI95 above the stated size (directional, comparative) or above −margin (noninferior)
OUTSIDE = "outside"  # CI95 outside ±size (departure, reproduced) or outside ±margin (equivalence, contradicted)
INSIDE = "inside"  # TOST: CI90 inside ±margin (equivalence)
OPPOSITE = "opposite"  # CI95 below 0: the opposite effect or ordering
ABSENT = "absent"  # TOST shows the stated size absent, with the power to see the paper's effect
BELOW = "below"  # CI95 below −margin (noninferior)
OPEN = "open"  # not decided at the seeds run
POWER = 0.8  # the power the minimum detectable effect is quoted at
MAX_SEEDS = 1000  # seeds_needed's search ends here


# --- Student's t, without scipy ------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)  # the rules ask for a few (p, df) pairs, millions of times in `simulate`
def t_quantile(p: float, df: int) -> float:
    """The t with P(T ≤ t) = p, by bisection on `t_cdf` (p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie in (0, 1), got {p}")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


# --- one set of paired effects -------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The mean of n per-seed effects, their sd, and two-sided t intervals of the mean."""

    n: int
    mean: float
    sd: float
    ci95: tuple[float, float]
    ci90: tuple[float, float]
    mde: float  # minimum detectable effect at POWER, two-sided 0.05


def _interval(mean: float, se: float, df: int, level: float) -> tuple[float, float]:
    h = t_quantile(0.5 + level / 2, df) * se
    return (mean - h, mean + h)


def mde(sd: float, n: int, power: float = POWER) -> float:
    """The true mean effect a two-sided 0.05 t test detects with `power` at n seeds of this sd."""
    if n < 2:
        return math.inf
    return (t_quantile(0.975, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(effect: float, sd: float, power: float = POWER) -> int | None:
    """The fewest seeds whose MDE reaches `effect` (None: more than MAX_SEEDS, or no effect to detect)."""
    if not effect > 0:
        return None
    if sd == 0:
        return 2
    for n in range(2, MAX_SEEDS + 1):
        if mde(sd, n, power) <= effect:
            return n
    return None


def summarize(effects: list[float]) -> Summary:
    """Mean, sd and t intervals of the per-seed effects. Fewer than 2 seeds, or a non-finite effect (a run
    that diverged), gives no interval: ±inf, so no rule can decide on it."""
    n = len(effects)
    if n < 2 or not all(math.isfinite(e) for e in effects):
        mean = sum(effects) / n if n and all(math.isfinite(e) for e in effects) else math.nan
        wide = (-math.inf, math.inf)
        return Summary(n, mean, math.nan, wide, wide, math.inf)
    mean = sum(effects) / n
    sd = math.sqrt(sum((e - mean) ** 2 for e in effects) / (n - 1))
    se = sd / math.sqrt(n)
    return Summary(n, mean, sd, _interval(mean, se, n - 1, 0.95), _interval(mean, se, n - 1, 0.90), mde(sd, n))


# --- the decision ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One tested statement of a claim: its shape and the sizes fixed in advance, in spreads.

    `size`: the smallest effect a directional or departure part must show (0: only a sign). `stated`: that size
    is the paper's own ("0.2 % to 0.3 % higher"); only then can its absence be shown. `margin`: the equivalence
    or non-inferiority margin; for a stated size, the margin inside which its absence counts as shown.
    `paper_effect`: the effect the paper reports, which a shown absence must have had the power to see. A part
    whose size is not the paper's (a sign alone, or "does not match" beyond the matching margin) has no size
    to be absent: only the opposite effect contradicts it."""

    shape: str
    size: float = 0.0
    margin: float = 1.0
    paper_effect: float = 1.0
    stated: bool = False

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown claim shape {self.shape!r}; choose one of: {', '.join(SHAPES)}")
        for name in ("margin", "paper_effect"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Part.{name} must be > 0, got {getattr(self, name)}")
        if self.stated and self.margin > self.size:  # else one interval could show the size and its absence
            raise ValueError(f"a stated size's absence margin must not exceed the size, got {self.margin} > "
                             f"{self.size}")

    @property
    def clears(self) -> float:
        """The size a signed part's interval must clear (directional, departure, comparative); 0 for the others,
        whose rules read a margin instead."""
        return self.size if self.shape in ("directional", "departure", "comparative") else 0.0

    def detectable(self, mde_from_zero: float) -> float:
        """The true effect this part's rule reproduces with POWER: the MDE against no effect, beyond the size it
        must clear (its interval must clear that size, not 0)."""
        return mde_from_zero + self.clears

    def seeds_for(self, effect: float, sd: float) -> int | None:
        """The fewest seeds at which this part's rule reproduces a true `effect` with POWER (None: none do): its
        `detectable` effect reaches it for a signed part; for an equivalence part the true distance must lie
        inside the margin by the MDE, for a non-inferiority part above −margin by it."""
        if self.shape == "equivalence":
            return seeds_needed(self.margin - abs(effect), sd)
        if self.shape == "noninferior":
            return seeds_needed(effect + self.margin, sd)
        return seeds_needed(abs(effect) - self.clears, sd)


@dataclass(frozen=True)
class Decision:
    verdict: str
    shape: str
    effect: float
    effect_ci: tuple[float, float]
    mde: float  # the true effect these seeds reproduce with 80 % power (`Part.detectable`)
    margin: float | None
    rule: str  # the words of the rule that gave the verdict
    n: int
    parts: tuple = field(default=())  # the parts' own decisions, for a joined claim
    route: str = ""  # which test of its rule decided a part (ABOVE … OPEN); "" for a joined claim
    mde_from_zero: float = math.inf  # the MDE against no effect, which an absence's power condition reads
    # The p-values of the tests behind "reproduced" and "contradicted" (`p_values`): each reads its verdict
    # exactly when its p-value lies below 0.05, so a correction over many rows (`holm`) can be applied to them.
    p_reproduced: float = 1.0
    p_contradicted: float = 1.0


def spreads(x: float) -> str:
    """A size in the rules' unit, as their words print it: 0, 1 spread, 0.181 spreads."""
    return "0" if x == 0 else f"{x:.3g} spread" + ("" if x == 1 else "s")


def _above(s: Summary, p: Part, opposite: str) -> tuple[str, str, str] | None:
    """The signed rules' first two outcomes: CI95 above the part's size, or below 0 (the `opposite`)."""
    lo, hi = s.ci95
    if lo > p.size:
        return REPRODUCED, ABOVE, f"CI95 lies above {spreads(p.size)}"
    if hi < 0:
        return CONTRADICTED, OPPOSITE, f"CI95 lies below 0: the opposite {opposite}"
    return None


def _absent_or_open(s: Summary, p: Part) -> tuple[str, str, str]:
    """Contradicted where the paper states the size and an absence is shown with the power to see the paper's
    effect; open otherwise. An effect smaller than the part's size but of the paper's sign does not oppose a
    claim whose size is not the paper's."""
    l90, h90 = s.ci90
    if p.stated and -p.margin < l90 and h90 < p.margin and s.mde <= p.paper_effect:
        return CONTRADICTED, ABSENT, (f"absence shown: CI90 inside ±{spreads(p.margin)}, with the power to tell "
                                      f"the paper's effect, {spreads(p.paper_effect)}, from none (MDE against 0 "
                                      f"≤ it)")
    return _open(p)


def _open(p: Part) -> tuple[str, str, str]:
    where = f"outside ±{spreads(p.size)}" if p.shape == "departure" else f"above {spreads(p.size)}"
    return NOT_REPRODUCED, OPEN, f"CI95 does not lie {where}: not shown at the seeds run"


def _directional(s: Summary, p: Part) -> tuple[str, str, str]:
    return _above(s, p, "effect") or _absent_or_open(s, p)


def _departure(s: Summary, p: Part) -> tuple[str, str, str]:
    lo, hi = s.ci95
    if lo > p.size or hi < -p.size:
        return REPRODUCED, OUTSIDE, f"CI95 lies outside ±{spreads(p.size)}"
    return _absent_or_open(s, p)


def _comparative(s: Summary, p: Part) -> tuple[str, str, str]:
    return _above(s, p, "ordering (at the ratio the claim states)") or _open(p)


def _equivalence(s: Summary, p: Part) -> tuple[str, str, str]:
    l90, h90 = s.ci90
    if -p.margin < l90 and h90 < p.margin:
        return REPRODUCED, INSIDE, f"TOST: CI90 inside ±{spreads(p.margin)}"
    lo, hi = s.ci95
    if lo > p.margin or hi < -p.margin:
        return CONTRADICTED, OUTSIDE, f"CI95 lies outside ±{spreads(p.margin)}"
    return NOT_REPRODUCED, OPEN, f"CI90 reaches ±{spreads(p.margin)}: not decided at the seeds run"


def _noninferior(s: Summary, p: Part) -> tuple[str, str, str]:
    lo, hi = s.ci95
    if lo > -p.margin:
        return REPRODUCED, ABOVE, f"CI95 lies above −{spreads(p.margin)}"
    if hi < -p.margin:
        return CONTRADICTED, BELOW, f"CI95 lies below −{spreads(p.margin)}"
    return NOT_REPRODUCED, OPEN, f"CI95 reaches −{spreads(p.margin)}: not decided at the seeds run"


def _t(s: Summary, c: float) -> float:
    """(mean − c)/se; ±∞ where the seeds agree exactly (sd 0), 0 where they agree on c itself."""
    se, x = s.sd / math.sqrt(s.n), s.mean - c
    return x / se if se > 0 else math.copysign(math.inf, x) if x else 0.0


def _p_above(s: Summary, c: float) -> float:
    """One-sided p-value of a mean above c: P(T > t) = P(T < −t), on n − 1 degrees of freedom (read in the
    lower tail, where a small p-value keeps its digits)."""
    return t_cdf(-_t(s, c), s.n - 1)


def _p_below(s: Summary, c: float) -> float:
    """One-sided p-value of a mean below c."""
    return t_cdf(_t(s, c), s.n - 1)


def p_values(part: Part, s: Summary) -> tuple[float, float]:
    """(p_reproduced, p_contradicted): the p-values of the tests whose rejection at 0.05 gives the part's rule its
    "reproduced" and its "contradicted". A bound of a CI95 is a one-sided test at 0.025, so its p-value is
    doubled; each of a TOST's two one-sided tests is at 0.05 (its CI90), so the larger of the two is the
    TOST's p-value. An absence counts only with its power condition met; where two routes lead to one
    verdict (the opposite effect, or a stated size shown absent) the smaller p-value is the verdict's: the
    two hold at different boundaries (an effect of 0 and one at the stated size), so the smaller stays
    about at its level there (below 0.05 in 5.2 % of 6,000 simulated reproductions of 5 seeds with the
    effect at a stated size of 2 spreads, 4.2 % of 10 seeds at 1 spread). 1 for no
    interval (fewer than 2 seeds, a diverged run)."""
    if s.n < 2 or not math.isfinite(s.sd):
        return 1.0, 1.0
    m, size = part.margin, part.size
    tost = max(_p_above(s, -m), _p_below(s, m))
    absent = tost if part.stated and s.mde <= part.paper_effect else 1.0
    if part.shape in ("directional", "comparative"):
        repro, contra = 2 * _p_above(s, size), 2 * _p_below(s, 0.0)
        if part.shape == "directional":
            contra = min(contra, absent)
    elif part.shape == "departure":
        repro, contra = 2 * min(_p_above(s, size), _p_below(s, -size)), absent
    elif part.shape == "equivalence":
        repro, contra = tost, 2 * min(_p_above(s, m), _p_below(s, -m))
    else:  # noninferior
        repro, contra = 2 * _p_above(s, -m), 2 * _p_below(s, -m)
    return min(1.0, repro), min(1.0, contra)


def holm(ps: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down correction: which of the hypotheses stand with a family-wise error rate of `alpha`,
    under any dependence between them (the rows of one table share runs)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    keep = [False] * len(ps)
    for rank, i in enumerate(order):
        if not ps[i] <= alpha / (len(ps) - rank):
            break
        keep[i] = True
    return keep


_RULES = {"directional": _directional, "departure": _departure, "comparative": _comparative,
          "equivalence": _equivalence, "noninferior": _noninferior}


def decide(part: Part, effects: list[float]) -> Decision:
    """The verdict on one part from its per-seed signed effects (in spreads)."""
    s = summarize(effects)
    verdict, route, rule = _RULES[part.shape](s, part)
    margin = part.margin if part.shape in ("equivalence", "noninferior") or route == ABSENT else None
    p_reproduced, p_contradicted = p_values(part, s)
    return Decision(verdict, part.shape, s.mean, s.ci95, part.detectable(s.mde), margin, rule, s.n, route=route,
                    mde_from_zero=s.mde, p_reproduced=p_reproduced, p_contradicted=p_contradicted)


def join(decisions: list[Decision], lead: int = 0) -> Decision:
    """A claim of several parts: reproduced only when every part is, contradicted when any part is.
    Its shape, effect and interval are part `lead`'s, the part in the paper's direction. Its p-value of
    "reproduced" is its parts' largest (every part must pass: an intersection–union test); of "contradicted",
    any part suffices, so it is the smallest times the number of parts (Bonferroni), a valid p-value however
    many κ a claim joins, which may lie above 0.05 where one part alone reads contradicted."""
    verdicts = {d.verdict for d in decisions}
    if verdicts == {REPRODUCED}:
        verdict = REPRODUCED
    elif CONTRADICTED in verdicts:
        verdict = CONTRADICTED
    else:
        verdict = NOT_REPRODUCED
    head = decisions[lead]
    rule = "every part: " + "; ".join(d.rule for d in decisions)
    return Decision(verdict, head.shape, head.effect, head.effect_ci, head.mde, head.margin, rule, head.n,
                    tuple(decisions), p_reproduced=max(d.p_reproduced for d in decisions),
                    p_contradicted=min(1.0, len(decisions) * min(d.p_contradicted for d in decisions)))


# --- the kinds of claim, and their power ----------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of claim: its parts, the first in the paper's direction. `emarule power` simulates it."""

    name: str
    parts: tuple[Part, ...]
    what: str

    @property
    def shape(self) -> str:
        return self.parts[0].shape

    @property
    def margin(self) -> float | None:
        """The first part's margin; None for a signed part (a kind states no size of the paper's, so no absence
        can be shown)."""
        p = self.parts[0]
        return p.margin if p.shape in ("equivalence", "noninferior") else None

    @property
    def margin_text(self) -> str:
        """The margin as the docs' grid and `emarule power --list` print it: ±m, or — where there is none."""
        return "—" if self.margin is None else f"±{self.margin:g}"


# Sizes and margins are in baseline pair spreads, fixed here; docs/reproduce.md prints them.
KINDS = {k.name: k for k in (
    Kind("rule_needed", (Part("directional", size=1.0), Part("equivalence", margin=1.0)),
         "without the rule the metric moves away from the baseline by more than 1 spread; with it, the metric "
         "stays within ±1 spread"),
    Kind("rule_departs", (Part("departure", size=1.0), Part("equivalence", margin=1.0)),
         "without the rule the metric departs from the baseline by more than 1 spread (either sign); with it, it "
         "stays within ±1 spread"),
    Kind("rule_closer", (Part("comparative"),),
         "the rule's gap is smaller than no rule's by the ratio the claim states: gap without − ratio × gap with"),
    Kind("gap_remains", (Part("directional"),), "setting A ends worse than the baseline: a gap remains"),
    Kind("same_either_way", (Part("equivalence", margin=1.0), Part("equivalence", margin=1.0)),
         "with and without the rule the metric ends within ±1 spread of the baseline"),
    Kind("arm_closer", (Part("comparative"),), "setting A ends closer to the baseline than setting B"),
    Kind("matches_or_better", (Part("noninferior", margin=1.0),),
         "setting A ends no more than 1 spread below the baseline, or above it"),
    Kind("with_better", (Part("directional"),), "the rule ends better than no rule"),
    Kind("ema_above_target", (Part("directional"),), "the EMA ends better than its target model"),
    Kind("target_explains", (Part("directional"),), "where the EMA strays with the rule, the target strays too"),
    Kind("optimizer_strays", (Part("departure"),), "with every rule applied, the target model departs from the "
                                                     "baseline"),
)}


def simulate(kind: Kind, effect: float, seeds: int, trials: int = 2000, noise: float = 1.0,
             rng_seed: int = 0, estimated_spread: bool = False) -> dict:
    """Each verdict's frequency over `trials` simulated reproductions of `kind`, with `seeds` paired seeds
    whose per-seed effect is normal, of mean `effect` and sd `noise` (both in spreads).

    The first part carries `effect`: for a directional or non-inferiority part, the true effect in the paper's
    direction; for an equivalence part, the true distance between the two settings. Further parts of a
    joined kind hold the paper's other statement exactly (effect 0), so the frequencies are those of the
    first part as the joined claim sees it.

    `estimated_spread`: the effects are divided, as `judge` divides them, by a pair spread estimated from
    `seeds` simulated baselines (the root mean square of their pairwise differences; its true value 1)
    rather than by the true spread, so the frequencies include the spread's own sampling error."""
    if seeds < 2:
        raise ValueError(f"--seeds must be at least 2 for an interval, got {seeds}")
    if trials < 1:
        raise ValueError(f"--trials must be at least 1, got {trials}")
    if not (math.isfinite(effect) and math.isfinite(noise)) or noise <= 0:
        raise ValueError(f"the effect must be finite and the noise finite and > 0, got {effect} and {noise}")
    rng = random.Random(rng_seed)
    counts = dict.fromkeys(VERDICTS, 0)
    for _ in range(trials):
        scale = _estimated_spread(rng, seeds) if estimated_spread else 1.0
        decisions = []
        for i, part in enumerate(kind.parts):
            mu = effect if i == 0 else 0.0
            decisions.append(decide(part, [rng.gauss(mu, noise) / scale for _ in range(seeds)]))
        counts[join(decisions).verdict] += 1
    return {"kind": kind.name, "shape": kind.shape, "effect": effect, "seeds": seeds, "trials": trials,
            "noise": noise, "verdicts": {v: c / trials for v, c in counts.items()},
            "size": kind.parts[0].clears, "margin": kind.margin,
            "mde": kind.parts[0].detectable(mde(noise, seeds)),
            "seeds_for_effect": kind.parts[0].seeds_for(effect, noise)}


def _estimated_spread(rng: random.Random, seeds: int) -> float:
    """The pair spread of `seeds` simulated baselines whose true pair spread is 1 (`paired.pair_spread`)."""
    b = [rng.gauss(0.0, math.sqrt(0.5)) for _ in range(seeds)]
    return math.sqrt(sum((x - y) ** 2 for x in b for y in b) / (seeds * (seeds - 1)))


def coverage(seeds: int, trials: int = 4000, level: float = 0.95, rng_seed: int = 0) -> float:
    """How often the t interval at `level` covers the true mean of normal per-seed effects."""
    interval = {0.95: "ci95", 0.90: "ci90"}.get(level)
    if interval is None:
        raise ValueError(f"coverage: the rules' intervals are at levels 0.95 and 0.90, got {level}")
    rng = random.Random(rng_seed)
    hit = 0
    for _ in range(trials):
        lo, hi = getattr(summarize([rng.gauss(0.0, 1.0) for _ in range(seeds)]), interval)
        hit += lo <= 0.0 <= hi
    return hit / trials


def bootstrap_coverage(seeds: int, trials: int = 1000, resamples: int = 1000, rng_seed: int = 0) -> float:
    """How often a 95 % percentile bootstrap of the mean covers the true mean, for comparison."""
    rng = random.Random(rng_seed)
    hit = 0
    for _ in range(trials):
        x = [rng.gauss(0.0, 1.0) for _ in range(seeds)]
        means = sorted(sum(rng.choice(x) for _ in range(seeds)) / seeds for _ in range(resamples))
        lo, hi = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
        hit += lo <= 0.0 <= hi
    return hit / trials


GRID_EFFECTS = (0.0, 0.5, 1.0, 2.0)
GRID_SEEDS = (5, 10)
GRID_TRIALS = 1000


def power_grid(effects=GRID_EFFECTS, seeds=GRID_SEEDS, trials: int = GRID_TRIALS) -> list[dict]:
    """`simulate` for every kind, effect and seed count: the table docs/reproduce.md prints."""
    return [simulate(k, e, n, trials) for k in KINDS.values() for n in seeds for e in effects]


def grid_markdown(rows: list[dict]) -> str:
    """The power grid as a Markdown table: each cell reproduced / not reproduced / contradicted."""
    effects = sorted({row["effect"] for row in rows})
    head = ["kind", "shape", "margin", "seeds"] + [f"effect {e:g}" for e in effects]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells: dict = {}
    for row in rows:
        v = row["verdicts"]
        cells.setdefault((row["kind"], row["seeds"]), {})[row["effect"]] = (
            f"{v[REPRODUCED]:.2f} / {v[NOT_REPRODUCED]:.2f} / {v[CONTRADICTED]:.2f}")
    for (name, n), by_effect in cells.items():
        k = KINDS[name]
        row = [f"`{name}`", k.shape, k.margin_text, str(n)] + [by_effect[e] for e in effects]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
