"""Text renderings of plans, tables and limits: rich tables for people, CSV/JSON/YAML for tools.

Every command's output passes through here, so a module is imported by the function that draws with
it (YAML, rich's tables, the plan's types), not at the top: `emarule table momenta --format csv` needs
no rich table and no YAML, and `emarule table` none of the plan's machinery.
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

from rich.console import Console

from emarule.console import exact

if TYPE_CHECKING:
    from rich.table import Table

    from emarule.scaling import Plan
    from emarule.scaling.limits import Limits
    from emarule.scaling.tables import Table as RefTable


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "∞"
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}" if abs(v) >= 1e4 else str(int(v))
        return f"{v:.6g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 1e4 else str(v)
    if isinstance(v, list):
        return "(" + ", ".join(fmt(x) for x in v) + ")"
    return str(v)


def plan_table(p: Plan, title: str) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col, just in (("hyperparameter", "left"), ("base", "right"), ("scaled", "right"), ("unit", "left"),
                      ("rule", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for name, s in p.values.items():
        changed = s.base != s.scaled
        t.add_row(name, fmt(s.base), f"[bold]{fmt(s.scaled)}[/bold]" if changed else fmt(s.scaled), s.unit, s.rule)
    return t


def _axis(stage) -> str:
    """What a stage's bounds count: "epoch", or "base step" for a step placed on the base-step clock."""
    return {"base_steps": "base step"}.get(getattr(stage, "axis", "epochs"), "epoch")


def _describe(prog: dict | None) -> str:
    prog = prog or {}
    kind = prog.get("kind", "constant")
    if kind == "step" and prog.get("base_step") is not None:
        return f"step at base step {prog['base_step']:g}"
    if kind == "step":
        return f"step at epoch {prog.get('epoch', 0):g}"
    if kind == "smooth":
        return f"smooth, epochs {prog.get('start_epoch', 0):g}–{prog.get('end_epoch', 0):g}"
    if kind == "incremental":
        return (f"incremental, +{prog.get('delta_batch', 0):g} every {prog.get('every_epochs', 0):g} epochs "
                f"from epoch {prog.get('start_epoch', 0):g}")
    return str(kind)


def stage_table(p: Plan) -> Table:
    """One row per Progressive Scaling stage: the values that change with κ, compactly."""
    from rich.table import Table

    keys = [k for k in ("optimizer.lr", "optimizer.betas", "optimizer.alpha", "ema.momentum") if k in p.values]
    heads = {"optimizer.lr": "lr", "optimizer.betas": "betas", "optimizer.alpha": "alpha", "ema.momentum": "ρ"}
    t = Table()
    for col in (_axis(p.stages[0][0]) + "s" if p.stages else "epochs", "batch", "κ", *(heads[k] for k in keys)):
        t.add_column(col, justify="right")
    for stage, sp in p.stages or []:
        t.add_row(f"{stage.start_epoch:g}–{stage.end_epoch:g}", fmt(stage.batch_size), f"{stage.kappa:.4g}",
                  *(fmt(sp.get(k)) for k in keys))
    return t


def print_plan(console: Console, p: Plan, fmt_: str, verbose: bool = False) -> None:
    """A table of every value with its rule; with stages, the final κ's table and one compact row per
    stage (`verbose`: one full table per stage). JSON and YAML always hold everything."""
    if fmt_ == "json":
        import json

        # the plan's values are finite (scale refuses others); a stage open to the end of training is "inf"
        console.print_json(json.dumps(_finite_json(p.as_dict()), allow_nan=False))
        return
    if fmt_ == "yaml":
        import yaml

        console.print(yaml.safe_dump(p.as_dict(), sort_keys=False, allow_unicode=True), end="", markup=False)
        return
    from emarule.engine.context import rule_names

    rule = rule_names(p.ema_rule).plan
    if p.stages and verbose:
        for stage, sp in p.stages:
            console.print(plan_table(sp, f"{p.experiment}: {_axis(stage)}s {stage.start_epoch:g}–{stage.end_epoch:g}, "
                                         f"batch {fmt(stage.batch_size)}, κ={stage.kappa:g} ({rule})"))
    elif p.stages:
        last = p.stages[-1][0]
        console.print(plan_table(p, f"{p.experiment} at κ={p.kappa:g}, batch {fmt(p['batch_size'])} ({rule}): "
                                    f"the last stage, from {_axis(last)} {last.start_epoch:g}"))
        console.print(f"Progressive Scaling ({_describe(p.progressive)}): {len(p.stages)} stages, every value "
                      f"re-derived for each stage's κ (--verbose: one full table per stage)", highlight=False)
        if any(v.unit == "steps" for v in p.values.values()):
            console.print("Step counts above: N / κ at the last κ; a run reaches each through every stage "
                          "(N × B of data seen)", highlight=False)
        console.print(stage_table(p))
    else:
        console.print(plan_table(p, f"{p.experiment} at κ={p.kappa:g}, batch {fmt(p['batch_size'])} ({rule})"))
    for w in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


def ref_cells(t: RefTable) -> list[list[str]]:
    from emarule.scaling.tables import paper_round, significant

    show = paper_round if t.paper else significant  # the paper's five decimals only for the paper's values
    return [[str(r[0])] + [show(v) for v in r[1:]] for r in t.rows]


def print_ref_table(console: Console, t: RefTable, fmt_: str) -> None:
    cells = ref_cells(t)
    if fmt_ == "csv":
        import csv

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(t.headers)
        w.writerows(cells)
        console.print(buf.getvalue(), end="", markup=False, highlight=False, soft_wrap=True)
        return
    if fmt_ == "markdown":
        lines = ["| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
        for i, row in enumerate(cells):
            lines.append("| " + " | ".join(f"**{c}**" if (i, j) in t.bold else c for j, c in enumerate(row)) + " |")
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(title=t.title + " — reference values in bold", title_justify="left")
    for h in t.headers:
        table.add_column(h.replace("@", "\n").replace("rho", "ρ"), justify="right")
    for i, row in enumerate(cells):
        table.add_row(*[f"[bold]{c}[/bold]" if (i, j) in t.bold else c for j, c in enumerate(row)])
    console.print(table)


def _finite_json(x):
    """JSON has no Infinity or NaN: a non-finite float is written as the string "inf", "-inf" or "nan"
    (a batch past float64's range gives one), and -0.0 as 0.0."""
    if isinstance(x, float):
        return str(x) if not math.isfinite(x) else x + 0.0
    if isinstance(x, dict):
        return {k: _finite_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite_json(v) for v in x]
    return x


def print_limits(console: Console, lim: Limits, fmt_: str) -> None:
    d = lim.as_dict()
    if fmt_ == "json":
        import json

        console.print_json(json.dumps(_finite_json(d), allow_nan=False))
        return
    from rich.table import Table

    t = Table(title=f"ρ={exact(lim.momentum)} at batch {fmt(lim.batch_size)} in {lim.dtype} "
                    f"(p={d['significand_bits']} significand bits, relative gap r={lim.relative_gap:g})",
              title_justify="left")
    for c, j in (("bound", "left"), ("κ", "right"), ("batch size", "right"), ("formula", "left"),
                 ("meaning", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for name, b in d["bounds"].items():
        t.add_row(name, f"{b['kappa']:.4g}", f"{b['batch_size']:.4g}", b["formula"], b["meaning"])
    console.print(t)
    if d["meaningful_kappa"] is None:
        lo, hi = lim.kappa_low, lim.kappa_max
        why = (f"2^-{d['significand_bits']} / r ≥ 1: the update is lost at any κ" if math.isinf(lo) else
               f"the lower bound {lo:.4g} is not below kappa_max {hi:.4g}")
        console.print(f"meaningful: no κ is meaningful ({why}); use a wider --dtype, or a larger --relative-gap "
                      f"if θ and ζ differ more", markup=False, highlight=False, soft_wrap=True)
        return
    lo, hi = d["meaningful_kappa"]
    blo, bhi = d["meaningful_batch_size"]
    console.print(f"meaningful: κ ∈ [{lo:.4g}, {hi:.4g}], batch size ∈ [{blo:.4g}, {bhi:.4g}]", markup=False)


def print_power_kinds(console: Console, kinds: dict, fmt_: str) -> None:
    rows = [{"name": k.name, "shape": k.shape, "margin": k.margin, "what": k.what} for k in kinds.values()]
    if fmt_ == "json":
        import json

        console.print_json(json.dumps(rows))
        return
    from rich.table import Table

    t = Table(title="claim kinds (margins in baseline pair spreads)", title_justify="left")
    for c in ("kind", "shape", "margin", "what"):
        t.add_column(c, overflow="fold")
    for k in kinds.values():
        t.add_row(k.name, k.shape, k.margin_text, k.what)
    console.print(t)


def print_power(console: Console, result: dict, fmt_: str) -> None:
    if fmt_ == "json":
        import json

        console.print_json(json.dumps(_finite_json(result), allow_nan=False))
        return
    from rich.table import Table

    from emarule.analysis.reproduce.rules import spreads

    console.print(f"{result['kind']} ({result['shape']}): a true effect of {spreads(result['effect'])}, "
                  f"{result['seeds']} seeds, a noise of {spreads(result['noise'])}, {result['trials']} simulated "
                  f"reproductions, {SPREAD_SAID[result['spread']]}", markup=False, highlight=False, soft_wrap=True)
    t = Table()
    t.add_column("verdict")
    t.add_column("frequency", justify="right")
    for verdict, share in result["verdicts"].items():
        t.add_row(verdict, f"{share:.3f}")
    console.print(t)
    power = "80 % power" if result["spread"] == "known" else "80 % power at the estimated spread"
    console.print(f"minimum detectable effect at {result['seeds']} seeds: {result['mde']:.3g} spreads ({power}); "
                  + _seeds_said(result), markup=False, highlight=False, soft_wrap=True)


SPREAD_SAID = {"bounded": "the spread estimated from as many baselines and bounded (as reproduce judges)",
               "estimated": "the spread estimated from as many baselines and taken as exact",
               "known": "the spread known"}


def _seeds_said(result: dict) -> str:
    """How many seeds would detect the simulated effect, or why no count does."""
    from emarule.analysis.reproduce.rules import MAX_SEEDS, spreads

    effect = abs(result["effect"])
    margin = result.get("margin")
    if result["shape"] in ("equivalence", "noninferior") and margin is not None:
        inside = (f"a distance of {effect:g} inside ±{margin:g}" if result["shape"] == "equivalence"
                  else f"an effect of {result['effect']:g} above −{margin:g}")
        if result["seeds_for_effect"]:
            return f"seeds to show {inside}: {result['seeds_for_effect']}"
        beyond = effect >= margin if result["shape"] == "equivalence" else result["effect"] <= -margin
        return f"no seed count shows {inside}" if beyond else f"more than {MAX_SEEDS} seeds to show {inside}"
    if result["seeds_for_effect"]:
        return f"seeds to detect {effect:g}: {result['seeds_for_effect']}"
    if effect == 0:
        return "no seed count detects an effect of 0"
    if effect <= result.get("size", 0.0):
        return f"no seed count: an effect of {effect:g} does not clear the first part's size of " \
            f"{spreads(result['size'])}"
    return f"more than {MAX_SEEDS} seeds to detect it"
