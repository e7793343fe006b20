"""A sweep family's claims measured on its runs: gaps per setting and metric, then one verdict per claim.

Reads the run directories (`emarule.analysis.compare.load_runs`); torch-free.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from emarule.analysis.compare import finite_number, mean_curve
from emarule.errors import UserError
from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import mechanisms
from emarule.analysis.reproduce import paired as V
from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce.claims import SHORTEST_ALSO, STANDARD, Claim, Family, Metric, for_spec, setting_key

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
        xs, ys = final_reading(r, metric) if metric.file else V.smooth(r.curve(metric.name), metric.smooth_epochs)
        keep = [i for i, x in enumerate(xs) if (until is None or x <= until + 1e-9)
                and (since is None or x >= since - 1e-9)]
        return [xs[i] for i in keep], [ys[i] for i in keep]

    base_curves = [curve(r) for r in base]
    bgrid, bmean, bstd = mean_curve(base_curves)
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
    planned end (its layout's last epoch, else its last logged one), so that every run of a comparison puts it
    at the same epoch. No point where the file or its value is missing."""
    from emarule.engine.rundir import read_json

    got = read_json(run.path / metric.file)
    v = finite_number(got.get(metric.name)) if isinstance(got, dict) else None
    ends = [finite_number(st.get("end_epoch")) for st in run.hparams.get("layout") or [] if isinstance(st, dict)]
    end = max((e for e in ends if e is not None), default=None)
    if end is None:
        end = max((x for x in map(run.epoch_of, run.rows) if x is not None), default=None)
    return ([end], [v]) if v is not None and end is not None else ([], [])


def finals_of(curves: list, stopped: list) -> list:
    """Each curve's final value; none for a run that stopped before its end."""
    return [None if st or not c[1] else finite_number(c[1][-1]) for c, st in zip(curves, stopped, strict=True)]


def stopped_early(run) -> bool | None:
    """Whether the run's log ends before its planned end; None where it records no end (`compare.Run`'s)."""
    return run.stopped_early()


def measure(family: Family, runs: list, arms: dict | None = None) -> dict:
    """Every claim of `family` judged on `runs`, with the metric names and labels of the spec the baseline ran
    (`claims.for_spec`): the tables' `metric` entries are the ones the figure draws. `arms`: run directory →
    arm name, for the runs of the family's arms. The claims are `judge.Verdict` records, as dicts."""
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

    @functools.cache
    def tables_from(x: float | None) -> dict:
        return {m.name: metric_table(m, base, settings, since=x) for m in metrics}

    tables = tables_from(since)
    kappas = sorted({k for k, rule in settings if rule in STANDARD or rule == "linear"})
    gate = track_table(family, tables, base, settings, since)
    claims = []
    for c in expand(family.claims, kappas):
        if c.metric not in tables:
            claims.append(not_logged(c, family).as_dict())
            continue
        x = claim_since(family, c, settings, since)
        ts, span = tables_from(x), ""
        if c.until:  # the claim's part of the run only
            until = epochs_of_base_steps(base[0], c.until)
            ts = {**ts, c.metric: metric_table(family.metric(c.metric), base, settings, until, x)}
            span = f" up to epoch {until:.3g} ({c.until})"
        if x and c.over == "run":
            span = f" from epoch {x:g}" + span
        read = [c.metric] + ([family.target_metric.name] if c.kind in ("target_explains", "ema_above_target") else [])
        broken = sorted({s for n in read if n in ts for s in stopped_baselines(ts[n])}, key=str)
        v = (J.Verdict.of(c, why=_stopped_why(broken)) if broken
             else J.judge(family, c, ts, kappas, gate, mechanisms.check(c, base, ts)))
        if span and v.statistic:
            v.statistic += span
        claims.append(v.as_dict())
    return {"tables": tables, "claims": claims, "kappas": kappas, "baseline_seeds": len(base),
            "seeds": [r.seed for r in base], "since_epoch": since,
            "optimizer_check": optimizer_check(family, gate, kappas)}


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


def expand(claims, kappas: list) -> list[Claim]:
    """An "up to κ" claim becomes one claim per κ ≠ 1 of the sweep up to its κ, and beyond it where the claim
    takes stand-ins (`Claim.stand_in_beyond`: judged in place of the paper's range, and labelled so)."""
    out = []
    for c in claims:
        ks = [k for k in kappas if k != 1 and (k <= c.kappa or c.stand_in_beyond)] if c.up_to else []
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


def not_logged(c: Claim, family: Family) -> J.Verdict:
    file = next((m.file for m in family.metrics if m.name == c.metric), "")
    why = ("the spec has no ema.also, so no further EMA is evaluated" if SHORTEST_ALSO in c.metric
           else f"a baseline run has no {file} (its final teacher was not probed)" if file
           else f"this preset does not log {c.metric}")
    return J.Verdict.of(c, why=why)


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


def track_table(family: Family, tables: dict, base: list, settings: dict, since: float | None) -> dict | None:
    """The optimizer-rule check: for every setting, the target model's −σ·Δ over the run (from `since`) against
    the baselines' pair spread: it STRAYS when its CI95 lies above one spread, TRACKS when its CI90 lies inside
    ±1 spread, and sits BETWEEN otherwise. Its spread is not bounded as a claim's is (`rules.Part.bound`): a
    screen that sets EMA claims aside would set fewer aside on the same evidence if "strays" were harder to meet.
    `blind`: whether the target metric is blind to the EMA (else a gap there may be the EMA's own, and no claim
    is set aside on it), up to a family's `target_blind_until` where it has one (pseudo-labeling's pre-training)."""
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
    s, worse = J.scale(table, "signed", "run"), -J.sigma(t)
    rows = {}
    for rule, k in table["rows"]:
        if rule == "baseline":
            continue
        d = J.signed(table, (rule, k), "run")
        state, effect, ci = None, None, None
        if d is not None and s and math.isfinite(s):
            e = [worse * v / s for v in d.values()]
            sm = R.summarize(e)
            effect, ci = sm.mean * s, (sm.ci95[0] * s, sm.ci95[1] * s)
            if R.decide(R.Part("directional", size=1.0), e).verdict == R.REPRODUCED:
                state = "strays"
            elif R.decide(R.Part("equivalence", margin=1.0), e).verdict == R.REPRODUCED:
                state = "tracks"
            elif math.isfinite(sm.mean):
                state = "between"
        rows[(rule, k)] = {"metric": t.name, "effect": effect, "ci": ci, "spread": s, "state": state}
    return {"metric": t.name, "blind": (not t.depends_on_ema) or window is not None, "spread": s, "rows": rows,
            "until_epoch": window, "until": family.target_blind_until or None, "since_epoch": since,
            "baseline_stopped": stopped_baselines(table)}


def optimizer_check(family: Family, gate: dict | None, kappas: list) -> dict | None:
    """What every sweep report prints: the target's signed effect at each κ with and without the rule (and
    each arm) against the spread, and the first κ where it strays with the rule."""
    if gate is None:
        return None
    rows = [{"setting": rule, "kappa": k, **{x: r[x] for x in ("effect", "ci", "state")}}
            for (rule, k), r in sorted(gate["rows"].items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    first = next((r["kappa"] for r in rows if r["setting"] == "with" and r["state"] == "strays"), None)
    window = f" up to epoch {gate['until_epoch']:.3g} ({gate['until']})" if gate["until_epoch"] is not None else ""
    since = f" from epoch {gate['since_epoch']:g}" if gate.get("since_epoch") else ""
    if gate.get("baseline_stopped"):
        head = f"the target model's {gate['metric']}{window}: not judged ({_stopped_why(gate['baseline_stopped'])})"
    elif first is not None:
        head = f"the target model's {gate['metric']}{window} strays with the rule first at κ={first:g}"
    elif any(r["state"] is None for r in rows if r["setting"] == "with"):
        head = f"the target model's {gate['metric']}{window}: not judged (fewer than 2 baseline seeds, or no Δ)"
    else:
        head = f"the target model's {gate['metric']}{window} does not stray with the rule at any κ run"
    if not gate["blind"]:
        head += (f"; {gate['metric']} depends on the EMA too, so a gap there may be the EMA's: no EMA claim is set "
                 f"aside on it")
    return {"metric": gate["metric"], "statistic": "mean Δ over the run" + since + window, "spread": gate["spread"],
            "ema_blind": gate["blind"], "rows": rows, "first_strays_kappa": first, "summary": head,
            "rule": "strays: the target's effect (worse than its baseline) has its CI95 above 1 spread; tracks: "
                    "its CI90 lies inside ±1 spread (TOST); between otherwise"}
