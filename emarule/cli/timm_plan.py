"""`emarule plan --timm-args args.yaml`: the options checked, the plan printed, the scaled args.yaml written."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console

from emarule.errors import UserError


def plan_timm(console: Console, path: Path | None, other_source, kappa: str | None, batch_size: str | None,
              world_size: int, fmt_: str, out: str | None, other_options, ema_rule: str = "exponential") -> None:
    """`ema_rule` (--ema-rule) scales model_ema_decay as it scales ema.momentum in `emarule plan`."""
    from emarule.request import checks
    from emarule.request.resolve import number
    from emarule.cli.render import plan_table, print_plan
    from emarule.engine.context import rule_names
    from emarule.scaling import timm_args

    if path is None:
        raise UserError("--format timm and --out need --timm-args PATH (the args.yaml of a timm train.py run)")
    if other_source:
        raise UserError("--timm-args replaces EXPERIMENT and --spec; give one of them")
    if other_options:
        raise UserError("--timm-args takes only --batch-size or --kappa, --ema-rule, --world-size, --format and "
                        "--out")
    if out is not None and fmt_ != "timm":
        raise UserError("--out writes the scaled args.yaml; add --format timm")
    if kappa is not None and batch_size is not None:
        raise UserError("give --kappa or --batch-size, not both")
    target = None if out is None else checks.out_file(out, example="args.yaml")
    args = timm_args.load(path)
    p, scaled = timm_args.timm_plan(args, str(path), kappa=number(kappa, "--kappa"),
                                    batch_size=number(batch_size, "--batch-size"), world_size=world_size,
                                    ema_rule=ema_rule)
    if fmt_ == "table":
        console.print(plan_table(p, f"{path} at κ={p.kappa:g}, global batch {p['global batch']:g}, "
                                    f"{p['batch_size']} per device ({rule_names(p.ema_rule).plan})"))
        for w in p.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}")
        return
    if fmt_ != "timm":
        print_plan(console, p, fmt_)
        return
    if target is None:
        console.print(yaml.safe_dump(scaled, default_flow_style=False), end="", markup=False, highlight=False)
        return
    timm_args.write(scaled, target)
    console.print(f"wrote {target} (κ={p.kappa:g}, global batch {p['global batch']:g}); "
                  f"run: train.py --config {target}", highlight=False, soft_wrap=True)
    for w in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
