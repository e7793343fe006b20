"""What a reproduction writes and prints: report.md, verdict.json and the verdict table. Torch-free."""

from __future__ import annotations

import json
import math
from pathlib import Path

from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import paired as P
from emarule.analysis.reproduce import render as T
from emarule.analysis.reproduce import rules as R
from emarule.engine.rundir import atomic_write_text
from emarule.request.seeds import seeds_label

REPORT, VERDICT = "report.md", "verdict.json"
STUDY_RULES = ("Each study claim is judged by the rule written beside its check in "
               "`emarule/analysis/reproduce/studies.py` (its record's `rule`): the studies' numbers are exact, so "
               "a claim is reproduced or contradicted.")


def clean(x):
    """JSON-safe: non-finite floats become null (an infinite gap is a run that stopped early)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def settings_rows(measured: dict) -> list[dict]:
    """One row per metric and setting (the EMA metric's and the target's, every κ, rule and arm): final value
    (mean ± std over seeds), the paired gaps with their t intervals and per-seed values, and the
    unpaired gaps (against the baselines' mean) beside them. The baseline's row holds its pair spread."""
    rows = []
    for name, table in measured["tables"].items():
        for (rule, k), row in table["rows"].items():
            finals = [v for v in row["finals"] if v is not None]
            m = sum(finals) / len(finals) if finals else None
            sd = math.sqrt(sum((v - m) ** 2 for v in finals) / len(finals)) if len(finals) > 1 else None
            g, u = row["gaps"] or {}, row.get("unpaired") or {}
            rows.append({"metric": name, "setting": "κ=1 baseline (its own spread)" if rule == "baseline" else rule,
                         "kappa": k, "seeds": len(row["curves"]), "seed_list": row.get("seeds"),
                         "final_mean": m, "final_std": sd, "gap_run": g.get("run"), "gap_end": g.get("end"),
                         "ci_run": g.get("ci_run"), "ci_end": g.get("ci_end"),
                         "per_seed_run": g.get("per_seed_run"), "per_seed_end": g.get("per_seed_end"),
                         "unpaired_gap_run": u.get("run"), "unpaired_gap_end": u.get("end"),
                         "incomplete": g.get("incomplete", 0)})
    return rows


def arms_rows(family, spec_preset: str | None) -> list[dict]:
    """The family's arms as run: κ under the preset, and the --progressive schedule resolved from its spec."""
    return [{"name": a.name, "kappa": a.kappa, "rule": "with" if a.rule else "without", "set": list(a.sets),
             "progressive": a.schedule(family.experiment, spec_preset), "what": a.what} for a in family.arms]


def payload(family, args: dict, claims: list, measured: dict | None, figures: list, timing: dict) -> dict:
    return clean({
        "family": family.name, "experiment": family.experiment, "section": family.section,
        "preset": args.get("preset"), "seeds": args.get("seeds"), "kappas": list(args.get("kappas") or []),
        "command": args["command"], "claims": [dict(c) for c in claims],
        "settings": settings_rows(measured) if measured else [], "arms": args.get("arms") or [],
        "optimizer_check": (measured or {}).get("optimizer_check"),
        "probe_check": (measured or {}).get("probe_check") or None, "figures": figures, "timing": timing,
        # the statistics, the effect each claim kind is judged on, and the rules, as their modules state them
        "decision_rule": "\n\n".join(m.__doc__.strip() for m in (P, J, R)) if family.kind == "sweep" else STUDY_RULES,
        "not_judged_here": [{"claim": c.text, "paper": c.paper, "where": c.where, "why": c.note}
                            for c in family.extra_claims],
    })


def _gci(v, ci) -> str:
    """A gap with its t interval, in the renderer's one interval format: 1.2 [+0.8, +1.6]."""
    return T.num(v) + (f" {T.interval(ci)}" if ci and v is not None else "")


def optimizer_lines(oc: dict) -> list[str]:
    lines = ["## The optimizer-rule check", "",
             f"The target model's {oc['metric']} ({oc['statistic']}): each setting's effect (how much worse than "
             f"its seed's baseline, mean over seeds with its 95 % t CI) against the baselines' pair spread "
             f"{T.num(oc['spread'])}. {oc['rule'][:1].upper() + oc['rule'][1:]}. A claim about the EMA at a "
             f"setting where the target strays is set aside.", "",
             "| setting | κ | effect [95 % CI] | × spread | target |", "|---|---:|---|---:|---|"]
    for r in oc["rows"]:
        times = (r["effect"] / oc["spread"]) if r["effect"] is not None and oc["spread"] else None
        lines.append(T.row(r["setting"], T.kappa(r["kappa"]), T.signed(r["effect"], r["ci"]), T.num(times, True),
                           r["state"] or "—"))
    return lines + ["", f"**{oc['summary'][0].upper() + oc['summary'][1:]}.**", ""]


def _total(t: dict) -> str:
    """The sum over the invocations of the same command (`ledger.record`), when there was more than one."""
    if (t.get("invocations") or 1) <= 1:
        return ""
    trained, runs = int(t["trained"]), int(t["runs"])
    # a run trained again (its directory deleted, say) counts once per training in the ledger's sum
    again = f" and {trained - runs} of them again" if trained > runs else ""
    return (f" ({t['wall_s_total']:.0f} s over the {t['invocations']} invocations of this command that trained "
            f"{min(trained, runs)} of its {runs} runs{again})")


def markdown(data: dict, family) -> str:
    t = data["timing"]
    lines = [f"# Reproduction: {family.name} ({family.experiment}, {family.section})", "",
             f"Command: `{data['command']}`", ""]
    if data.get("seeds"):
        lines += [f"Seeds: {seeds_label(data['seeds'])} ({len(data['seeds'])}); every setting's run of a seed is "
                  f"compared with that seed's baseline.", ""]
    lines.append(f"Wall time of this invocation: {t['wall_s']:.0f} s" + _total(t)
                 + (f"; the runs' own training time (as logged, reused runs included): {t['runs_wall_s']:.0f} s"
                    if t.get("runs_wall_s") is not None else "")
                 + f". Machine: {t['cpus']} CPU cores, load average {t['load_start']:.2f} at the start and "
                 f"{t['load_end']:.2f} at the end; OMP_NUM_THREADS={t['omp_threads']}.")
    if t.get("reused"):
        lines.append(f"Runs reused from an earlier invocation (finished, or resumed from their checkpoint): "
                     f"{t['reused']} of {t['runs']}.")
    if data["figures"]:
        lines += ["", "## Figures", ""] + [f"![{Path(f).name}]({f})" for f in data["figures"]]
    lines += ["", "## Verdicts", ""]
    if family.kind == "study":
        lines += ["| # | claim | paper | measured | verdict |", "|---:|---|---|---|---|"]
        lines += [T.row(i, T.cell(T.label(c)), c["paper"], T.cell(T.effect(c)), T.cell(T.verdict(c)))
                  for i, c in enumerate(data["claims"], 1)]
    else:
        lines += ["Each effect is signed so that the paper's direction is positive, in the metric's units: a mean "
                  "over paired seeds (each run against its own seed's baseline) with its 95 % t interval. MDE: "
                  "the minimum detectable effect at the seeds run (80 % power): for a signed claim, the true effect "
                  "its rule reproduces (beyond the part's size where it has one, a size of one spread at the "
                  "spread's upper bound); for a \"matches\" claim, the effect the seeds tell from none. Beside it, "
                  "the baselines' pair spread it is measured against, estimated from the baselines: a size or "
                  "margin of one spread is taken at its χ² bound (each part's rule says where).", "",
                  "| # | claim | paper | metric | κ | shape | statistic | effect [95 % CI] | MDE | verdict |",
                  "|---:|---|---|---|---:|---|---|---|---|---|"]
        lines += [T.row(i, T.cell(T.label(c)), c["paper"], c["metric"], T.kappa(c["kappa"]), c.get("shape") or "—",
                        T.cell(c.get("statistic") or "—"), T.cell(T.effect(c)), T.cell(T.mde(c)), T.cell(T.verdict(c)))
                  for i, c in enumerate(data["claims"], 1)]
    if data.get("optimizer_check"):
        lines += [""] + optimizer_lines(data["optimizer_check"])
    if data.get("arms"):
        lines += ["## Arms: extra settings run beside the sweep", "", "| arm | κ | EMA rule | --set | --progressive | "
                  "what |", "|---|---:|---|---|---|---|"]
        lines += [T.row(a["name"], T.kappa(a["kappa"]), a["rule"], ", ".join(a["set"]) or "—",
                        T.cell(a["progressive"] or "the spec’s own"), T.cell(a["what"])) for a in data["arms"]] + [""]
    lines += ["", "## Claims", ""]
    for i, c in enumerate(data["claims"], 1):
        lines += [f"### {i}. {c['paper']}" + (f" ({c['where']})" if c.get("where") else ""), "",
                  f"> {c['claim']}", "", f"- **Verdict: {T.verdict(c, bold=False)}.**"]
        if c.get("rule"):
            lines.append(f"- Rule applied: {c['rule']}.")
        if c.get("p_reproduced") is not None and c.get("verdict") in R.VERDICTS:  # the rows the table corrects
            lines.append(f"- p-values: {T.num(c['p_reproduced'])} for reproduced, {T.num(c['p_contradicted'])} for "
                         f"contradicted (each reads its verdict below 0.05; the README's table corrects them over "
                         f"its rows, Holm).")
        if T.exact(c):
            lines.append(f"- Measured: {c.get('why') or '—'}.")
        for p in c.get("parts") or []:
            lines.append(f"- Part: {T.part_line(p)}. Per seed: {', '.join(T.num(x, True) for x in p['per_seed'])}.")
        if c.get("seeds_for_paper_effect") is not None:
            lines.append(f"- Seeds that would tell the paper's effect (one spread, or the size the claim states) "
                         f"from none with 80 % power: {c['seeds_for_paper_effect']}.")
        if c.get("mechanism"):
            m = c["mechanism"]
            state = {True: "present", False: "absent"}.get(m.get("present"), "not measured")
            lines.append(f"- Mechanism the claim needs: {T.mechanism(m)} ({state}).")
        if c.get("verdict_if_applicable"):
            lines.append(f"- Where the claim applied, the rules would have said: {c['verdict_if_applicable']}.")
        if c.get("settings"):
            b = f", B = {c['settings']['B']}" if "B" in c["settings"] else ""
            lines.append(f"- Settings compared: A = {c['settings']['A']}{b}.")
        if c.get("numbers") and not T.exact(c):
            gaps = ", ".join(f"{k} {T.num(v)}" for k, v in c["numbers"].items())
            lines.append(f"- Mean gaps (|Δ|, {c.get('statistic') or ''}): {gaps}.")
        if c.get("probe_check"):
            lines.append(f"- Does the tracking probe measure the teacher? {c['probe_check']}.")
        if c.get("numbers") and T.exact(c):
            lines.append(f"- Numbers: `{json.dumps(c['numbers'], ensure_ascii=False)}`")
        if c.get("note"):
            lines.append(f"- Our reading: {c['note']}.")
        if c.get("figure"):
            lines.append(f"- Figure: [{Path(c['figure']).name}]({c['figure']})")
        lines += [f"- Command: `{data['command']}`", ""]
    if data["settings"]:
        lines += ["## Every setting", "",
                  "Final value (mean ± std over seeds) and the paired gap statistics with their 95 % t CI "
                  "(each run against its own seed's baseline); the baseline's row holds its pair spread (each "
                  "baseline seed against each other one). The unpaired gap (against the mean of the baselines) "
                  "is beside it for comparison.", "",
                  "| metric | setting | κ | seeds | final | ± std | mean \\|Δ\\| over the run [CI] | "
                  "\\|Δ\\| at the end [CI] | unpaired, run | unpaired, end |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [T.row(r["metric"], r["setting"], T.kappa(r["kappa"]), r["seeds"], T.num(r["final_mean"]),
                        T.num(r["final_std"]), _gci(r["gap_run"], r.get("ci_run")), _gci(r["gap_end"], r.get("ci_end")),
                        T.num(r.get("unpaired_gap_run")), T.num(r.get("unpaired_gap_end"))) for r in data["settings"]]
        lines.append("")
    if data.get("probe_check"):
        pc = data["probe_check"]
        lines += ["## Does the tracking probe measure the teacher?", "",
                  "Each run's final teacher (the EMA in its checkpoint), probed offline: multinomial logistic "
                  "regression on its standardized train-split features, fitted to convergence, scored on the test "
                  "split (`emarule/analysis/offline_probe.py`); the baseline seeds' teachers at "
                  "initialization as the reference.", "",
                  "| setting | tracking probe (last reading) | offline probe, final teacher | offline probe, "
                  "teacher at init |", "|---|---:|---:|---:|"]
        lines += [T.row(k, *(T.mean_sd(v.get(name)) for name in ("tracking", "offline", "init")))
                  for k, v in pc["settings"].items()]
        lines += ["", f"{pc['summary']}.", ""]
    lines += ["## How a verdict is reached", "", data["decision_rule"], ""]
    if data["not_judged_here"]:
        lines += ["## Claims of this section not judged", "",
                  "Listed so that the table's silence is not read as a verdict; each says what judging it needs.", ""]
        lines += [f"- {c['paper']} ({c['where']}): \"{c['claim']}\" — {c['why']}." for c in data["not_judged_here"]]
        lines += ["", f"The family at full scale: {family.full_scale}.", ""]
    return "\n".join(lines)


def write(out: Path, family, data: dict) -> None:
    atomic_write_text(Path(out) / VERDICT, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(Path(out) / REPORT, markdown(data, family))


def print_verdicts(console, data: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{data['family']}: the paper's claims, checked ({data['command']})", title_justify="left")
    study = not data["settings"]
    middle = ("measured",) if study else ("κ", "effect [95 % CI]", "MDE")
    for c in ("#", "claim", *middle, "verdict"):
        t.add_column(c, justify="right" if c in ("#", "κ") else "left", overflow="fold")
    style = {R.REPRODUCED: "green", R.CONTRADICTED: "red"}
    for i, c in enumerate(data["claims"], 1):
        cells = [escape(T.effect(c))] if study else [T.kappa(c["kappa"]), escape(T.effect(c)), escape(T.mde(c))]
        t.add_row(str(i), escape(T.label(c)), *cells,
                  f"[{style.get(c['verdict'], 'yellow')}]{escape(T.verdict(c, bold=False))}[/]")
    console.print(t)
    oc = data.get("optimizer_check")
    if oc:
        rows = ", ".join(f"κ={T.kappa(r['kappa'])} {r['setting']} {T.signed(r['effect'], r['ci'])}" for r in oc["rows"])
        console.print(f"optimizer-rule check ({oc['metric']}, spread {T.num(oc['spread'])}): {rows}; {oc['summary']}",
                      highlight=False, markup=False)
