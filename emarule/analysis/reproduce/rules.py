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

A size or margin of one spread, the estimated spread's own and not the paper's, is bounded (`Part.bound`):
each test that reads one gives half its level to a χ² bound on the spread, which moves the threshold to
its strict side (a margin shrinks, a size grows), and half to the mean's interval (so CI90 becomes CI95 and
CI95 becomes CI97.5). A sign, and a size the paper states, are not bounded.

CI95 and CI90 are paired Student-t intervals of the mean effect (two-sided 95 % and 90 %); a t interval keeps
its coverage at 5 seeds, where a percentile bootstrap of the mean covers about 84 % (docs/reproduce.md,
"Rules by claim shape", prints both, measured). The minimum detectable effect is the true effect that a
one-sample t test at two-sided level 0.05 detects with 80 % power at the seeds run, from the effects' own
standard deviation: (t₀.₉₇₅ + t₀.₈₀) · sd / √n, on n − 1 degrees of freedom; for a signed part with a size,
that much beyond the size, as its interval must clear the size; for a bounded size, the MDE at two-sided
0.025 beyond the size at its bound. An absence's power condition compares
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
from dataclasses import dataclass, field, replace

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


# --- Student's t and the χ² distribution, without scipy --------------------------------------------

_TINY = 1e-300  # keeps a continued fraction's terms off 0 (modified Lentz)


def _off_zero(x: float) -> float:
    return x if abs(x) > _TINY else _TINY


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 / _off_zero(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / _off_zero(1.0 + num * d)
            c = _off_zero(1.0 + num / c)
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


def _gammainc(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x): its series below a + 1, else its continued
    fraction (modified Lentz) for 1 − P."""
    if x <= 0.0:
        return 0.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return min(1.0, total * front)
    b = x + 1.0 - a
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = 1.0 / _off_zero(an * d + b)
        c = _off_zero(b + an / c)
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return max(0.0, 1.0 - front * h)


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def chi2_cdf(x: float, df: int) -> float:
    """P(X ≤ x) for a χ² variable with `df` degrees of freedom."""
    return _gammainc(df / 2.0, x / 2.0)


def _quantile(name: str, cdf, p: float, df: int, lo: float, hi: float, grow: bool = False) -> float:
    """The x with cdf(x, df) = p, by bisection on [lo, hi]; `grow`: hi doubled first until it lies above x."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"{name}: p must lie in (0, 1), got {p}")
    while grow and cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@functools.lru_cache(maxsize=4096)  # the rules ask for a few (p, df) pairs, millions of times in `simulate`
def t_quantile(p: float, df: int) -> float:
    """The t with P(T ≤ t) = p (p in (0, 1))."""
    return _quantile("t_quantile", t_cdf, p, df, -1e3, 1e3)


@functools.lru_cache(maxsize=4096)
def chi2_quantile(p: float, df: int) -> float:
    """The x with P(X ≤ x) = p (p in (0, 1))."""
    return _quantile("chi2_quantile", chi2_cdf, p, df, 0.0, max(10.0, 4.0 * df), grow=True)


def spread_factor(q: float, df: int, outside: bool) -> float:
    """A one-sided bound at level q on the true pair spread σ, in units of one ŝ estimated on `df` degrees of
    freedom: df · ŝ² / σ² is χ² on df. `outside`: the upper bound √(df / χ²_q), for a size an effect must clear;
    else the lower √(df / χ²_{1−q}), for a margin it must stay inside."""
    return math.sqrt(df / chi2_quantile(q if outside else 1.0 - q, df))


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


def mde(sd: float, n: int, power: float = POWER, alpha: float = 0.05) -> float:
    """The true mean effect a two-sided `alpha` t test detects with `power` at n seeds of this sd."""
    if n < 2:
        return math.inf
    return (t_quantile(1.0 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(effect: float, sd: float, power: float = POWER) -> int | None:
    """The fewest seeds whose MDE reaches `effect` (None: more than MAX_SEEDS, or no effect to detect)."""
    if not effect > 0:
        return None
    if sd == 0:
        return 2
    return next((n for n in range(2, MAX_SEEDS + 1) if mde(sd, n, power) <= effect), None)


def summarize(effects: list[float]) -> Summary:
    """Mean, sd and t intervals of the per-seed effects. Fewer than 2 seeds, or a non-finite effect (a run
    that diverged), gives no interval: ±inf, so no rule can decide on it."""
    n, finite = len(effects), all(math.isfinite(e) for e in effects)
    mean = sum(effects) / n if n and finite else math.nan
    if n < 2 or not finite:
        return Summary(n, mean, math.nan, (-math.inf, math.inf), (-math.inf, math.inf), math.inf)
    sd = math.sqrt(sum((e - mean) ** 2 for e in effects) / (n - 1))
    se = sd / math.sqrt(n)
    return Summary(n, mean, sd, _interval(mean, se, n - 1, 0.95), _interval(mean, se, n - 1, 0.90), mde(sd, n))


# --- the decision ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One tested statement of a claim: its shape and the sizes fixed in advance, in spreads.

    `size`: the smallest effect a signed part must show (0: only a sign). `stated`: that size is the paper's own
    ("0.2 % to 0.3 % higher"); only then can its absence be shown. `margin`: the equivalence or non-inferiority
    margin; for a stated size, the margin inside which its absence counts as shown. `paper_effect`: the effect
    the paper reports, which a shown absence must have had the power to see."""

    shape: str
    size: float = 0.0
    margin: float = 1.0
    paper_effect: float = 1.0
    stated: bool = False
    # The degrees of freedom of the pair spread the effects are in, estimated from spread_df + 1 baselines
    # (None: a spread known exactly). Then a size or margin of the spread's, not the paper's, is a random
    # distance, and each test that reads one spends half its level on the spread's χ² bound (`bound`).
    spread_df: int | None = None

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown claim shape {self.shape!r}; choose one of: {', '.join(SHAPES)}")
        for name in ("margin", "paper_effect"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Part.{name} must be > 0, got {getattr(self, name)}")
        if self.spread_df is not None and self.spread_df < 1:
            raise ValueError(f"Part.spread_df must be at least 1 (two baselines), got {self.spread_df}")
        if self.stated and self.margin > self.size:  # else one interval could show the size and its absence
            raise ValueError(f"a stated size's absence margin must not exceed the size, got {self.margin} > "
                             f"{self.size}")

    @property
    def clears(self) -> float:
        """The size a signed part's interval must clear; 0 for the others, whose rules read a margin instead."""
        return self.size if self.shape in ("directional", "departure", "comparative") else 0.0

    def bounded(self, c: float) -> bool:
        """Whether a size or margin of c spreads is the estimated spread's own: not 0, not the paper's (a stated
        size cancels with the spread it is divided by), and the spread estimated."""
        return self.spread_df is not None and c != 0 and not self.stated

    def bound(self, c: float, side: int, a: float) -> tuple[float, float]:
        """(the threshold, the mean's one-sided level) of a one-sided test at level `a` that the mean effect
        lies above (`side` +1) or below (−1) c spreads. Where c is the estimated spread's (`bounded`), the test
        is split by Bonferroni: the mean's bound at a/2 against c at the spread's bound at a/2, on the strict
        side (a threshold to clear away from 0 grows, one to stay within shrinks)."""
        if not self.bounded(c):
            return c, a
        return c * spread_factor(a / 2, self.spread_df, outside=side * c > 0), a / 2

    def detectable(self, sd: float, n: int) -> float:
        """The true effect this part's rule reproduces with POWER at n seeds of this sd: for a signed part the
        MDE at the level of its test of the size, beyond that size at its bound (its interval must clear the
        size, not 0); for the others the MDE against no effect. Counted in true spreads, a bounded size's own
        error lowers the power below POWER (docs/reproduce.md, "A margin of one estimated spread")."""
        if n < 2 or not math.isfinite(sd):
            return math.inf
        if self.shape not in ("directional", "departure", "comparative"):
            return mde(sd, n)
        c, a = self.bound(self.clears, +1, 0.025)
        return mde(sd, n, alpha=2 * a) + c

    def seeds_for(self, effect: float, sd: float) -> int | None:
        """The fewest seeds at which this part's rule reproduces a true `effect` with POWER (None: none do): its
        `detectable` effect reaches it, or for a margin the true effect lies inside it by the MDE. An estimated
        spread comes from as many baselines as seeds, so its bound narrows as seeds are added."""
        c = self.margin if self.shape in ("equivalence", "noninferior") else self.clears
        if self.shape in ("directional", "comparative") and not effect > 0:
            return None  # the paper's direction is positive: an effect against it is never reproduced
        # at or beyond the nominal size or margin no seed count shows it (a bound only moves it further)
        beyond = {"equivalence": abs(effect) >= c, "noninferior": effect <= -c}.get(self.shape, abs(effect) <= c)
        if beyond or not (math.isfinite(effect) and math.isfinite(sd)):
            return None

        def enough(n: int) -> bool:  # more seeds narrow the mean's interval, and any spread's bound too
            p = self if self.spread_df is None else replace(self, spread_df=n - 1)
            if self.shape == "equivalence":
                m, a = p.bound(self.margin, -1, 0.05)
                return mde(sd, n, alpha=a) <= m - abs(effect)
            if self.shape == "noninferior":
                m, a = p.bound(-self.margin, +1, 0.025)
                return mde(sd, n, alpha=2 * a) <= effect - m
            return p.detectable(sd, n) <= abs(effect)

        hi = 2  # enough() only grows with n: double to a count that is enough, then bisect below it
        while not enough(hi):
            if hi >= MAX_SEEDS:
                return None
            hi = min(2 * hi, MAX_SEEDS)
        lo = hi // 2  # enough(hi), and not enough(lo) unless lo < 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if enough(mid) else (mid, hi)
        return max(hi, 2)


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


def _ci(a: float) -> str:
    """The two-sided interval whose end is a one-sided bound at level a: CI95 for 0.025, CI97.5 for 0.0125."""
    return f"CI{100 * (1 - 2 * a):.3g}"


def _end(s: Summary, a: float, side: int) -> float:
    """The mean's one-sided confidence bound at level a: the lower (`side` −1) or upper (+1) end of `_ci(a)`."""
    known = {0.025: s.ci95, 0.05: s.ci90}.get(a)
    if known is not None:
        return known[0 if side < 0 else 1]
    if not math.isfinite(s.sd):  # fewer than 2 seeds, or a diverged run: no interval
        return side * math.inf
    return s.mean + side * t_quantile(1.0 - a, s.n - 1) * s.sd / math.sqrt(s.n)


def _shown(s: Summary, p: Part, c: float, side: int, a: float) -> tuple[bool, str, str]:
    """Whether the one-sided test at level a shows the mean effect above (`side` +1) or below (−1) c spreads,
    and the words of what it compared: the interval, and the threshold with its bound where it has one."""
    used, am = p.bound(c, side, a)
    ok = _end(s, am, -side) > used if side > 0 else _end(s, am, -side) < used
    return ok, _ci(am), _threshold(p, c, used, a)


def _threshold(p: Part, c: float, used: float, a: float) -> str:
    if used == c:
        return spreads(abs(c))
    which = "upper" if abs(used) > abs(c) else "lower"
    return (f"{spreads(abs(used))} ({spreads(abs(c))} at the spread's {100 * (1 - a / 2):.4g} % {which} bound, "
            f"{p.spread_df} df)")


def _tests(p: Part) -> tuple[list, list]:
    """The one-sided tests of the part's rule, each (the threshold in spreads, the side the mean must lie on, the
    level): those that show it reproduced (an equivalence needs both, its TOST; any one suffices elsewhere) and
    those that show it contradicted, besides a stated size shown absent. A CI95 below 0 is the opposite effect."""
    m, size = p.margin, p.size
    return {"directional": ([(size, +1, 0.025)], [(0.0, -1, 0.025)]),
            "comparative": ([(size, +1, 0.025)], [(0.0, -1, 0.025)]),
            "departure": ([(size, +1, 0.025), (-size, -1, 0.025)], []),
            "equivalence": ([(-m, +1, 0.05), (m, -1, 0.05)], [(m, +1, 0.025), (-m, -1, 0.025)]),
            "noninferior": ([(-m, +1, 0.025)], [(-m, -1, 0.025)])}[p.shape]


# Per shape: the route and words of "reproduced", of "contradicted" (None: only an absence contradicts), and the
# words of an open part; {ci} and {thr} are those of the verdict's first test, for an open part the reproduced's.
_WORDS = {
    "directional": ((ABOVE, "{ci} lies above {thr}"), (OPPOSITE, "{ci} lies below {thr}: the opposite effect"),
                    "{ci} does not lie above {thr}: not shown at the seeds run"),
    "comparative": ((ABOVE, "{ci} lies above {thr}"),
                    (OPPOSITE, "{ci} lies below {thr}: the opposite ordering (at the ratio the claim states)"),
                    "{ci} does not lie above {thr}: not shown at the seeds run"),
    "departure": ((OUTSIDE, "{ci} lies outside ±{thr}"), None,
                  "{ci} does not lie outside ±{thr}: not shown at the seeds run"),
    "equivalence": ((INSIDE, "TOST: {ci} inside ±{thr}"), (OUTSIDE, "{ci} lies outside ±{thr}"),
                    "{ci} reaches ±{thr}: not decided at the seeds run"),
    "noninferior": ((ABOVE, "{ci} lies above −{thr}"), (BELOW, "{ci} lies below −{thr}"),
                    "{ci} reaches −{thr}: not decided at the seeds run"),
}


def _can_be_absent(p: Part) -> bool:
    """Whether a shown absence contradicts the part: only a size the paper states can be absent (an effect
    smaller than a size of ours, of the paper's sign, does not oppose the claim), and not that of a difference
    of two gaps, which has a noise floor."""
    return p.stated and p.shape in ("directional", "departure")


def _rule(s: Summary, p: Part) -> tuple[str, str, str]:
    """The part's verdict, the test that decided it (`Decision.route`) and the words of that test."""
    reproduce, contradict = _tests(p)
    (route, words), against, open_words = _WORDS[p.shape]
    shown = [_shown(s, p, *test) for test in reproduce]
    _, ci, thr = shown[0]
    if (all if p.shape == "equivalence" else any)(ok for ok, _, _ in shown):
        return REPRODUCED, route, words.format(ci=ci, thr=thr)
    shown_against = [_shown(s, p, *test) for test in contradict]
    if any(ok for ok, _, _ in shown_against):
        return CONTRADICTED, against[0], against[1].format(ci=shown_against[0][1], thr=shown_against[0][2])
    l90, h90 = s.ci90  # a stated size is the paper's, so no spread's bound enters its absence
    if _can_be_absent(p) and -p.margin < l90 and h90 < p.margin and s.mde <= p.paper_effect:
        return CONTRADICTED, ABSENT, (f"absence shown: CI90 inside ±{spreads(p.margin)}, with the power to tell "
                                      f"the paper's effect, {spreads(p.paper_effect)}, from none (MDE against 0 "
                                      f"≤ it)")
    return NOT_REPRODUCED, OPEN, open_words.format(ci=ci, thr=thr)


def _t(s: Summary, c: float) -> float:
    """(mean − c)/se; ±∞ where the seeds agree exactly (sd 0), 0 where they agree on c itself."""
    se, x = s.sd / math.sqrt(s.n), s.mean - c
    return x / se if se > 0 else math.copysign(math.inf, x) if x else 0.0


def _p_one(s: Summary, p: Part, c: float, side: int) -> float:
    """The smallest one-sided level at which `_shown` shows the mean above (`side` +1) or below (−1) c spreads.
    For a bounded c (`Part.bound`), the level a at which the mean's p-value against c at the spread's bound
    at a/2 is a/2 itself: by bisection on the χ² point x of that bound (√(df/x) times c)."""

    def one(at: float) -> float:  # against a fixed `at`; P(T > t) read as P(T < −t), where small p keeps its digits
        return t_cdf(-side * _t(s, at), s.n - 1)

    if not p.bounded(c):
        return one(c)
    df, outside = p.spread_df, side * c > 0

    def level(x: float) -> float:  # the spread's one-sided level at which its bound is √(df/x)
        return chi2_cdf(x, df) if outside else 1.0 - chi2_cdf(x, df)

    def holds(x: float) -> bool:
        return one(c * math.sqrt(df / x)) <= level(x)

    # outside: a larger x is a laxer bound at a higher level, so the test holds from some x on; inside the
    # other way round
    lo, hi = math.log(1e-200), math.log(1e6 * df)
    if holds(math.exp(lo if not outside else hi)) is False:
        return 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(math.exp(mid)) == outside else (mid, hi)
    return min(1.0, 2 * level(math.exp(hi if outside else lo)))


def p_values(part: Part, s: Summary) -> tuple[float, float]:
    """(p_reproduced, p_contradicted): the p-values of the tests whose rejection at 0.05 gives the part's rule its
    "reproduced" and its "contradicted" (`_tests`); a TOST's is the larger of its two. An absence counts only
    with its power condition met; where two routes lead to one verdict (the opposite effect, or a stated size
    shown absent) the smaller p-value is the verdict's: the two hold at different boundaries (an effect of 0
    and one at the stated size), so the smaller stays about at its level there (below 0.05 in 5.2 % of 6,000
    simulated reproductions of 5 seeds with the effect at a stated size of 2 spreads, 4.2 % of 10 seeds at 1
    spread). 1 for no interval (fewer than 2 seeds, a diverged run)."""
    if s.n < 2 or not math.isfinite(s.sd):
        return 1.0, 1.0
    reproduce, contradict = _tests(part)
    # as a test at 0.05: a CI95 bound's p-value (at 0.025) doubled, a TOST's (at 0.05) as it is
    repro = [_p_one(s, part, c, side) * (0.05 / a) for c, side, a in reproduce]
    contra = [_p_one(s, part, c, side) * (0.05 / a) for c, side, a in contradict]
    m = part.margin
    if _can_be_absent(part) and s.mde <= part.paper_effect:
        contra.append(max(_p_one(s, part, -m, +1), _p_one(s, part, m, -1)))
    repro_p = max(repro) if part.shape == "equivalence" else min(repro)
    return min(1.0, repro_p), min([1.0, *contra])


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


def decide(part: Part, effects: list[float], with_p_values: bool = True) -> Decision:
    """The verdict on one part from its per-seed signed effects (in spreads). `with_p_values`: False leaves them
    at 1, for a simulation that counts verdicts only (a bounded test's p-value is a search)."""
    s = summarize(effects)
    verdict, route, rule = _rule(s, part)
    margin = part.margin if part.shape in ("equivalence", "noninferior") or route == ABSENT else None
    p_reproduced, p_contradicted = p_values(part, s) if with_p_values else (1.0, 1.0)
    return Decision(verdict, part.shape, s.mean, s.ci95, part.detectable(s.sd, s.n), margin, rule, s.n, route=route,
                    mde_from_zero=s.mde, p_reproduced=p_reproduced, p_contradicted=p_contradicted)


def join(decisions: list[Decision], lead: int = 0) -> Decision:
    """A claim of several parts: reproduced only when every part is, contradicted when any part is. Its shape,
    effect and interval are part `lead`'s, the part in the paper's direction. Its p-value of "reproduced" is
    its parts' largest (an intersection–union test); of "contradicted", the smallest times the number of parts
    (Bonferroni), valid however many κ a claim joins, so it may lie above 0.05 where one part reads contradicted."""
    verdicts = {d.verdict for d in decisions}
    verdict = (REPRODUCED if verdicts == {REPRODUCED} else CONTRADICTED if CONTRADICTED in verdicts
               else NOT_REPRODUCED)
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
        """The first part's margin; None for a signed part."""
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


SPREADS = ("bounded", "estimated", "known")  # how `simulate` measures the unit of the effects


def simulate(kind: Kind, effect: float, seeds: int, trials: int = 2000, noise: float = 1.0,
             rng_seed: int = 0, spread: str = "known") -> dict:
    """Each verdict's frequency over `trials` simulated reproductions of `kind`, with `seeds` paired seeds
    whose per-seed effect is normal, of mean `effect` and sd `noise` (both in spreads). The first part carries
    `effect` (for an equivalence part, the true distance between the two settings); further parts of a joined
    kind hold the paper's other statement exactly (effect 0).

    `spread`: "known", the effects are in the true spread; "bounded", as `judge` measures them: divided by a
    pair spread estimated from `seeds` simulated baselines, the rules told its degrees of freedom so that they
    bound it; "estimated", divided by that estimate with the rules not told, so that the frequencies show
    what the spread's own error does to rules that take it as exact."""
    if seeds < 2:
        raise ValueError(f"--seeds must be at least 2 for an interval, got {seeds}")
    if trials < 1:
        raise ValueError(f"--trials must be at least 1, got {trials}")
    if not (math.isfinite(effect) and math.isfinite(noise)) or noise <= 0:
        raise ValueError(f"the effect must be finite and the noise finite and > 0, got {effect} and {noise}")
    if spread not in SPREADS:
        raise ValueError(f"unknown spread {spread!r}; choose one of: {', '.join(SPREADS)}")
    rng = random.Random(rng_seed)
    parts = tuple(replace(p, spread_df=seeds - 1) for p in kind.parts) if spread == "bounded" else kind.parts
    counts = dict.fromkeys(VERDICTS, 0)
    for _ in range(trials):
        scale = 1.0 if spread == "known" else _estimated_spread(rng, seeds)
        decisions = [decide(part, [rng.gauss(effect if i == 0 else 0.0, noise) / scale for _ in range(seeds)],
                            with_p_values=False) for i, part in enumerate(parts)]
        counts[join(decisions).verdict] += 1
    return {"kind": kind.name, "shape": kind.shape, "effect": effect, "seeds": seeds, "trials": trials,
            "noise": noise, "spread": spread, "verdicts": {v: c / trials for v, c in counts.items()},
            "size": kind.parts[0].clears, "margin": kind.margin,
            "mde": parts[0].detectable(noise, seeds), "seeds_for_effect": parts[0].seeds_for(effect, noise)}


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


def power_grid(effects=GRID_EFFECTS, seeds=GRID_SEEDS, trials: int = GRID_TRIALS, spread: str = "known") -> list[dict]:
    """`simulate` for every kind, effect and seed count: the tables docs/reproduce.md prints."""
    return [simulate(k, e, n, trials, spread=spread) for k in KINDS.values() for n in seeds for e in effects]


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
