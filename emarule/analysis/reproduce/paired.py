"""The paired statistics of a sweep family's runs: curves, gaps to each seed's own baseline, the baselines'
pair spread. Torch-free. The decisions made from them are in `rules` (the rules) and `judge` (which effect
each claim is judged on).

- Pairing: every seed runs the κ=1 baseline and each setting from the same initial weights and the same
  data order, so each setting's run is compared with ITS OWN seed's baseline. Per-step training metrics
  are first smoothed by a trailing mean over `Metric.smooth_epochs`, the same window for every run.
- Per seed, the run's curve is interpolated onto its baseline's evaluation grid
  (`emarule.analysis.compare.gap`), on the part both cover. Signed: Δ = run − baseline, its mean over the
  run ("run") and its value at the last grid point ("end"). Unsigned, the gap: mean |Δ| and |Δ| at the end.
- Intervals of a mean over seeds are Student-t intervals (`rules.summarize`), which keep their coverage at
  5 seeds.
- Pair spread, the noise scale: each baseline seed against each OTHER baseline seed, one run against one
  run as a paired comparison is, over the n(n − 1) ordered pairs: the root mean square of the signed
  statistic (the scale of signed effects, in which margins are written) and the mean of the gap (the
  scale of gaps). Undefined below 2 seeds.
- A run that stops before its baseline's end (it diverged) has an infinite gap and no signed effect; a
  setting with a run that never logged the metric (its pseudo-labeling never started) has no gap.
"""

from __future__ import annotations

import itertools
import math

from emarule.analysis.compare import gap, mean_curve
from emarule.analysis.reproduce.rules import summarize

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


# --- statistics, paired ---------------------------------------------------------------------------


def _mean(v: list) -> float | None:
    return sum(v) / len(v) if v else None


def _stopped(known: bool | None, end: float, reference: float) -> bool:
    """Whether a run stopped before its own end: from its record where `known`, else from where its curve ends
    against the reference's."""
    return bool(known) if known is not None else end < INCOMPLETE * reference


def _measures(g: dict) -> tuple:
    """One comparison's (`compare.gap`) mean |Δ|, |Δ| at the end, mean Δ and Δ at the end."""
    return g["gap_mean"], abs(g["gap_final"]), g["signed_mean"], g["gap_final"]


def _columns(rows: list) -> list:
    """The four measures' lists, from one row of them per comparison."""
    return [list(column) for column in zip(*rows, strict=True)] or [[], [], [], []]


def gaps(curves: list, base: tuple[list, list], stopped: list | None = None) -> dict:
    """Every run against one curve, `base` (the mean of the baselines, or of the other baseline seeds), as
    `paired_gaps` measures each against its own seed's baseline. `stopped[i]`: whether run i stopped before its
    planned end (None: judged from the curves)."""
    return paired_gaps(curves, [base] * len(curves), stopped)


def mean_ci(values: list, level: float = 0.95) -> tuple[float, float] | None:
    """The two-sided Student-t interval of the mean over seeds (`rules.summarize`). None below 2 values;
    (−∞, +∞) when a value is infinite (a run that stopped early): no bound."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 2:
        return None
    s = summarize(vals)
    return s.ci95 if level == 0.95 else s.ci90


def differences(a: list, b: list) -> list:
    """Per seed b_i − a_i (paired: the same seed's runs). Two runs that both stopped early differ by 0."""
    return [0.0 if math.isinf(x) and math.isinf(y) else y - x for x, y in zip(a, b, strict=True)
            if x is not None and y is not None]


def paired_gaps(curves: list, base_curves: list, stopped: list | None = None) -> dict:
    """Each seed's run against ITS OWN seed's baseline (`curves[i]` and `base_curves[i]` share the seed): per
    seed the gap and the signed Δ, over the run and at the end; the gaps' means over seeds with a t interval of
    each. A run that stopped early: gap ∞, signed Δ none. `stopped` as in `gaps`."""
    empty = {"run": None, "end": None, "seeds": len(curves), "incomplete": 0, "missing": 0, "per_seed_run": [],
             "per_seed_end": [], "ci_run": None, "ci_end": None, "signed_run": [], "signed_end": []}
    missing = sum(1 for c in curves if not c[0])
    if missing:  # a run that never logged the metric (pseudo-labeling never started): nothing to compare
        return empty | {"missing": missing}
    rows, incomplete = [], 0
    for i, (c, b) in enumerate(zip(curves, base_curves, strict=True)):
        if not b[0]:
            return empty | {"missing": 1}
        if _stopped(None if stopped is None else stopped[i], c[0][-1], b[0][-1]):
            incomplete += 1
            rows.append((math.inf, math.inf, None, None))
            continue
        g = gap(c, b)
        if g["gap_mean"] is None:  # it ran to the end but starts after the baseline's last point: no overlap
            return empty | {"no_overlap": 1}
        rows.append(_measures(g))
    runs, ends, s_runs, s_ends = _columns(rows)
    return {"run": _mean(runs), "end": _mean(ends), "seeds": len(curves), "incomplete": incomplete, "missing": 0,
            "per_seed_run": runs, "per_seed_end": ends, "ci_run": mean_ci(runs), "ci_end": mean_ci(ends),
            "signed_run": s_runs, "signed_end": s_ends}


def pair_spread(curves: list, stopped: list | None = None) -> dict | None:
    """The noise scale of a paired comparison, over the ordered pairs of baseline seeds that share evaluation
    points: the mean of the gap ("run", "end") and the root mean square of the signed Δ ("signed_run",
    "signed_end"). None below 2 seeds, or without such a pair. `stopped` as in `gaps`."""
    keep = [i for i, c in enumerate(curves) if c[0]]
    if len(keep) < 2:
        return None
    rows = []
    for i, j in itertools.permutations(keep, 2):
        if _stopped(None if stopped is None else stopped[i], curves[i][0][-1], curves[j][0][-1]):
            rows.append((math.inf,) * 4)
        elif (g := gap(curves[i], curves[j]))["gap_mean"] is not None:
            rows.append(_measures(g))
    if not rows:
        return None
    runs, ends, s_runs, s_ends = _columns(rows)
    rms = lambda v: math.sqrt(sum(x * x for x in v) / len(v))  # noqa: E731
    return {"run": _mean(runs), "end": _mean(ends), "signed_run": rms(s_runs), "signed_end": rms(s_ends),
            "seeds": len(keep), "pairs": len(runs)}


def spread(curves: list) -> dict | None:
    """Leave-one-out: each baseline seed against the mean of the others, averaged. None below 2 seeds."""
    curves = [c for c in curves if c[0]]
    if len(curves) < 2:
        return None
    loo = [gaps([c], mean_curve(curves[:i] + curves[i + 1:])[:2]) for i, c in enumerate(curves)]
    loo = [g for g in loo if g["run"] is not None]
    if not loo:
        return None
    return {"run": _mean([g["run"] for g in loo]), "end": _mean([g["end"] for g in loo]), "seeds": len(curves)}


def loo_spread(values: list) -> float | None:
    """The spread of scalars as the baseline's: each against the mean of the others, |Δ| averaged."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    total = sum(vals)
    return sum(abs(v - (total - v) / (len(vals) - 1)) for v in vals) / len(vals)


def unbounded(*spreads: float | None) -> bool:
    """Whether a spread is infinite: a baseline seed stopped early (`pair_spread`)."""
    return any(v is not None and math.isinf(v) for v in spreads)
