"""One claim of a sweep family, judged: which signed per-seed effects its parts are, then the rules. Torch-free.

`part_effects` builds each part of a claim kind (the shapes and margins of `rules.KINDS`) as the table below
gives it: the per-seed effect it is judged on, in the metric's units and signed so that the paper's direction
is positive, and the scale the effect is divided by before the rules see it (the baselines' pair spread of the
same statistic; `paired.pair_spread`). Before any rule, in this order, a claim is

- not measured, where a run it needs is missing or never logged the metric;
- set aside, where it is about the EMA and the target model strays with the rule at its setting (the
  optimizer rule already fails there: the optimizer-rule check, `measure.track_table`);
- not testable at this preset, where the preset lacks the mechanism the claim needs (`mechanisms`).

A part's size or margin of one spread is bounded by the rules, given the spread's degrees of freedom
(`scale_df`: one fewer than the baselines). What the rules would have said is kept beside those three
(`verdict_if_applicable`). σ below is +1 for a
metric where higher is better, −1 otherwise; Δ_X(s) = run X of seed s − baseline of seed s, over the run
(its mean) or at the end; g_X(s) the gap, |Δ| likewise.

    rule_needed       without departs:  −σ·Δ_without  (worse without: positive)        directional > 1 spread
                      with matches:     −σ·Δ_with                                     equivalence ±1
    rule_departs      the same, the first part in either direction                   departure
    rule_closer       g_without − r·g_with, r the ratio the claim states (1: closer)  comparative
    gap_remains       −σ·Δ_A (A worse than the baseline)                              directional
    same_either_way   without matches, with matches: −σ·Δ_without, −σ·Δ_with        equivalence ±1 each
    arm_closer        g_B − g_A                                                       comparative
    matches_or_better σ·Δ_A at the end                                                noninferior −1
    with_better       σ·(Δ_with − Δ_without) at the end, at every κ run               directional each
    ema_above_target  σ·(EMA − target) at the end, per baseline seed                  directional
    target_explains   needs an EMA gap with the rule (−σ·Δ_with on the EMA metric reproduced as a
                      directional effect, else not testable); then −σ·Δ_with on the target metric  directional
    optimizer_strays  −σ·Δ_with on the target metric, in the claim's part of the run  departure
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from emarule.analysis.reproduce import paired as P
from emarule.analysis.reproduce import render as T
from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce.claims import STANDARD, Claim, Family, setting_key

STATISTIC = {("signed", "run"): "mean Δ over the run", ("signed", "end"): "Δ at the end",
             ("gap", "run"): "mean |Δ| over the run", ("gap", "end"): "|Δ| at the end"}
# The claim kinds about the EMA at one setting: meaningful only where the target model tracks.
GATED = ("rule_needed", "rule_departs", "rule_closer", "gap_remains", "same_either_way", "arm_closer",
         "matches_or_better", "with_better")
ASIDE_STRAYS = "the target model strays with the rule"


@dataclass
class Verdict:
    """A claim's result, as verdict.json stores it and every renderer reads it. Effects, intervals, minimum
    detectable effects and margins are in the metric's units; `spread` is the scale the rules divided by."""

    claim: str
    short: str
    paper: str
    where: str
    kind: str
    metric: str
    kappa: float | None
    verdict: str
    shape: str = ""
    statistic: str = ""
    effect: float | None = None
    effect_ci: tuple | None = None
    mde: float | None = None
    margin: float | None = None
    spread: float | None = None
    rule: str = ""
    n: int = 0
    seeds_for_paper_effect: int | None = None
    # The p-values behind "reproduced" and "contradicted" (`rules.p_values`; a joined claim's as `rules.join`
    # takes them): the table corrects them over its rows (`rules.holm`).
    p_reproduced: float | None = None
    p_contradicted: float | None = None
    parts: list = field(default_factory=list)
    mechanism: dict | None = None
    set_aside: str | None = None
    verdict_if_applicable: str | None = None
    why: str = ""  # for a claim not measured or set aside: what is missing, or what strays
    stand_in: str = ""  # a κ beyond the paper's range, judged in its place
    settings: dict | None = None  # {"A": ..., "B": ...} where the claim names settings other than with/without
    note: str = ""
    numbers: dict = field(default_factory=dict)  # further measurements: each setting's mean gap, a ratio
    probe_check: str = ""  # for a claim on a probe: whether the probe reads what the teacher learned
    figure: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, claim: Claim, **fields) -> Verdict:
        """The claim's record: its words and place, "not measured" with its kind's shape until `fields` (or a
        verdict) say otherwise."""
        kind = R.KINDS.get(claim.kind)
        base = {"claim": claim.text, "short": claim.short, "paper": claim.paper, "where": claim.where,
                "kind": claim.kind, "metric": claim.metric, "kappa": claim.kappa, "verdict": R.NOT_MEASURED,
                "note": claim.note, "shape": kind.shape if kind else ""}
        return cls(**(base | fields))


# --- per-seed effects ------------------------------------------------------------------------------


def _measured(table: dict, key: tuple) -> dict | None:
    """The setting's gaps; None where the setting was not run or has no Δ."""
    row = table["rows"].get(key)
    return row if row is not None and row["gaps"] and row["gaps"]["run"] is not None else None


def signed(table: dict, key: tuple, over: str) -> dict | None:
    """{seed: Δ} of a setting (run − its seed's baseline); None where the setting was not run or has no Δ."""
    row = _measured(table, key)
    if row is None:
        return None
    vals = row["gaps"][f"signed_{over}"]
    return {s: (math.inf if v is None else v) for s, v in zip(row["seeds"], vals, strict=True)}


def gaps(table: dict, key: tuple, over: str) -> dict | None:
    row = _measured(table, key)
    return None if row is None else dict(zip(row["seeds"], row["gaps"][f"per_seed_{over}"], strict=True))


def scale(table: dict, kind: str, over: str) -> float | None:
    """The baselines' pair spread of the statistic: RMS of Δ between two baselines ("signed"), or their mean
    gap ("gap")."""
    g = table["rows"][("baseline", 1.0)]["gaps"]
    return None if g is None else g[f"signed_{over}" if kind == "signed" else over]


def scale_df(table: dict) -> int | None:
    """The degrees of freedom of the baselines' pair spread: one fewer than the baselines it was measured on,
    or, where pairs sharing no evaluation point were left out of it, than the most baselines whose every pair
    would fit in the pairs it kept (fewer degrees of freedom: a wider, safer bound)."""
    g = table["rows"][("baseline", 1.0)]["gaps"]
    if not g or g.get("seeds", 0) < 2:
        return None
    m = g["seeds"]
    while m > 2 and m * (m - 1) > g.get("pairs", m * (m - 1)):
        m -= 1
    return m - 1


def _paired(*maps: dict) -> list:
    """The seeds every map has, in order."""
    return [s for s in maps[0] if all(s in m for m in maps[1:])]


def sigma(metric) -> float:
    """+1 for a metric where higher is better, −1 otherwise: σ·Δ is positive where the run is better."""
    return 1.0 if metric.higher_is_better else -1.0


@dataclass(frozen=True)
class Effects:
    """One part's per-seed effects (metric units) and its scale."""

    label: str
    values: list
    scale: float | None
    statistic: str
    seeds: tuple = ()  # the seed of each value, where known
    df: int | None = None  # the scale's degrees of freedom (`scale_df`): the rules bound a spread so estimated


def _signed_effects(table: dict, over: str, label: str, values: list, seeds) -> Effects:
    """Effects on the signed statistic, in the scale of the baselines' signed pair spread."""
    return Effects(label, values, scale(table, "signed", over), STATISTIC["signed", over], tuple(seeds),
                   scale_df(table))


def _from_baseline(table: dict, key: tuple, over: str, sign: float, label: str) -> Effects | None:
    """sign·Δ of a setting, per seed; None where it has no Δ."""
    d = signed(table, key, over)
    return None if d is None else _signed_effects(table, over, label, [sign * v for v in d.values()], d)


def part_effects(family: Family, claim: Claim, tables: dict, keys: tuple, kappas: list) -> list[Effects] | str:
    """The per-seed effects of each part of the claim, or the reason (a string) it is not measured."""
    table = tables[claim.metric]
    sig, over = sigma(table["metric"]), claim.over
    ka, kb = keys
    kind = claim.kind

    def worse(key: tuple, label: str) -> Effects | None:  # −σ·Δ: positive where the setting is worse
        return _from_baseline(table, key, over, -sig, label)

    out: list = []
    if kind in ("rule_needed", "rule_departs", "same_either_way"):
        first = "matches" if kind == "same_either_way" else "departs from"
        out = [worse(kb, f"{_label(*kb)} {first} the baseline"), worse(ka, f"{_label(*ka)} matches the baseline")]
    elif kind == "gap_remains":
        out = [worse(ka, f"{_label(*ka)} ends worse than the baseline")]
    elif kind in ("rule_closer", "arm_closer"):
        ga, gb = gaps(table, ka, over), gaps(table, kb, over)
        r, out = claim.ratio if kind == "rule_closer" else 1.0, [None]
        if ga is not None and gb is not None:
            seeds = _paired(ga, gb)
            vals = P.differences([r * ga[s] for s in seeds], [gb[s] for s in seeds])
            what = f"gap of {_label(*kb)} − {f'{r:g} × ' if r != 1 else ''}gap of {_label(*ka)}"
            out = [Effects(what, vals, scale(table, "gap", over), STATISTIC["gap", over], tuple(seeds))]
    elif kind == "matches_or_better":
        out = [_from_baseline(table, ka, "end", sig, f"{_label(*ka)} − the baseline, at the end")]
    elif kind == "with_better":
        for k in kappas:
            w, o = signed(table, ("with", k), "end"), signed(table, ("without", k), "end")
            if w is None or o is None:
                out.append(None)
                continue
            seeds = _paired(w, o)
            out.append(_signed_effects(table, "end", f"with − without the rule at κ={k:g}, at the end",
                                       [sig * (w[s] - o[s]) for s in seeds], seeds))
    elif kind == "ema_above_target":
        ema, target = tables[family.ema_metric.name], tables[family.target_metric.name]
        e, t = ema["rows"][("baseline", 1.0)], target["rows"][("baseline", 1.0)]
        fe, ft = dict(zip(e["seeds"], e["finals"], strict=True)), dict(zip(t["seeds"], t["finals"], strict=True))
        vals = [sig * (fe[s] - ft[s]) for s in fe if s in ft and fe[s] is not None and ft[s] is not None]
        out = [Effects("EMA − target model of each baseline seed, at the end", vals, scale(ema, "signed", "end"),
                       STATISTIC["signed", "end"])]
    elif kind in ("target_explains", "optimizer_strays"):
        t = tables[family.target_metric.name] if kind == "target_explains" else table
        out = [_from_baseline(t, ka, over, -sigma(t["metric"]),
                              f"the target model {_label(*ka)} departs from the baseline")]
    else:
        raise ValueError(f"{family.name}: unknown claim kind {kind!r}")
    if any(e is None for e in out) or not out:
        return "a setting the claim compares was not run, or never logged the metric"
    return out


# --- the decision ---------------------------------------------------------------------------------


def _label(name: str, kappa: float | None) -> str:
    """`with the rule at κ=4`, `arm bn-scale at κ=2`."""
    names = {"with": "with the rule", "without": "without the rule", "linear": "the linear rule"}
    what = names.get(name, f"arm {name}")
    return f"{what} at κ={kappa:g}" if kappa is not None else what


def decide_parts(kind: str, effects: list[Effects], stated: float = 0.0) -> tuple[R.Decision, list[dict]]:
    """Each part through its rule (in spreads), joined; the parts as records in the metric's units. `stated`:
    the size a claim states (in the metric's units, 0 for none) is its first part's size, margin and
    paper's effect in place of one spread."""
    shape_parts = R.KINDS[kind].parts
    decisions, records = [], []
    for i, e in enumerate(effects):
        part = replace(shape_parts[min(i, len(shape_parts) - 1)], spread_df=e.df)
        scaled = bool(e.scale) and math.isfinite(e.scale)
        if i == 0 and stated > 0 and scaled:
            part = replace(part, size=stated / e.scale, margin=stated / e.scale, paper_effect=stated / e.scale,
                           stated=True)
        if scaled:
            d, sc = R.decide(part, [v / e.scale for v in e.values]), e.scale
        else:  # the effect stays measured, in the metric's units
            d, sc = R.Decision(R.NOT_REPRODUCED, part.shape, R.summarize(list(e.values)).mean, (-math.inf, math.inf),
                               math.inf, None, "no finite baseline spread to scale the effect by", len(e.values),
                               route=R.OPEN), 1.0
        decisions.append(d)
        records.append({"label": e.label, "shape": d.shape, "statistic": e.statistic, "verdict": d.verdict,
                        "effect": d.effect * sc, "effect_ci": [d.effect_ci[0] * sc, d.effect_ci[1] * sc],
                        "mde": d.mde * sc, "mde_from_zero": d.mde_from_zero * sc,
                        "margin": None if d.margin is None else d.margin * sc, "spread": e.scale,
                        "spread_df": part.spread_df,
                        "rule": d.rule, "route": d.route, "n": d.n, "p_reproduced": d.p_reproduced,
                        "p_contradicted": d.p_contradicted, "per_seed": list(e.values)})
    return R.join(decisions), records


def judge(family: Family, claim: Claim, tables: dict, kappas: list, gate: dict | None,
          mechanism: dict | None) -> Verdict:
    """The claim's verdict on the measured tables (`measure.metric_table`, one per metric)."""
    keys = tuple(setting_key(family, n, claim.kappa) for n in claim.settings)
    v = Verdict.of(claim)
    v.kappa = keys[0][1] if keys[0][0] not in STANDARD else claim.kappa
    if claim.kind == "with_better" and kappas:
        v.kappa = kappas[-1]
    if claim.settings != STANDARD:  # the kinds that read one setting name only A
        one = claim.kind in ("gap_remains", "matches_or_better")
        v.settings = {"A": _label(*keys[0])} | ({} if one else {"B": _label(*keys[1])})
    if claim.kappa is not None and claim.stand_in_beyond and claim.kappa > claim.stand_in_beyond:
        v.stand_in = (f"κ={claim.kappa:g} lies beyond the paper's range (κ ≤ {claim.stand_in_beyond:g}); judged "
                      f"as a stand-in for it")
    gate_kappas = [k for k in kappas if k != 1.0] if claim.kind == "with_better" else None
    effects = part_effects(family, claim, tables, keys, gate_kappas or kappas)
    if isinstance(effects, str):
        v.why = effects
        return v
    v.statistic = effects[0].statistic
    v.numbers = _numbers(tables[claim.metric], keys, claim.over)
    if claim.kind == "target_explains":  # its effect is the target model's; its mechanism an EMA gap with the rule
        v.statistic = f"{family.target_metric.name}: {v.statistic}"
        table = tables[claim.metric]
        pre = _from_baseline(table, keys[0], claim.over, -sigma(table["metric"]), "the EMA with the rule departs")
        d, rec = decide_parts("gap_remains", [pre])  # a sign: its CI95 above 0, as the record says
        mechanism = {"name": "an EMA gap with the rule, for the target model to explain", "value": rec[0]["effect"],
                     "value_ci": rec[0]["effect_ci"], "threshold": 0.0, "present": d.verdict == R.REPRODUCED,
                     "what": f"{claim.metric} worse than its baseline with the rule by {T.num(rec[0]['effect'], True)} "
                             f"{T.interval(rec[0]['effect_ci'])} ({pre.statistic}); present when the interval lies "
                             f"above 0"}
    decision, parts = decide_parts(claim.kind, effects, claim.stated)
    # The record's effect is the lead part's, the one in the paper's direction; "at every κ run" leads with the
    # largest κ, the κ the row names.
    lead_i = len(parts) - 1 if claim.kind == "with_better" else 0
    lead = parts[lead_i]
    v.effect, v.effect_ci, v.mde, v.margin, v.spread = (lead["effect"], lead["effect_ci"], lead["mde"],
                                                        lead["margin"], lead["spread"])
    v.n, v.parts, v.rule = lead["n"], parts, decision.rule
    sd = R.summarize([x / lead["spread"] for x in lead["per_seed"]]).sd if lead["spread"] else math.nan
    # the seeds that would tell the paper's effect (as the rules take it, in spreads) from none
    paper_effect = (claim.stated / lead["spread"] if claim.stated > 0 and lead_i == 0 and lead["spread"]
                    else R.KINDS[claim.kind].parts[0].paper_effect)
    v.seeds_for_paper_effect = R.seeds_needed(paper_effect, sd) if math.isfinite(sd) else None
    v.verdict, v.p_reproduced, v.p_contradicted = decision.verdict, decision.p_reproduced, decision.p_contradicted
    v.mechanism = mechanism
    stopped = [f"seed {seed} of {e.label}" for e in effects for seed, x in zip(e.seeds, e.values, strict=False)
               if not math.isfinite(x)]
    if stopped:
        v.why = (f"a run stopped before its end (it diverged): {'; '.join(stopped)}; its part has no interval, "
                 f"so no rule decides on it")
    aside = _strays(family, claim, gate, [keys[0]] if claim.kind != "with_better"
                    else [("with", k) for k in gate_kappas or []])
    if aside:
        v.verdict_if_applicable, v.verdict, v.set_aside, v.why = v.verdict, R.SET_ASIDE, ASIDE_STRAYS, aside
    elif mechanism is not None and mechanism.get("present") is not True:  # absent, or its records unreadable
        v.verdict_if_applicable, v.verdict = v.verdict, R.NOT_TESTABLE
    return v


def _numbers(table: dict, keys: tuple, over: str) -> dict:
    """Each compared setting's mean gap, and the baselines' mean gap, as the figures and pages show them."""
    out = {}
    for name, key in zip(("A", "B"), keys, strict=True):
        g = gaps(table, key, over)
        if g:
            out[f"gap_{name}"] = sum(g.values()) / len(g)
    out["gap_baselines"] = scale(table, "gap", over)
    return out


def _strays(family: Family, claim: Claim, gate: dict | None, keys: list) -> str:
    """Where an EMA claim's setting has a target model that strays: its numbers, in words ("" if none)."""
    if not gate or not gate["blind"] or claim.kind not in GATED or not claim.gated:
        return ""
    # A metric blind to ρ is the target's own: a claim on it stands however far the target strays. The
    # pseudo-labeling student's WER is blind only before pseudo-labeling starts.
    if not family.metric(claim.metric).depends_on_ema or (claim.until and claim.until == family.target_blind_until):
        return ""
    bad = [(key, gate["rows"][key]) for key in keys if (gate["rows"].get(key) or {}).get("state") == "strays"]
    return "; ".join(f"{_label(*key)}: {r['metric']} worse by {T.num(r['effect'], True)} {T.interval(r['ci'])}"
                     f" against a spread of {T.num(r['spread'], True)}" for key, r in bad)
