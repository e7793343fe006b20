"""A sweep family's claims measured on its runs: gaps per setting and metric, then one verdict per claim.

Reads the run directories (`emarule.compare.load_runs`); torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace

from emarule.errors import UserError
from emarule.reproduce import verdict as V
from emarule.reproduce.claims import SHORTEST_ALSO, Claim, Family, Metric, for_spec

STATISTIC = {"run": "mean |Δ| over the run", "end": "|Δ| at the end"}


def groups(runs: list) -> tuple[list, dict]:
    """(baseline runs, {(κ, "with"|"without"|"linear"): runs}), each list sorted by seed."""
    key = lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.name)  # noqa: E731
    base = sorted((r for r in runs if r.is_baseline), key=key)
    out: dict = {}
    for r in runs:
        if not r.is_baseline:
            out.setdefault((r.kappa, r.rule_label), []).append(r)
    return base, {k: sorted(v, key=key) for k, v in sorted(out.items())}


def metric_table(metric: Metric, base: list, settings: dict, until: float | None = None,
                 since: float | None = None) -> dict:
    """Everything measured for one metric: the baseline curve and spread, and each setting's gaps
    (on the epochs in [since, until] only, when given)."""

    def curve(r):
        xs, ys = V.run_curve(r, metric.name, metric.smooth_epochs)
        keep = [i for i, x in enumerate(xs) if (until is None or x <= until + 1e-9)
                and (since is None or x >= since - 1e-9)]
        return [xs[i] for i in keep], [ys[i] for i in keep]

    base_curves = [curve(r) for r in base]
    bgrid, bmean, bstd = V.baseline_curve(base_curves)
    if not bgrid:
        raise UserError(f"the baseline runs logged no {metric.name!r} values in common; "
                        f"check {base[0].path if base else 'the run directories'}/metrics.jsonl")
    finals = [V.final(c) for c in base_curves]
    rows = {("baseline", 1.0): {"gaps": V.spread(base_curves), "finals": finals, "curves": base_curves}}
    for (k, rule), rs in settings.items():
        curves = [curve(r) for r in rs]
        rows[(rule, k)] = {"gaps": V.gaps(curves, (bgrid, bmean)), "finals": [V.final(c) for c in curves],
                           "curves": curves}
    return {"metric": metric, "baseline": (bgrid, bmean, bstd), "rows": rows}


def measure(family: Family, runs: list) -> dict:
    """Every claim of `family` judged on `runs`, with the metric names and labels of the spec the baseline ran
    (`claims.for_spec`): the tables' `metric` entries are the ones the figure draws."""
    base, settings = groups(runs)
    if not base:
        raise UserError("no κ=1 baseline among the runs; the reproduction needs one (it runs first for every seed)")
    family = for_spec(family, base[0].hparams.get("spec") or {})
    logged = set.intersection(*(r.metrics() for r in base))
    # A further metric (a control EMA) is judged only where the preset logs it.
    metrics = [m for m in family.metrics if m in (family.ema_metric, family.target_metric) or m.name in logged]
    since = transition_epoch([r for rs in settings.values() for r in rs])
    tables = {m.name: metric_table(m, base, settings, since=since) for m in metrics}
    kappas = sorted({k for k, _ in settings})
    claims = []
    for c in expand(family.claims, kappas):
        if c.metric not in tables:
            claims.append(not_logged(c))
            continue
        if c.until:  # the claim's part of the run only
            until = epochs_of_base_steps(base[0], c.until)
            window = metric_table(family.metric(c.metric), base, settings, until, since)
            claims.append(judge(family, c, {**tables, c.metric: window}, base, kappas)
                          | {"statistic": f"{STATISTIC[c.over]} up to epoch {until:.3g} ({c.until})"})
        else:
            claims.append(judge(family, c, tables, base, kappas))
    if since:
        for c in claims:
            if c["statistic"].startswith(STATISTIC["run"]):
                c["statistic"] = c["statistic"].replace(STATISTIC["run"], f"{STATISTIC['run']} from epoch {since:g}")
    out = {"tables": tables, "claims": claims, "kappas": kappas, "baseline_seeds": len(base),
           "goal": goal(family, tables, kappas), "since_epoch": since}
    if since:
        out["goal"]["statistic"] = f"{STATISTIC['run']} from epoch {since:g}"
    return out


def transition_epoch(runs: list) -> float | None:
    """Where Progressive Scaling first takes κ away from 1, when every scaled run starts at κ=1 (a
    step or smooth schedule): before it each run is its seed's baseline, bit for bit, so only the part
    after it can tell the settings apart. None for constant κ."""
    starts = []
    for r in runs:
        layout = r.hparams.get("layout") or []
        first = next((st.get("start_epoch") for st in layout if not math.isclose(st.get("kappa", 1.0), 1.0)), 0.0)
        starts.append(float(first or 0.0))
    return min(starts) if starts and min(starts) > 0 else None


def goal(family: Family, tables: dict, kappas: list) -> dict:
    """The issue's goal on the EMA metric over the run at `family.goal_kappa`."""
    k, table = family.goal_kappa, tables[family.ema_metric.name]
    out = {"kappa": k, "metric": family.ema_metric.name, "statistic": STATISTIC["run"]}
    if k not in kappas:
        return out | {"met": None, "why": f"not measured: κ={k:g} was not in --kappas"}
    gw, gwo, s = _stat(table, "with", k, "run"), _stat(table, "without", k, "run"), _spread(table, "run")
    out |= {"gap_with_rule": gw, "gap_without_rule": gwo, "baseline_spread": s}
    if None in (gw, gwo):
        return out | {"met": None, "why": f"not measured: a run at κ={k:g} never logged {family.ema_metric.name}"}
    if s is None:
        return out | {"met": None, "why": "the baseline spread is undefined (fewer than 2 baseline seeds)"}
    a, b = bool(gwo >= V.FACTOR * gw), bool(gw <= s)
    out |= {"met": a and b, "without_at_least_2x_with": a, "with_within_spread": b}
    if not (a and b):
        out["diagnosis"] = diagnose(family, tables, k, "run")
    return out


def expand(claims, kappas: list) -> list[Claim]:
    """An "up to κ" claim becomes one claim per κ ≠ 1 of the sweep up to its κ."""
    out = []
    for c in claims:
        ks = [k for k in kappas if k != 1 and k <= c.kappa] if c.up_to else []
        out.extend([replace(c, kappa=k) for k in ks] or [c])
    return out


def epochs_of_base_steps(run, key: str) -> float:
    """A spec value counted in base (κ=1) steps, as epochs: steps × base batch / one epoch's measure."""
    from emarule.rundir import HPARAMS
    from emarule.spec import get

    h = run.hparams
    steps = get(h.get("spec") or {}, key)
    base = ((h.get("hyperparameters") or {}).get("batch_size") or {}).get("base")
    measure = h.get("epoch_measure") or h.get("dataset_size")
    if steps is None or not base or not measure:
        raise UserError(f"{run.path / HPARAMS}: needs the spec's {key}, the base batch and the epoch's measure")
    return float(steps) * float(base) / float(measure)


def not_logged(c: Claim) -> dict:
    why = ("the spec has no ema.also, so no further EMA is evaluated" if SHORTEST_ALSO in c.metric
           else f"this preset does not log {c.metric}")
    return {"claim": c.text, "paper": c.paper, "where": c.where, "kind": c.kind, "metric": c.metric,
            "kappa": c.kappa, "statistic": STATISTIC[c.over], "gap_with_rule": None, "gap_without_rule": None,
            "baseline_spread": None, "note": c.note, "verdict": "inconclusive",
            "why": f"not measured: {why}"}


def _stat(table: dict, rule: str, kappa: float, over: str) -> float | None:
    row = table["rows"].get((rule, kappa))
    return None if row is None or row["gaps"] is None else row["gaps"][over]


def _spread(table: dict, over: str) -> float | None:
    g = table["rows"][("baseline", 1.0)]["gaps"]
    return None if g is None else g[over]


def _mean_final(table: dict, rule: str, kappa: float) -> float | None:
    row = table["rows"].get((rule, kappa))
    vals = [v for v in (row or {}).get("finals", []) if v is not None]
    return sum(vals) / len(vals) if vals else None


def judge(family: Family, claim: Claim, tables: dict, base: list, kappas: list) -> dict:
    table = tables[claim.metric]
    metric: Metric = table["metric"]
    over = claim.over
    out = {"claim": claim.text, "paper": claim.paper, "where": claim.where, "kind": claim.kind,
           "metric": claim.metric, "kappa": claim.kappa, "statistic": STATISTIC[over],
           "gap_with_rule": None, "gap_without_rule": None, "baseline_spread": _spread(table, over),
           "note": claim.note}
    k = claim.kappa
    if claim.kind == "optimizer_strays":
        if k not in kappas:
            out.update(verdict="inconclusive", why=f"not measured: κ={k:g} was not in --kappas")
            return out
        gw = _stat(table, "with", k, over)
        out.update(gap_with_rule=gw, gap_without_rule=_stat(table, "without", k, over))
        v, why = V.decide_optimizer(gw, out["baseline_spread"])
        out.update(verdict=v, why=why)
        return out
    if claim.kind in ("rule_needed", "rule_closer", "same_either_way", "target_explains"):
        if k not in kappas:
            out.update(verdict="inconclusive", why=f"not measured: κ={k:g} was not in --kappas")
            return out
        gw, gwo, s = _stat(table, "with", k, over), _stat(table, "without", k, over), out["baseline_spread"]
        out.update(gap_with_rule=gw, gap_without_rule=gwo)
        missing = {rule: (table["rows"].get((rule, k)) or {}).get("gaps", {}).get("missing", 0)
                   for rule in ("with", "without")}
        if any(missing.values()):
            out.update(verdict="inconclusive", why=f"not measured: {missing['with']} run(s) with the rule and "
                       f"{missing['without']} without at κ={k:g} never logged {claim.metric}")
            return out
        if any((table["rows"].get((rule, k)) or {}).get("gaps", {}).get("no_overlap") for rule in ("with", "without")):
            out.update(verdict="inconclusive", why=f"not measured: a run at κ={k:g} logged {claim.metric} only after "
                       f"the baseline's last evaluation of it")
            return out
        if claim.kind == "target_explains":
            target = tables[family.target_metric.name]
            gt, st = _stat(target, "with", k, over), _spread(target, over)
            out["target"] = {"metric": family.target_metric.name, "gap_with_rule": gt,
                             "gap_without_rule": _stat(target, "without", k, over), "baseline_spread": st}
            v, why = V.decide_target(gw, s, gt, st)
        else:
            v, why = V.decide(claim.kind, gw, gwo, s)
            if claim.kind == "rule_needed" and None not in (gw, gwo, s):
                out["meets_issue_goal"] = bool(gwo >= V.FACTOR * gw and gw <= s)
        out.update(verdict=v, why=why)
        if v != "reproduced":
            out["diagnosis"] = diagnose(family, tables, k, over, claim.metric)
    elif claim.kind == "with_better":
        sign = 1.0 if metric.higher_is_better else -1.0
        diffs = {}
        for kk in kappas:
            a, b = _mean_final(table, "with", kk), _mean_final(table, "without", kk)
            diffs[kk] = None if a is None or b is None else sign * (a - b)
        s = _spread(table, "end")
        if kappas:
            top = kappas[-1]
            out.update(kappa=top, gap_with_rule=_stat(table, "with", top, "end"),
                       gap_without_rule=_stat(table, "without", top, "end"), baseline_spread=s)
        out["with_minus_without"] = {f"{kk:g}": d for kk, d in diffs.items()}
        v, why = V.decide_with_better(diffs, s)
        out.update(verdict=v, why=why)
    elif claim.kind == "ema_above_target":
        ema, target = tables[family.ema_metric.name], tables[family.target_metric.name]
        sign = 1.0 if family.ema_metric.higher_is_better else -1.0
        e = ema["rows"][("baseline", 1.0)]["finals"]
        t = target["rows"][("baseline", 1.0)]["finals"]
        diffs = [sign * (a - b) for a, b in zip(e, t, strict=True) if a is not None and b is not None]
        out["ema_minus_target"] = diffs
        v, why = V.decide_ema_above(diffs)
        out.update(verdict=v, why=why)
    else:
        raise ValueError(f"{family.name}: unknown claim kind {claim.kind!r}")
    return out


def diagnose(family: Family, tables: dict, kappa: float, over: str, metric: str | None = None) -> str:
    """Why a claim on `metric` (the EMA metric by default) fell short, from the numbers: noise, the
    optimizer rule, or the EMA itself."""
    metric = metric or family.ema_metric.name
    table = tables[metric]
    gw, gwo, s = _stat(table, "with", kappa, over), _stat(table, "without", kappa, over), _spread(table, over)
    parts = []
    if s is not None and gw is not None and gwo is not None and gwo <= V.FACTOR * s:
        parts.append(f"noise: even without the rule the {metric} gap ({_f(gwo)}) is within 2× the baseline seeds' "
                     f"spread ({_f(s)}), so this preset cannot separate the settings")
    t = family.target_metric
    tt = tables[t.name]
    tg, ts = _stat(tt, "with", kappa, over), _spread(tt, over)
    if t.name == metric:
        if t.depends_on_ema:
            parts.append(f"{t.name}, the student's, depends on the EMA too, so it cannot separate an optimizer-rule "
                         f"failure from an EMA one")
    elif tg is not None and ts is not None:
        # The thresholds of `verdict.decide_target` / `decide_optimizer`: > 2× spread strays, ≤ 1× tracks.
        if t.depends_on_ema:
            parts.append(f"{t.name} depends on the EMA too (gap with the rule {_f(tg)}, spread {_f(ts)}), so it "
                         f"cannot separate an optimizer-rule failure from an EMA one")
        elif tg > V.FACTOR * ts:
            parts.append(f"the optimizer rule: the target model's {t.name} strays too (gap with the rule {_f(tg)} > "
                         f"2× its spread {_f(ts)})")
        elif tg <= ts:
            parts.append(f"the target model's {t.name} tracks (gap with the rule {_f(tg)} ≤ its spread {_f(ts)}): "
                         f"the optimizer rule holds, so any remaining gap is the EMA's")
        else:
            parts.append(f"the target model's {t.name} gap with the rule ({_f(tg)}) lies between 1× and 2× its "
                         f"spread ({_f(ts)}), within the noise band: unclear whether the optimizer rule breaks")
    return "; ".join(parts) or "not enough runs to say"


def _f(v: float | None) -> str:
    return "—" if v is None else ("∞" if math.isinf(v) else f"{v:.3g}")
