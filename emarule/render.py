"""Text renderings of plans, tables and limits: rich tables for people, CSV/JSON/YAML for tools."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from emarule.rundir import atomic_write_text
from emarule.scaling import Plan
from emarule.scaling.limits import Limits
from emarule.scaling.tables import Table as RefTable
from emarule.scaling.tables import paper_round


def wide_console(stderr: bool = False, quiet: bool = False) -> Console:
    """A terminal console; 200 columns when piped (rich would assume 80 and fold the tables)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, quiet=quiet, width=None if stream.isatty() else 200)


def print_and_save(console: Console, tables: list, path: Path) -> None:
    """Print `tables` and write the same text, uncoloured, to `path` (atomically)."""
    record = Console(record=True, width=200, file=io.StringIO())
    for t in tables:
        console.print(t)
        record.print(t)
    atomic_write_text(path, record.export_text())


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
    t = Table(title=title, title_justify="left")
    for col, just in (("hyperparameter", "left"), ("base", "right"), ("scaled", "right"), ("unit", "left"),
                      ("rule", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for name, s in p.values.items():
        changed = s.base != s.scaled
        t.add_row(name, fmt(s.base), f"[bold]{fmt(s.scaled)}[/bold]" if changed else fmt(s.scaled), s.unit, s.rule)
    return t


def print_plan(console: Console, p: Plan, fmt_: str) -> None:
    if fmt_ == "json":
        console.print_json(json.dumps(p.as_dict()))
        return
    if fmt_ == "yaml":
        console.print(yaml.safe_dump(p.as_dict(), sort_keys=False, allow_unicode=True), end="", markup=False)
        return
    rule = {None: "without the EMA rule", "exponential": "EMA rule ρ^κ", "linear": "linear EMA rule"}[p.ema_rule]
    if p.stages:
        for stage, sp in p.stages:
            console.print(plan_table(sp, f"{p.experiment}: epochs {stage.start_epoch:g}–{stage.end_epoch:g}, "
                                         f"batch {fmt(stage.batch_size)}, κ={stage.kappa:g} ({rule})"))
    else:
        console.print(plan_table(p, f"{p.experiment} at κ={p.kappa:g}, batch {fmt(p['batch_size'])} ({rule})"))
    for w in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")


def ref_cells(t: RefTable) -> list[list[str]]:
    return [[str(r[0])] + [paper_round(v) for v in r[1:]] for r in t.rows]


def print_ref_table(console: Console, t: RefTable, fmt_: str) -> None:
    cells = ref_cells(t)
    if fmt_ == "csv":
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
    table = Table(title=t.title + " — reference values in bold", title_justify="left")
    for h in t.headers:
        table.add_column(h.replace("@", "\n").replace("rho", "ρ"), justify="right")
    for i, row in enumerate(cells):
        table.add_row(*[f"[bold]{c}[/bold]" if (i, j) in t.bold else c for j, c in enumerate(row)])
    console.print(table)


def print_limits(console: Console, lim: Limits, fmt_: str) -> None:
    d = lim.as_dict()
    if fmt_ == "json":
        console.print_json(json.dumps(d))
        return
    lo, hi = d["meaningful_kappa"]
    blo, bhi = d["meaningful_batch_size"]
    t = Table(title=f"ρ={lim.momentum:g} at batch {fmt(lim.batch_size)} in {lim.dtype} "
                    f"(p={d['significand_bits']} significand bits, relative gap r={lim.relative_gap:g})",
              title_justify="left")
    for c, j in (("bound", "left"), ("κ", "right"), ("batch size", "right"), ("formula", "left"),
                 ("meaning", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for name, b in d["bounds"].items():
        t.add_row(name, f"{b['kappa']:.4g}", f"{b['batch_size']:.4g}", b["formula"], b["meaning"])
    console.print(t)
    console.print(f"meaningful: κ ∈ [{lo:.4g}, {hi:.4g}], batch size ∈ [{blo:.4g}, {bhi:.4g}]")
