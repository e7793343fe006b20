"""A sweep family's claims measured on its runs: gaps per setting and metric, then one verdict per claim.

Reads the run directories (`emarule.analysis.compare.load_runs`); torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace

from emarule.errors import UserError
from emarule.analysis.reproduce import verdict as V
from emarule.analysis.reproduce.claims import SHORTEST_ALSO, STANDARD, Claim, Family, Metric, for_spec

STATISTIC = {"run": "mean |Δ| over the run", "end": "|Δ| at the end"}


def groups(runs: list, arms: dict | None = None) -> tuple[list, dict]:
    """(baseline runs, {(κ, "with"|"without"|"linear"|ARM): runs}), each list sorted by seed. `arms` maps a
    run directory to the name of the arm it belongs to (`emarule.analysis.sweep.execute`'s record of it); a run not
    in it is an arm's when its name says so (`compare.arm_of_name`)."""
    arms = {str(k): v for k, v in (arms or {}).items()}
    arms |= {str(r.path): r.arm for r in runs if r.arm and str(r.path) not in arms}  # from the run's name
    key = lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.name)  # noqa: E731
    base = sorted((r for r in runs if r.is_baseline and str(r.path) not in arms), key=key)
    out: dict = {}
    for r in runs:
        if str(r.path) in arms:
            out.setdefault((r.kappa, arms[str(r.path)]), []).append(r)
        elif not r.is_baseline:
            out.setdefault((r.kappa, r.rule_label), []).append(r)
    return base, {k: sorted(v, key=key) for k, v in sorted(out.items())}


def metric_table(metric: Metric, base: list, settings: dict, until: float | None = None,
                 since: float | None = None) -> dict:
    """Everything measured for one metric: the baseline curve and spread, and each setting's gaps
    (on the epochs in [since, until] only, when given)."""

    def curve(r):
        xs, ys = final_reading(r, metric) if metric.file else V.run_curve(r, metric.name, metric.smooth_epochs)
        keep = [i for i, x in enumerate(xs) if (until is None or x <= until + 1e-9)
                and (since is None or x >= since - 1e-9)]
        return [xs[i] for i in keep], [ys[i] for i in keep]

    base_curves = [curve(r) for r in base]
    bgrid, bmean, bstd = V.baseline_curve(base_curves)
    if not bgrid:
        raise UserError(f"the baseline runs logged no {metric.name!r} values in common; "
                        f"check {base[0].path if base else 'the run directories'}/metrics.jsonl")
    base_stopped = [r.stopped_early() for r in base]
    finals = finals_of(base_curves, base_stopped)
    by_seed = {r.seed: c for r, c in zip(base, base_curves, strict=True)}
    final_of = {r.seed: f for r, f in zip(base, finals, strict=True)}
    rows = {("baseline", 1.0): {"gaps": V.pair_spread(base_curves, base_stopped), "stopped": base_stopped,
                                "unpaired": V.spread(base_curves), "finals": finals, "curves": base_curves,
                                "seeds": [r.seed for r in base], "base_finals": finals}}
    for (k, rule), rs in settings.items():
        # Paired: each run against its own seed's baseline; a run whose seed has no baseline is left out.
        rs = [r for r in rs if r.seed in by_seed]
        curves, stopped = [curve(r) for r in rs], [r.stopped_early() for r in rs]
        rows[(rule, k)] = {"gaps": V.paired_gaps(curves, [by_seed[r.seed] for r in rs], stopped), "stopped": stopped,
                           "unpaired": V.gaps(curves, (bgrid, bmean), stopped),
                           "finals": finals_of(curves, stopped),
                           "curves": curves, "seeds": [r.seed for r in rs],
                           "base_finals": [final_of[r.seed] for r in rs]}
    return {"metric": metric, "baseline": (bgrid, bmean, bstd), "rows": rows}


def final_reading(run, metric: Metric) -> tuple[list, list]:
    """A metric measured once on the finished run (`Metric.file`) as a curve of one point, at the run's
    planned end (its layout's last epoch; its last logged one where it records none), so that every run of
    a comparison puts it at the same epoch; a run that stopped before it is `stopped_early`'s to mark. No
    point where the file or its value is missing."""
    from emarule.engine.rundir import read_json

    got = read_json(run.path / metric.file)
    v = V.finite_number(got.get(metric.name)) if isinstance(got, dict) else None
    ends = [V.finite_number(st.get("end_epoch")) for st in run.hparams.get("layout") or [] if isinstance(st, dict)]
    end = max((e for e in ends if e is not None), default=None)
    if end is None:
        end = max((x for x in map(run.epoch_of, run.rows) if x is not None), default=None)
    return ([end], [v]) if v is not None and end is not None else ([], [])


def finals_of(curves: list, stopped: list) -> list:
    """Each curve's final value; none for a run that stopped before its end."""
    return [None if st else V.final(c) for c, st in zip(curves, stopped, strict=True)]


def stopped_early(run) -> bool | None:
    """Whether the run's log ends before its planned end; None where the run does not record its end
    (`compare.Run.stopped_early`, which memoises it)."""
    return run.stopped_early()


def measure(family: Family, runs: list, arms: dict | None = None) -> dict:
    """Every claim of `family` judged on `runs`, with the metric names and labels of the spec the baseline ran
    (`claims.for_spec`): the tables' `metric` entries are the ones the figure draws. `arms`: run directory →
    arm name, for the runs of the family's arms."""
    base, settings = groups(runs, arms)
    if not base:
        raise UserError("no κ=1 baseline among the runs; the reproduction needs one (it runs first for every seed)")
    family = for_spec(family, base[0].hparams.get("spec") or {})
    logged = set.intersection(*(r.metrics() for r in base))
    logged |= {m.name for m in family.metrics if m.file and all(final_reading(r, m)[0] for r in base)}
    # A further metric (a control EMA, a probe of the final teachers) is judged only where the runs have it.
    metrics = [m for m in family.metrics if m in (family.ema_metric, family.target_metric) or m.name in logged]
    # Each comparison starts where its own settings first leave κ=1: which other settings (arms) were run
    # must not change a claim's statistic, so a --headline check reads its claim as the full reproduction does.
    since = transition_epoch([r for (_, rule), rs in settings.items() if rule in (*STANDARD, "linear") for r in rs])
    cache: dict = {}

    def tables_from(x: float | None) -> dict:
        if x not in cache:
            cache[x] = {m.name: metric_table(m, base, settings, since=x) for m in metrics}
        return cache[x]

    tables = tables_from(since)
    kappas = sorted({k for k, rule in settings if rule in STANDARD or rule == "linear"})
    gate = track_table(family, tables, base, settings, since)
    claims = []
    for c in expand(family.claims, kappas):
        if c.metric not in tables:
            claims.append(not_logged(c, family))
            continue
        x = claim_since(family, c, settings, since)
        if c.until:  # the claim's part of the run only
            until = epochs_of_base_steps(base[0], c.until)
            window = metric_table(family.metric(c.metric), base, settings, until, x)
            claims.append(judge(family, c, {**tables_from(x), c.metric: window}, base, kappas, gate)
                          | {"statistic": f"{STATISTIC[c.over]} up to epoch {until:.3g} ({c.until})"})
        else:
            claims.append(judge(family, c, tables_from(x), base, kappas, gate))
        if x and claims[-1]["statistic"].startswith(STATISTIC["run"]):
            claims[-1]["statistic"] = claims[-1]["statistic"].replace(STATISTIC["run"],
                                                                      f"{STATISTIC['run']} from epoch {x:g}")
    out = {"tables": tables, "claims": claims, "kappas": kappas, "baseline_seeds": len(base),
           "seeds": [r.seed for r in base], "goal": goal(family, tables, kappas, gate), "since_epoch": since,
           "optimizer_check": optimizer_check(family, gate, kappas)}
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


def claim_since(family: Family, claim: Claim, settings: dict, standard: float | None) -> float | None:
    """Where the settings a claim compares first leave κ=1 (`transition_epoch` of their runs): a
    progressive setting against another progressive one is compared from there, against a constant one
    from the start. The standard settings' transition for a claim at every κ."""
    if claim.kappa is None and claim.settings == STANDARD:
        return standard
    names = claim.settings[:1] if claim.kind in ("optimizer_strays", "matches_or_better") else claim.settings
    keys = [setting_key(family, n, claim.kappa) for n in names]  # (setting, κ); `settings` has (κ, setting)
    runs = [r for name, k in keys for r in settings.get((k, name), [])]
    return transition_epoch(runs) if runs else standard


def goal(family: Family, tables: dict, kappas: list, gate: dict | None = None) -> dict:
    """The separation goal on the EMA metric over the run at `family.goal_kappa`."""
    k, table = family.goal_kappa, tables[family.ema_metric.name]
    out = {"kappa": k, "metric": family.ema_metric.name, "statistic": STATISTIC["run"]}
    if k not in kappas:
        return out | {"met": None, "why": f"not measured: κ={k:g} was not in --kappas"}
    gw, gwo, s = _stat(table, "with", k, "run"), _stat(table, "without", k, "run"), _spread(table, "run")
    out |= {"gap_with_rule": gw, "gap_without_rule": gwo, "baseline_spread": s}
    if None in (gw, gwo):
        return out | {"met": None, "why": f"not measured: a run at κ={k:g} never logged {family.ema_metric.name}"}
    if s is None:
        return out | {"met": None, "why": V.NO_SPREAD}
    if V.unbounded(s):
        return out | {"met": None, "why": _stopped_why(stopped_baselines(table))}
    a, b = bool(gwo >= V.FACTOR * gw), bool(gw <= s)
    out |= {"met": a and b, "without_at_least_2x_with": a, "with_within_spread": b}
    if not (a and b):
        out["diagnosis"] = diagnose(family, tables, k, "run", gate=gate)
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
    from emarule.engine.rundir import HPARAMS
    from emarule.config.load import get

    h = run.hparams
    steps = get(h.get("spec") or {}, key)
    base = ((h.get("hyperparameters") or {}).get("batch_size") or {}).get("base")
    measure = h.get("epoch_measure") or h.get("dataset_size")
    if steps is None or not base or not measure:
        raise UserError(f"{run.path / HPARAMS}: needs the spec's {key}, the base batch and the epoch's measure")
    return float(steps) * float(base) / float(measure)


def not_logged(c: Claim, family: Family) -> dict:
    file = next((m.file for m in family.metrics if m.name == c.metric), "")
    why = ("the spec has no ema.also, so no further EMA is evaluated" if SHORTEST_ALSO in c.metric
           else f"a baseline run has no {file} (its final teacher was not probed)" if file
           else f"this preset does not log {c.metric}")
    out = {"claim": c.text, "short": c.short, "paper": c.paper, "where": c.where, "kind": c.kind, "metric": c.metric,
           "kappa": c.kappa, "statistic": STATISTIC[c.over], "gap_with_rule": None, "gap_without_rule": None,
           "baseline_spread": None, "note": c.note}
    return decided(out, "inconclusive", f"not measured: {why}")


def _stat(table: dict, rule: str, kappa: float | None, over: str) -> float | None:
    row = table["rows"].get((rule, kappa))
    return None if row is None or row["gaps"] is None else row["gaps"][over]


def _spread(table: dict, over: str) -> float | None:
    g = table["rows"][("baseline", 1.0)]["gaps"]
    return None if g is None else g[over]


def stopped_baselines(table: dict) -> list:
    """The seeds whose κ=1 baseline stopped before its end, where that makes the pair spread unbounded."""
    row = table["rows"][("baseline", 1.0)]
    if not V.unbounded(*((row["gaps"] or {}).get(x) for x in ("run", "end"))):
        return []
    named = [s for s, st in zip(row["seeds"], row["stopped"], strict=True) if st]
    return named or ["?"]  # stopped by its curve's end alone (no planned end recorded)


def _stopped_why(seeds: list) -> str:
    which = "a seed" if seeds == ["?"] else f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    return (f"the κ=1 baseline of {which} stopped before its end (it diverged), so the baseline spread is unbounded "
            f"and judging the other seeds would hide the run that diverged")


def _mean_final(table: dict, rule: str, kappa: float) -> float | None:
    row = table["rows"].get((rule, kappa))
    vals = [v for v in (row or {}).get("finals", []) if v is not None]
    return sum(vals) / len(vals) if vals else None


def _row(table: dict, setting: str, kappa: float | None) -> dict | None:
    return table["rows"].get((setting, kappa))


def _ci_of(table: dict, setting: str, kappa: float, over: str):
    row = _row(table, setting, kappa)
    return None if row is None or row["gaps"] is None else row["gaps"].get(f"ci_{over}")


def paired_difference(table: dict, a: tuple, b: tuple, over: str) -> dict:
    """Per seed gap(B) − gap(A), each against that seed's own baseline, on the seeds both settings ran;
    its mean and bootstrap interval. `a`, `b`: (setting, κ) row keys."""
    ra, rb = table["rows"].get(a), table["rows"].get(b)
    if ra is None or rb is None or not ra["gaps"] or not rb["gaps"] or ra["gaps"][over] is None \
            or rb["gaps"][over] is None:
        return {"per_seed": [], "mean": None, "ci": None, "seeds": []}
    ga = dict(zip(ra["seeds"], ra["gaps"][f"per_seed_{over}"], strict=True))
    gb = dict(zip(rb["seeds"], rb["gaps"][f"per_seed_{over}"], strict=True))
    seeds = [s for s in ra["seeds"] if s in gb]
    d = V.differences([ga[s] for s in seeds], [gb[s] for s in seeds])
    mean = sum(d) / len(d) if d else None
    return {"per_seed": d, "mean": None if mean is not None and math.isnan(mean) else mean,  # +∞ and −∞ seeds
            "ci": V.bootstrap_ci(d), "seeds": seeds}


def final_differences(table: dict, a: tuple, b: tuple | None, sign: float) -> dict:
    """Per seed sign × (final(A) − final(B)), B the seed's own baseline when `b` is None; mean and interval.
    `stopped`: the seeds whose run of A or B stopped before its end, which have no final value: a claim on
    final values is then inconclusive (a seed left out would hide a diverged run)."""
    ra = table["rows"].get(a)
    if ra is None:
        return {"per_seed": [], "mean": None, "ci": None, "stopped": []}
    rb = table["rows"].get(b if b is not None else ("baseline", 1.0))
    stopped = sorted({s for row in (ra, rb) if row
                      for s, x in zip(row["seeds"], row.get("stopped") or [None] * len(row["seeds"]), strict=True)
                      if x} & set(ra["seeds"]))
    fa = dict(zip(ra["seeds"], ra["finals"], strict=True))
    if b is None:
        fb = dict(zip(ra["seeds"], ra["base_finals"], strict=True))
    else:
        fb = dict(zip(rb["seeds"], rb["finals"], strict=True)) if rb else {}
    d = [sign * (fa[s] - fb[s]) for s in ra["seeds"] if s in fb and fa[s] is not None and fb[s] is not None]
    return {"per_seed": d, "mean": sum(d) / len(d) if d else None, "ci": V.bootstrap_ci(d), "stopped": stopped}


def stopped_verdict(out: dict, seeds: list) -> None:
    """A claim on final values with a seed whose run stopped before its end is inconclusive: that seed has
    no final value, and judging the others would hide a run that diverged."""
    if seeds:
        tail = (f"; but the run of seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s) for s in seeds)} "
                f"stopped before its end, so it has no final value")
        decided(out, "inconclusive", V.Why(out["numbers"], out["decision"] + tail))


def decided(out: dict, verdict: str, why: str) -> dict:
    """`out` with its verdict and reason, and the reason's numbers and decision apart for the README's table
    (`verdict.Why`); a plain string is a reason for want of data, both at once."""
    w = why if isinstance(why, V.Why) else V.Why.unmeasured(why)
    out.update(verdict=verdict, why=str(w), numbers=w.numbers, decision=w.decision)
    return out


def setting_key(family: Family, name: str, kappa: float | None) -> tuple:
    """A claim's setting name → its table row key: the standard ones at the claim's κ, an arm at its own."""
    for a in family.arms:
        if a.name == name:
            return name, float(a.kappa)
    return name, kappa


def _label(name: str, kappa: float | None) -> str:
    """`with the rule at κ=4`, `arm bn-scale at κ=2`."""
    names = {"with": "with the rule", "without": "without the rule", "linear": "the linear rule"}
    what = names.get(name, f"arm {name}")
    return f"{what} at κ={kappa:g}" if kappa is not None else what


def judge(family: Family, claim: Claim, tables: dict, base: list, kappas: list, gate: dict | None = None) -> dict:
    table = tables[claim.metric]
    metric: Metric = table["metric"]
    over = claim.over
    ka, kb = (setting_key(family, n, claim.kappa) for n in claim.settings)
    out = {"claim": claim.text, "short": claim.short, "paper": claim.paper, "where": claim.where, "kind": claim.kind,
           "metric": claim.metric, "kappa": claim.kappa, "statistic": STATISTIC[over],
           "gap_with_rule": None, "gap_without_rule": None, "baseline_spread": _spread(table, over),
           "note": claim.note}
    if claim.settings != STANDARD:
        out["settings"] = {"A": _label(*ka), "B": _label(*kb)}
        if ka[0] not in STANDARD:  # judged at the arm's κ (a preset may run it at another than the paper's)
            out["kappa"] = ka[1]
    k = claim.kappa
    pairwise = ("rule_needed", "rule_closer", "same_either_way", "target_explains", "arm_closer")
    if claim.kind in (*pairwise, "optimizer_strays", "matches_or_better"):
        need = [ka] if claim.kind in ("optimizer_strays", "matches_or_better") else [ka, kb]
        absent = [key for key in need if key not in table["rows"]]
        if absent:
            what = " and ".join(_label(*key) for key in absent)
            decided(out, "inconclusive", f"not measured: {what} {'were' if len(absent) > 1 else 'was'} not "
                                         f"run (see --kappas)")
            return out
    if claim.kind == "optimizer_strays":
        gw = _stat(table, *ka, over)
        out.update(gap_with_rule=gw, gap_without_rule=_stat(table, *kb, over), ci_with=_ci_of(table, *ka, over))
        v, why = V.decide_optimizer(gw, out["baseline_spread"], out["ci_with"])
        decided(out, v, why)
        return out
    if claim.kind in pairwise:
        gw, gwo, s = _stat(table, *ka, over), _stat(table, *kb, over), out["baseline_spread"]
        out.update(gap_with_rule=gw, gap_without_rule=gwo, ci_with=_ci_of(table, *ka, over),
                   ci_without=_ci_of(table, *kb, over))
        missing = {key: ((_row(table, *key) or {}).get("gaps") or {}).get("missing", 0) for key in (ka, kb)}
        if any(missing.values()):
            decided(out, "inconclusive", f"not measured: {missing[ka]} run(s) of {_label(*ka)} and "
                                         f"{missing[kb]} of {_label(*kb)} never logged {claim.metric}")
            return out
        if any(((_row(table, *key) or {}).get("gaps") or {}).get("no_overlap") for key in (ka, kb)):
            decided(out, "inconclusive", f"not measured: a run at κ={k:g} logged {claim.metric} only after "
                                         f"the baseline's last evaluation of it")
            return out
        diff = paired_difference(table, ka, kb, over)
        out["paired_difference"] = {"mean": diff["mean"], "ci": diff["ci"], "per_seed": diff["per_seed"]}
        if claim.kind == "target_explains":
            target = tables[family.target_metric.name]
            gt, st = _stat(target, *ka, over), _spread(target, over)
            ct = _ci_of(target, *ka, over)
            out["target"] = {"metric": family.target_metric.name, "gap_with_rule": gt, "ci_with": ct,
                             "gap_without_rule": _stat(target, *kb, over), "baseline_spread": st}
            v, why = V.decide_target(gw, s, gt, st, ct)
            if V.nothing_to_explain(gw, s, gt, st):
                out["set_aside"] = ASIDE_NO_GAP
        elif claim.kind == "arm_closer":
            v, why = V.decide_arm_closer(gw, gwo, diff["ci"])
        else:
            v, why = V.decide(claim.kind, gw, gwo, s, diff["ci"])
            if claim.kind == "rule_needed" and None not in (gw, gwo, s):
                out["meets_issue_goal"] = bool(gwo >= V.FACTOR * gw and gw <= s)
        decided(out, v, why)
        if v != "reproduced" and claim.settings == STANDARD:
            out["diagnosis"] = diagnose(family, tables, k, over, claim.metric, gate, noise=v == "inconclusive")
    elif claim.kind == "matches_or_better":
        sign = 1.0 if metric.higher_is_better else -1.0
        d = final_differences(table, ka, None, sign)
        out.update(gap_with_rule=_stat(table, *ka, "end"), ci_with=_ci_of(table, *ka, "end"),
                   baseline_spread=_spread(table, "end"), a_minus_baseline=d)
        v, why = V.decide_matches_or_better(d["mean"], d["ci"], out["baseline_spread"])
        decided(out, v, why)
        stopped_verdict(out, d["stopped"])
    elif claim.kind == "with_better":
        sign = 1.0 if metric.higher_is_better else -1.0
        diffs, cis, stopped = {}, {}, set()
        for kk in kappas:
            d = final_differences(table, ("with", kk), ("without", kk), sign)
            diffs[kk], cis[kk] = d["mean"], d["ci"]
            stopped |= set(d["stopped"])
        s = _spread(table, "end")
        if kappas:
            top = kappas[-1]
            out.update(kappa=top, gap_with_rule=_stat(table, "with", top, "end"),
                       gap_without_rule=_stat(table, "without", top, "end"), baseline_spread=s)
        out["with_minus_without"] = {f"{kk:g}": d for kk, d in diffs.items()}
        out["with_minus_without_ci"] = {f"{kk:g}": c for kk, c in cis.items()}
        v, why = V.decide_with_better(diffs, s, cis)
        decided(out, v, why)
        stopped_verdict(out, sorted(stopped))
    elif claim.kind == "ema_above_target":
        ema, target = tables[family.ema_metric.name], tables[family.target_metric.name]
        sign = 1.0 if family.ema_metric.higher_is_better else -1.0
        e = ema["rows"][("baseline", 1.0)]["finals"]
        t = target["rows"][("baseline", 1.0)]["finals"]
        diffs = [sign * (a - b) for a, b in zip(e, t, strict=True) if a is not None and b is not None]
        out["ema_minus_target"] = diffs
        out["ema_minus_target_ci"] = V.bootstrap_ci(diffs)
        v, why = V.decide_ema_above(diffs)
        decided(out, v, why)
    else:
        raise ValueError(f"{family.name}: unknown claim kind {claim.kind!r}")
    names = [claim.metric] + ([family.target_metric.name] if claim.kind in ("target_explains", "ema_above_target")
                              else [])
    broken = sorted({x for n in names for x in stopped_baselines(tables[n])}, key=str)
    if broken:  # measured as usual, so the report shows the numbers, but not judged (verdict.STOPPED_BASELINE)
        out.pop("diagnosis", None), out.pop("set_aside", None)
        return decided(out, "inconclusive", V.Why(out.get("numbers") or "", _stopped_why(broken)))
    return gated(family, claim, out, gate, [ka] if claim.kind != "with_better" else
                 [("with", kk) for kk in kappas])


# The kinds whose claim is about the EMA at one setting: meaningful only where the target model tracks.
GATED = ("rule_needed", "rule_closer", "same_either_way", "arm_closer", "matches_or_better", "with_better")

# Why a row is set aside: the claim does not apply at that κ, so the tally leaves the row out and decides the
# claim on its other κ, if any (issue 18 §2: an EMA claim is meaningful only where the optimizer rule holds;
# a claim that explains an EMA gap, only where there is one).
ASIDE_STRAYS = "the target model strays"
ASIDE_NO_GAP = "no EMA gap to explain"


def gated(family: Family, claim: Claim, out: dict, gate: dict | None, keys: list) -> dict:
    """A claim about the EMA where the target model strays (`track_table`) is inconclusive and set aside,
    with the measured reason: the optimizer rule already fails there, so the EMA is judged on a broken run.
    The verdict the rules gave, inconclusive or not, is kept as `verdict_if_target_tracked`."""
    if not gate or not gate["blind"] or claim.kind not in GATED:
        return out
    # A metric blind to ρ is the target's own: a claim on it stands however far the target strays. The
    # pseudo-labeling student's WER is the gate's metric too, but only its pre-training part is blind: a
    # claim on the rest is about the EMA's labels, judged on a student that had already strayed.
    if not family.metric(claim.metric).depends_on_ema or (claim.until and claim.until == family.target_blind_until):
        return out
    bad = [(key, gate["rows"].get(key)) for key in keys if (gate["rows"].get(key) or {}).get("state") == "strays"]
    if not bad:
        return out
    why = "; ".join(f"{_label(*key)}: {r['metric']} gap {_f(r['gap'])} (95 % CI {_fci(r['ci'])}) against a spread of "
                    f"{_f(r['spread'])}" for key, r in bad)
    return out | {"verdict_if_target_tracked": out["verdict"], "verdict": "inconclusive", "set_aside": ASIDE_STRAYS,
                  "why": f"the target model strays ({why}): a claim about the EMA is not meaningful where the "
                         f"optimizer rule already fails. Measured: {out['why']}",
                  "numbers": f"target: {why}; EMA: {out.get('numbers', out['why'])}",
                  "decision": "a claim about the EMA is not meaningful where the optimizer rule already fails"}


def track_table(family: Family, tables: dict, base: list, settings: dict, since: float | None) -> dict | None:
    """The optimizer-rule check: the target model's paired gap over the run (from `since`, where the standard
    settings leave κ=1) for every setting, against the baseline's pair spread, and whether it tracks, strays
    or sits between. `blind` says whether the target metric is blind to the EMA (else a gap there may be the
    EMA's own, and no claim is gated on it); a family's `target_blind_until` restricts it to the part of the
    run where it is (pseudo-labeling's pre-training)."""
    t = family.target_metric
    if t is None or t.name not in tables:
        return None
    table, window = tables[t.name], None
    if family.target_blind_until:
        try:
            until = epochs_of_base_steps(base[0], family.target_blind_until)
        except UserError:
            until = None
        if until is not None:
            table, window = metric_table(t, base, settings, until, since), until
    s = _spread(table, "run")
    rows = {}
    for rule, k in table["rows"]:
        if rule == "baseline":
            continue
        g, ci = _stat(table, rule, k, "run"), _ci_of(table, rule, k, "run")
        st = V.strays(g, s, ci)
        state = None if st is None else ("strays" if st else ("tracks" if g <= s else "between"))
        rows[(rule, k)] = {"metric": t.name, "gap": g, "ci": ci, "spread": s, "state": state}
    return {"metric": t.name, "blind": (not t.depends_on_ema) or window is not None, "spread": s, "rows": rows,
            "until_epoch": window, "until": family.target_blind_until or None, "since_epoch": since,
            "baseline_stopped": stopped_baselines(table)}


def optimizer_check(family: Family, gate: dict | None, kappas: list) -> dict | None:
    """What every sweep report prints: the target's gap at each κ with and without the rule (and each arm)
    against the spread, and the first κ where it strays with the rule."""
    if gate is None:
        return None
    rows = [{"setting": rule, "kappa": k, **{x: r[x] for x in ("gap", "ci", "state")}}
            for (rule, k), r in sorted(gate["rows"].items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    first = next((r["kappa"] for r in rows if r["setting"] == "with" and r["state"] == "strays"), None)
    window = f" up to epoch {gate['until_epoch']:.3g} ({gate['until']})" if gate["until_epoch"] is not None else ""
    since = f" from epoch {gate['since_epoch']:g}" if gate.get("since_epoch") else ""
    if gate.get("baseline_stopped"):
        head = f"the target model's {gate['metric']}{window}: not judged ({_stopped_why(gate['baseline_stopped'])})"
    elif first is not None:
        head = f"the target model's {gate['metric']}{window} strays with the rule first at κ={first:g}"
    elif any(r["state"] is None for r in rows if r["setting"] == "with"):
        head = f"the target model's {gate['metric']}{window}: not judged (fewer than 2 baseline seeds, or no gap)"
    else:
        head = f"the target model's {gate['metric']}{window} does not stray with the rule at any κ run"
    if not gate["blind"]:
        head += (f"; {gate['metric']} depends on the EMA too, so a gap there may be the EMA's: no EMA claim is set "
                 f"aside on it")
    return {"metric": gate["metric"], "statistic": STATISTIC["run"] + since + window, "spread": gate["spread"],
            "ema_blind": gate["blind"], "rows": rows, "first_strays_kappa": first, "summary": head,
            "rule": "strays: gap > 2× spread and the gap's 95 % CI above 1× spread; tracks: gap ≤ 1× spread"}


def _fci(ci) -> str:
    return "—" if ci is None else f"{_f(ci[0])}–{_f(ci[1])}"


def diagnose(family: Family, tables: dict, kappa: float, over: str, metric: str | None = None,
             gate: dict | None = None, noise: bool = True) -> str:
    """Why a claim on `metric` (the EMA metric by default) fell short, from the numbers: noise, the
    optimizer rule, or the EMA itself. The target model's state is the optimizer-rule check's (`gate`, its
    gap over the run with its interval), so the report never reads it two ways. `noise`: whether to name the
    seeds' noise; not for a contradicted claim, whose rule has already measured past it."""
    metric = metric or family.ema_metric.name
    table = tables[metric]
    gw, gwo, s = _stat(table, "with", kappa, over), _stat(table, "without", kappa, over), _spread(table, over)
    parts = []
    if noise and s is not None and gw is not None and gwo is not None and gwo <= V.FACTOR * s:
        parts.append(f"noise: even without the rule the {metric} gap ({_f(gwo)}) is within 2× the baseline seeds' "
                     f"spread ({_f(s)}), so this preset cannot separate the settings")
    t = family.target_metric
    row = (gate or {}).get("rows", {}).get(("with", kappa)) if gate and gate["blind"] else None
    if row and row["state"]:
        parts.append(_target_state(gate, row))
    elif t.depends_on_ema and t.name == metric:
        parts.append(f"{t.name}, the student's, depends on the EMA too, so it cannot separate an optimizer-rule "
                     f"failure from an EMA one")
    elif t.depends_on_ema and t.name in tables:
        tg, ts = _stat(tables[t.name], "with", kappa, over), _spread(tables[t.name], over)
        parts.append(f"{t.name} depends on the EMA too (gap with the rule {_f(tg)}, spread {_f(ts)}), so it "
                     f"cannot separate an optimizer-rule failure from an EMA one")
    return "; ".join(parts) or "not enough runs to say"


def _target_state(gate: dict, row: dict) -> str:
    """The optimizer-rule check's reading of the target at one setting, in words."""
    span = f"up to epoch {gate['until_epoch']:.3g}" if gate.get("until_epoch") is not None else "over the run"
    what = f"the target model's {row['metric']}"
    g, sp, ci = row["gap"], row["spread"], f" (95 % CI {_fci(row['ci'])})" if row["ci"] else ""
    if row["state"] == "strays":
        return f"the optimizer rule: {what} strays too {span} (gap with the rule {_f(g)}{ci} > 2× its spread {_f(sp)})"
    if row["state"] == "tracks":
        return (f"{what} tracks {span} (gap with the rule {_f(g)} ≤ its spread {_f(sp)}): the optimizer rule holds, "
                f"so any remaining gap is the EMA's")
    if g > V.FACTOR * sp:
        return (f"{what} gap with the rule {span} ({_f(g)}{ci}) is > 2× its spread ({_f(sp)}) but its CI reaches down "
                f"to 1×: unclear whether the optimizer rule breaks")
    return (f"{what} gap with the rule {span} ({_f(g)}) lies between 1× and 2× its spread ({_f(sp)}), within the "
            f"noise band: unclear whether the optimizer rule breaks")


def _f(v: float | None) -> str:
    return "—" if v is None else ("∞" if math.isinf(v) else f"{v:.3g}")
