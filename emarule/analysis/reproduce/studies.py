"""The parabola's and the precision study's claims, computed from their results.json. Torch-free.

Each check returns a `Check`: a verdict by the rule written in its docstring (and in the experiment's
page), the rule's words, one line of the measured numbers a reader needs (`why`), and the measured values
(`numbers`). `judge_study` makes each a `judge.Verdict` of shape "exact": the studies' numbers are exact
expectations (the parabola in D = 1) or one deterministic computation, so every rule is a threshold on
them and gives reproduced or contradicted, or not measured where results.json lacks the data.

The parabola's checks are judged under the paper's own EMA Definition (pre: ζ_{k+1} = ρζ_k + (1 − ρ)θ_k)
at ρ_B = 0.9999, D = 1 (Fig. 1) unless they say otherwise. The same rule is applied to the post
convention (ζ from θ_{k+1}); its reading is kept in `numbers["post"]`, and `why` names it where it differs.
The "floor" of the parabola is Err(ρ*), the error no momentum beats at that κ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce.judge import Verdict

MAIN_RHO = 0.9999
FACTOR = 2.0  # "large" / "match": a factor of 2 between the errors compared
TRACK_TOLERANCE = 0.05  # "tracks ρ*": 1 − ρ* within 5 % of 1 − ρ_B^κ
ONSET_KAPPA = 256
ONSET_SLOPE = 1.5  # an onset: the slope into κ=256 at least 1.5× the median slope for κ ≤ 64
INFLECTION_RISE = 0.02  # the log–log slope rises by this much after its minimum
DIM_TOLERANCE = 0.10  # "no significant differences" across D
GROWTH = 2.0  # a spread "grows" as ρ → its largest: the largest there, and more than 2× the smallest ρ's

POST_READS = "the post-update convention reads"  # `why`'s words where the post convention's verdict differs
PRE = ("; judged under the paper's EMA Definition (pre: ζ from θ_k); the post convention (ζ from θ_{k+1}) is judged "
       "by the same rule and reported beside")


@dataclass
class Check:
    """What one check found: its verdict, the rule's words, one line of numbers, the numbers themselves."""

    verdict: str
    rule: str
    why: str
    numbers: dict = field(default_factory=dict)


def _unmeasured(rule: str, why: str, numbers: dict | None = None) -> Check:
    return Check(R.NOT_MEASURED, rule, why, numbers or {})


def _binary(ok: bool) -> str:
    return R.REPRODUCED if ok else R.CONTRADICTED


def _rows(records: list, rho: float = MAIN_RHO, dim: int = 1, convention: str = "pre") -> dict:
    return {r["kappa"]: r for r in records
            if math.isclose(r["rho_base"], rho) and r["dim"] == dim and r["convention"] == convention}


def _ratio(r: dict) -> float:
    """(1 − ρ*)/(1 − ρ_B^κ): 1 when the rule is ρ*; below 1 means ρ* above the rule."""
    return (1.0 - r["rho_star"]) / (1.0 - r["rho_rule"])


def _slopes(rows: dict, key: str) -> list[tuple[float, float, float]]:
    ks = sorted(k for k in rows if k >= 2 and rows[k][key] > 0)
    return [(a, b, math.log(rows[b][key] / rows[a][key]) / math.log(b / a)) for a, b in zip(ks, ks[1:], strict=False)]


def _pre_post(rule: str, one, missing: str, numbers: dict | None = None) -> Check:
    """A parabola check in the paper's convention (pre: the verdict) with the post one beside it (in `numbers`,
    and in `why` where it reads otherwise). `one(convention)` gives (verdict, why, numbers), or None where the
    records lack what the check needs: not measured when pre lacks it."""
    pre = one("pre")
    if pre is None:
        return _unmeasured(rule + PRE, missing, numbers)
    post = one("post")
    verdict, why, numbers = pre
    numbers = dict(numbers)
    if post is not None:
        pv, _, pnum = post
        numbers["post"] = {"verdict": pv} | pnum
        if pv != verdict:
            why += f"; {POST_READS} {pv}"
    return Check(verdict, rule + PRE, why, numbers)


MATCH_RULE = (f"reproduced when Err without the rule ≥ {FACTOR:g} × Err with it and Err with it ≤ {FACTOR:g} × the "
              f"floor Err(ρ*); contradicted otherwise")


def parabola_match(records: list, kappa: float) -> Check:
    """Err = max over the run of |Δ E ζ|; the floor Err(ρ*) is the error no momentum beats."""
    k = int(kappa)

    def one(conv):
        r = _rows(records, convention=conv).get(k)
        if r is None:
            return None
        ok = r["err_no_rule"] >= FACTOR * r["err_rule"] and r["err_rule"] <= FACTOR * r["err_star"]
        nums = {"err_rule": r["err_rule"], "err_no_rule": r["err_no_rule"], "err_rho_star": r["err_star"],
                "err_no_rule_over_err_rule": r["err_no_rule"] / r["err_rule"] if r["err_rule"] else None,
                "err_rule_over_err_rho_star": r["err_rule"] / r["err_star"] if r["err_star"] else None}
        why = (f"κ={k}, ρ_B={MAIN_RHO}, D=1: Err with the rule {r['err_rule']:.3g}, without {r['err_no_rule']:.3g}, "
               f"floor Err(ρ*) {r['err_star']:.3g}")
        return _binary(ok), why, nums

    return _pre_post(MATCH_RULE, one, f"κ={k} is not in the study's κ")


TRACK_RULE = (f"reproduced when |(1 − ρ*)/(1 − ρ_B^κ) − 1| ≤ {TRACK_TOLERANCE:.0%} at every κ from 2 up to (not "
              f"including) {ONSET_KAPPA}; contradicted otherwise")


def parabola_tracks_rho_star(records: list) -> Check:
    """"Tracks ρ* until κ=256, when ρ* become systematically higher": the first half."""
    def one(conv):
        dev = {k: abs(_ratio(r) - 1.0) for k, r in _rows(records, convention=conv).items() if 1 < k < ONSET_KAPPA}
        if not dev:
            return None
        worst = max(dev, key=dev.get)
        why = f"max over 2 ≤ κ < {ONSET_KAPPA} of |(1 − ρ*)/(1 − ρ_B^κ) − 1|: {dev[worst]:.2%} at κ={worst}"
        return _binary(dev[worst] <= TRACK_TOLERANCE), why, {"relative_deviation_1_minus_rho": dev,
                                                             "max_relative_deviation": dev[worst]}

    return _pre_post(TRACK_RULE, one, f"no κ in 2…{ONSET_KAPPA // 2} was computed")


HIGHER_RULE = f"reproduced when ρ* > ρ_B^κ at every κ ≥ {ONSET_KAPPA} computed; contradicted otherwise"


def parabola_rho_star_higher(records: list) -> Check:
    """"Systematically higher": at every κ from the onset on, not at some."""
    def one(conv):
        rows = {k: r for k, r in _rows(records, convention=conv).items() if k >= ONSET_KAPPA}
        if not rows:
            return None
        ratio = {k: _ratio(r) for k, r in rows.items()}
        below = [k for k, r in rows.items() if r["rho_star"] <= r["rho_rule"]]
        listed = ", ".join(f"κ={k}: {v:.3f}" for k, v in sorted(ratio.items()))
        why = f"(1 − ρ*)/(1 − ρ_B^κ), below 1 where ρ* is higher: {listed}"
        return _binary(not below), why, {"ratio": ratio, "rho_star_minus_rule": {
            k: r["rho_star"] - r["rho_rule"] for k, r in rows.items()}, "not_higher_at": below}

    return _pre_post(HIGHER_RULE, one, f"no κ ≥ {ONSET_KAPPA} was computed")


ONSET_RULE = (f"read as an onset: reproduced when the log–log slope of the target's Err from κ=128 to {ONSET_KAPPA} is "
              f"≥ {ONSET_SLOPE:g} × the median slope over intervals ending at κ ≤ 64; contradicted otherwise")


def parabola_target_onset(records: list) -> Check:
    """The target model is EMA-free, so the conventions agree; only pre is read."""
    rows = _rows(records)
    slopes = _slopes(rows, "err_target")
    small = sorted(s for a, b, s in slopes if b <= 64)
    at = [s for a, b, s in slopes if b == ONSET_KAPPA]
    numbers = {"slopes": {f"{a:g}→{b:g}": s for a, b, s in slopes},
               "err_target": {k: r["err_target"] for k, r in rows.items() if k > 1},
               "err_target_over_err_rule": {k: r["err_target"] / r["err_rule"] for k, r in rows.items()
                                            if k > 1 and r["err_rule"]}}
    rule = ONSET_RULE + "; the target model is EMA-free, so the pre and post conventions read the same (pre's is read)"
    if not small or not at:
        return _unmeasured(rule, f"needs κ ≤ 64 and an interval ending at κ={ONSET_KAPPA}", numbers)
    med, s = small[len(small) // 2], at[0]
    numbers |= {"slope_into_onset": s, "median_slope_small_kappa": med, "ratio": s / med if med else None}
    why = f"log–log slope of the target's Err: {s:.3f} from κ=128 to {ONSET_KAPPA}, median {med:.3f} for κ ≤ 64"
    return Check(_binary(s >= ONSET_SLOPE * med), rule, why, numbers)


INFLECTION_RULE = (f"reproduced when the log–log slope of Err with the rule is smallest on an interval starting at "
                   f"κ = 32…128 and the last slope exceeds it by ≥ {INFLECTION_RISE:g}; contradicted otherwise")


def parabola_inflection(records: list) -> Check:
    """An inflection near κ=64: contradicted where the slope's minimum lies elsewhere, on the last interval, or
    rises too little after it."""
    def one(conv):
        sl = _slopes(_rows(records, convention=conv), "err_rule")
        if len(sl) < 3:
            return None
        i = min(range(len(sl)), key=lambda j: sl[j][2])
        a, b, s = sl[i]
        rise = sl[-1][2] - s
        ok = i < len(sl) - 1 and 32 <= a <= 128 and rise >= INFLECTION_RISE
        why = f"slope of Err with the rule: minimum {s:.3f} on κ {a:g}→{b:g}, last {sl[-1][2]:.3f} (rise {rise:.3f})"
        return _binary(ok), why, {"slopes": {f"{x:g}→{y:g}": v for x, y, v in sl}, "minimum_on": f"{a:g}→{b:g}",
                                  "rise_after_minimum": rise}

    return _pre_post(INFLECTION_RULE, one, "too few κ to see a slope change")


LOWER_RULE = "reproduced when Err with the rule is larger for every lower ρ_B at every κ ≥ 2 (D = 1); contradicted " \
             "otherwise"


def parabola_lower_rho_worse(records: list) -> Check:
    """"Higher for lower momenta", at every κ ≥ 2 that all ρ_B share: the order broken at any κ contradicts it."""
    rhos = sorted({r["rho_base"] for r in records if r["dim"] == 1}, reverse=True)
    if len(rhos) < 2:
        return _unmeasured(LOWER_RULE + PRE, "needs two ρ_B or more in D = 1", {"rho_bases": rhos})

    def one(conv):
        per = {rho: _rows(records, rho, 1, conv) for rho in rhos}
        ks = sorted(set.intersection(*(set(p) for p in per.values())))
        ordered = {k: all(per[a][k]["err_rule"] < per[b][k]["err_rule"] for a, b in zip(rhos, rhos[1:], strict=False))
                   for k in ks if k >= 2}
        if not ordered:
            return None
        broken = [k for k, v in ordered.items() if not v]
        why = (f"ρ_B ∈ {{{', '.join(f'{r:g}' for r in rhos)}}}, {len(ordered)} κ: "
               + (f"order broken at κ = {', '.join(map(str, broken))}" if broken else "ordered at every κ"))
        return _binary(not broken), why, {"rho_bases": rhos, "ordered": ordered, "broken_at": broken}

    return _pre_post(LOWER_RULE, one, "no κ ≥ 2 shared by the ρ_B", {"rho_bases": rhos, "ordered": {}, "broken_at": []})


DIM_RULE = (f"reproduced when Err with the rule and 1 − ρ* in every D > 1 differ from D = 1 by ≤ {DIM_TOLERANCE:.0%} "
            f"(relative) at every κ ≥ 2; contradicted otherwise")


def parabola_dimensions(records: list) -> Check:
    """"No significant differences as we vary dimensions", at ρ_B = 0.9999. A 10 % difference does not show on
    the paper's log-scale axes, which span decades; the D > 1 numbers are Monte Carlo hold-out estimates."""
    dims = sorted({r["dim"] for r in records if r["dim"] > 1 and math.isclose(r["rho_base"], MAIN_RHO)})
    if not dims:
        return _unmeasured(DIM_RULE + PRE, "no D > 1 was computed", {"dims": []})

    def one(conv):
        base = _rows(records, convention=conv)
        err, rho = {}, {}
        for d in dims:
            for k, r in _rows(records, MAIN_RHO, d, conv).items():
                if k >= 2 and k in base and base[k]["err_rule"] > 0:
                    err[f"D={d} κ={k}"] = abs(r["err_rule"] / base[k]["err_rule"] - 1.0)
                    rho[f"D={d} κ={k}"] = abs((1 - r["rho_star"]) / (1 - base[k]["rho_star"]) - 1.0)
        if not err:
            return None
        at = max(err, key=lambda x: max(err[x], rho[x]))
        we, wr = max(err.values()), max(rho.values())
        why = (f"D ∈ {{{', '.join(map(str, dims))}}} against D=1: Err with the rule within {we:.2%}, 1 − ρ* within "
               f"{wr:.2%} (largest at {at})")
        return _binary(max(we, wr) <= DIM_TOLERANCE), why, {
            "dims": dims, "max_relative_err_rule_difference": we, "max_relative_1_minus_rho_star_difference": wr,
            "largest_at": at}

    return _pre_post(DIM_RULE, one, "no κ ≥ 2 of a D > 1 shared with D = 1 in the pre convention", {"dims": dims})


NO_RULE_RULE = (f"reproduced when Err without the rule ≥ {FACTOR:g} × Err with it at every κ ≥ 2 and every ρ_B "
                f"(D = 1); contradicted otherwise")


def parabola_no_rule_large(records: list) -> Check:
    """"Not changing the momentum induces large approximation error"."""
    def one(conv):
        ratios = {f"ρ_B={r['rho_base']:g} κ={r['kappa']}": r["err_no_rule"] / r["err_rule"] for r in records
                  if r["dim"] == 1 and r["convention"] == conv and r["kappa"] >= 2 and r["err_rule"] > 0}
        if not ratios:
            return None
        at = min(ratios, key=ratios.get)
        why = f"Err without the rule / with it, over every ρ_B and κ ≥ 2: smallest {ratios[at]:.3g} (at {at})"
        return _binary(ratios[at] >= FACTOR), why, {"min_err_no_rule_over_err_rule": ratios[at], "at": at,
                                                    "err_no_rule_over_err_rule": ratios}

    return _pre_post(NO_RULE_RULE, one, "no κ ≥ 2 was computed")


# --- precision ----------------------------------------------------------------------------------


def _by_run(results: dict, run: str) -> list:
    return sorted((r for r in results["records"] if r["run"] == run), key=lambda r: r["momentum"])


def horizon(rho: float) -> float:
    """1/(1 − ρ): the steps an EMA of momentum ρ averages over."""
    return 1.0 / (1.0 - rho)


def _steps(results: dict) -> int | None:
    steps = (results.get("config") or {}).get("steps")
    return int(steps) if steps else None


def _covered(results: dict, rows: list) -> tuple[list, int | None]:
    """The rows whose momentum's horizon 1/(1 − ρ) the run's steps cover (a relative 1e-9 for the rounding of
    1 − ρ), and the steps run."""
    steps = _steps(results)
    if steps is None:
        return [], None
    return [r for r in rows if steps >= horizon(r["momentum"]) * (1 - 1e-9)], steps


def grows(std: dict) -> bool:
    """A spread grows as ρ → its largest: it is largest at the largest ρ, and more than GROWTH × the spread at
    the smallest ρ."""
    ms = sorted(std)
    top, low = std[ms[-1]], std[ms[0]]
    return top >= max(std.values()) and top > GROWTH * low


GROWS = (f"the std over repeats of {{run}}'s EMA MaxAbsDiff grows as ρ → its largest: it is largest at the "
         f"largest ρ and more than {GROWTH:g}× the std at the smallest ρ, over the momenta whose horizon 1/(1 − ρ) "
         f"the run's steps cover")


def variance_rule(run: str, paper_grows: bool) -> str:
    grow = GROWS.format(run=run)
    return f"reproduced when {grow}; contradicted otherwise" if paper_grows else \
        f"reproduced unless {grow}; contradicted when it does"


def _variance(results: dict, run: str, paper_grows: bool, extra=None) -> Check:
    """FP16's variance grows (`paper_grows`), BF16's and FP32's do not: judged by `grows` on the covered ρ."""
    rule = variance_rule(run, paper_grows)
    rows = _by_run(results, run)
    if not rows:
        return _unmeasured(rule, f"no {run} run in results.json")
    judged, steps = _covered(results, rows)
    top = rows[-1]["momentum"]
    numbers = {"steps": steps, "horizon_at_largest_rho": horizon(top), "largest_rho": top,
               "judged_momenta": [r["momentum"] for r in judged],
               f"{run}_ema_maxabsdiff_std": {r["momentum"]: r["ema_maxabsdiff_std"] for r in rows},
               f"{run}_ema_maxabsdiff": {r["momentum"]: r["ema_maxabsdiff"] for r in rows},
               f"{run}_ema_maxabsdiff_relative": {r["momentum"]: r["ema_maxabsdiff_relative"] for r in rows}}
    if steps is None:
        return _unmeasured(rule, "results.json lacks config.steps, so the momenta the run covers are unknown", numbers)
    if len(judged) < 2:
        return _unmeasured(rule, f"{steps} steps cover the horizon 1/(1 − ρ) of fewer than two momenta", numbers)
    std = {r["momentum"]: r["ema_maxabsdiff_std"] for r in judged}
    hi, lo = max(std), min(std)
    g = grows(std)
    numbers |= {"std_largest_over_smallest": std[hi] / std[lo] if std[lo] else None, "grows": g}
    cover = "" if hi == top else f"; {steps} steps < horizon {horizon(top):,.0f} of ρ={top:g}"
    why = (f"{run} EMA MaxAbsDiff std: {std[lo]:.2g} at ρ={lo:g}, {std[hi]:.2g} at ρ={hi:g}, largest at "
           f"ρ={max(std, key=std.get):g}{cover}")
    if extra:
        numbers |= extra[0]
        why += extra[1]
    return Check(_binary(g == paper_grows), rule, why, numbers)


def precision_fp16_variance(results: dict) -> Check:
    """"An increasing variance happens for FP16 as ρ approaches 0.99999". Only the momenta whose horizon the
    run's steps cover are judged: an EMA that has not run its horizon has barely moved from its start."""
    return _variance(results, "fp16", True)


def _times(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.2g}"


def precision_bf16_stable(results: dict) -> Check:
    """"Whereas BF16 [is] stable", read by the sentence's FP16 clause. BF16's EMA MaxAbsDiff over a second FP32
    run's with another data order (fp32_seed) is reported beside it."""
    bf, seed = _by_run(results, "bf16"), _by_run(results, "fp32_seed")
    extra = None
    if bf and seed:
        ratio = {b["momentum"]: b["ema_maxabsdiff"] / s["ema_maxabsdiff"] for b, s in zip(bf, seed, strict=True)
                 if s["ema_maxabsdiff"]}
        if ratio:
            extra = ({"bf16_over_fp32_seed": ratio},
                     f"; {_times(min(ratio.values()))}–{_times(max(ratio.values()))}× fp32_seed's MaxAbsDiff")
    return _variance(results, "bf16", False, extra)


def precision_fp32_stable(results: dict) -> Check:
    """"Whereas FP32 [is] stable", read as BF16's, on a second FP32 run whose gradients are summed in another
    order (fp32_reorder); its largest MaxAbsDiff relative to the weights is reported beside it."""
    rows = _by_run(results, "fp32_reorder")
    extra = None
    if rows:
        worst = max(r["ema_maxabsdiff_relative"] for r in rows)
        extra = ({"fp32_reorder_max_relative": worst}, f"; ≤ {worst:.2g} of the weights")
    return _variance(results, "fp32_reorder", False, extra)


RANGE_RULE = ("reproduced when `emarule limits --momentum 0.996 --batch-size 4096` gives a smallest meaningful batch "
              "below one sample and a largest of a million or more; contradicted otherwise")


def precision_fp32_range(results: dict | None = None, lim=None) -> Check:
    """`lim` stands in for the limits (their `kappa_update` and `kappa_max`) where a test needs other ones."""
    from emarule.scaling.limits import limits

    lim = lim if lim is not None else limits(0.996, 4096, "float32")
    lo, hi = lim.kappa_update * 4096, lim.kappa_max * 4096
    numbers = {"kappa_update": lim.kappa_update, "kappa_max": lim.kappa_max, "batch_min": lo, "batch_max": hi,
               "paper": {"kappa_max": "≈ 4K", "batch_max": "≈ 8M"}}
    why = f"meaningful for batches {lo:.3g} … {hi:.3g} (κ up to {lim.kappa_max:.0f}; the paper: κ ≈ 4K, B ≈ 8M)"
    return Check(_binary(lo < 1 and hi >= 1e6), RANGE_RULE, why, numbers)


CHECKS = {
    "parabola_match": parabola_match, "parabola_tracks_rho_star": parabola_tracks_rho_star,
    "parabola_rho_star_higher": parabola_rho_star_higher, "parabola_target_onset": parabola_target_onset,
    "parabola_inflection": parabola_inflection, "parabola_lower_rho_worse": parabola_lower_rho_worse,
    "parabola_dimensions": parabola_dimensions, "parabola_no_rule_large": parabola_no_rule_large,
    "precision_fp16_variance": precision_fp16_variance, "precision_bf16_stable": precision_bf16_stable,
    "precision_fp32_stable": precision_fp32_stable, "precision_fp32_range": precision_fp32_range,
}


# Each check's rule in the words its verdict.json records (the parabola's with PRE after them), as
# docs/reproduce.md prints them (`rules_markdown`).
RULES = {
    "parabola_match": MATCH_RULE, "parabola_tracks_rho_star": TRACK_RULE, "parabola_rho_star_higher": HIGHER_RULE,
    "parabola_target_onset": ONSET_RULE, "parabola_inflection": INFLECTION_RULE,
    "parabola_lower_rho_worse": LOWER_RULE, "parabola_dimensions": DIM_RULE, "parabola_no_rule_large": NO_RULE_RULE,
    "precision_fp16_variance": variance_rule("fp16", True), "precision_bf16_stable": variance_rule("bf16", False),
    "precision_fp32_stable": variance_rule("fp32_reorder", False), "precision_fp32_range": RANGE_RULE,
}


def rules_markdown() -> str:
    """Every check's rule as a Markdown table: the check, then its rule."""
    rows = [f"| `{name}` | {rule.replace('|', chr(92) + '|')} |" for name, rule in RULES.items()]
    return "\n".join(["| check | rule |", "|---|---|", *rows])


# What each check measures (verdict.json's "metric").
MEASURES = {
    "parabola_match": "err", "parabola_tracks_rho_star": "rho_star", "parabola_rho_star_higher": "rho_star",
    "parabola_target_onset": "err_target", "parabola_inflection": "err_rule", "parabola_lower_rho_worse": "err_rule",
    "parabola_dimensions": "err_rule", "parabola_no_rule_large": "err_no_rule",
    "precision_fp16_variance": "ema_maxabsdiff_std", "precision_bf16_stable": "ema_maxabsdiff_std",
    "precision_fp32_stable": "ema_maxabsdiff_std", "precision_fp32_range": "batch range",
}


STATISTICS = {k: "exact E ζ (D=1); Monte Carlo hold-out (D>1)" for k in MEASURES if k.startswith("parabola")}
STATISTICS |= {k: "mean and std over repeats" for k in MEASURES if k.startswith("precision")}
STATISTICS["precision_fp32_range"] = "computed (emarule limits)"


def judge_check(family, claim, results) -> Verdict:
    """One study claim as a `Verdict` of shape "exact"."""
    check = CHECKS[claim.kind]
    res = check(results, claim.kappa) if claim.kappa is not None else check(results)
    return Verdict.of(claim, metric=MEASURES[claim.kind], verdict=res.verdict, shape="exact",
                      statistic=STATISTICS.get(claim.kind, family.name), rule=res.rule, why=res.why,
                      numbers=res.numbers)


def judge_study(family, results) -> list[dict]:
    return [judge_check(family, c, results).as_dict() for c in family.claims]
