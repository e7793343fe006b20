"""`emarule run parabola`: §3.1 and Appendix F.1, the noisy parabola with SGD + Polyak-Ruppert EMA.

Writes into the run directory, each file atomically:
    results.json   one record per (ρ_B, D, convention, κ): the momenta and their errors
    run.json       how it was computed (ρ* method, seeds, fidelity of the search), wall time
    table.txt      the terminal table
    figures/       fig1a_/fig1b_rho<ρ_B>_D<D>.png (the paper's layout) and summary.png
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.console import print_and_save, wide_console
from emarule.studies.parabola.momenta import CONVENTIONS
from emarule.studies.parabola.problem import Problem
from emarule.studies.parabola.study import Settings, steps_of
from emarule.studies.parabola.grid import configurations, run_all, settings_for
from emarule.engine.rundir import atomic_write_bytes, atomic_write_text
from emarule.config.typed import Config

RESULT_KEYS = ("rho_base", "dim", "convention", "kappa", "rho_rule", "rho_star", "err_rule", "err_no_rule",
               "err_linear", "err_star", "err_target")

NOISE_READING = ("ε_k ~ N(0, (b (aθ_k)² + c)/κ) per coordinate: the g_k² in the paper's variance is read as the "
                 "squared noise-free gradient, which keeps E[g_k | θ_k] = aθ_k")
CONVENTION_TEXT = {"pre": "ζ_{k+1} = ρζ_k + (1−ρ)θ_k, the paper's Definition",
                   "post": "ζ_{k+1} = ρζ_k + (1−ρ)θ_{k+1}, as BYOL and DINO"}
TIME_UNIT = "t = (samples seen / base batch) × η_B = jκη_B at scaled step j; T = I_B η_B = 1"


def problem_of(cfg: Config) -> Problem:
    sec = cfg.parabola
    lr, iters = cfg.optimizer.lr, cfg.schedule.total_steps
    if not lr or not iters:
        raise UserError("parabola: the spec needs optimizer.lr (η_B) and schedule.total_steps (I_B)")
    return Problem(a=float(sec.a), b=float(sec.b), c=float(sec.c), theta0=float(sec.theta0), lr=float(lr),
                   iters=int(iters))


def settings_of(cfg: Config, problem: Problem, seed: int) -> Settings:
    sec = cfg.parabola
    kappas = sorted({problem.check_kappa(k) for k in sec.kappas})
    conventions = tuple(c for c in CONVENTIONS if c in sec.conventions)
    if not kappas or not conventions:
        raise UserError("parabola: kappas and conventions must not be empty")
    return Settings(kappas=kappas, conventions=conventions, method=sec.d1_method, seeds=int(sec.seeds), seed=seed,
                    search_points=int(sec.search_points), nodes=int(sec.nodes),
                    figure_kappas=tuple(int(k) for k in sec.figure_kappas))


def run(ctx: RunContext) -> dict:
    if ctx.kappa != 1:
        raise UserError("parabola sweeps κ itself (parabola.kappas); drop --kappa/--batch-size, or use "
                        "--set 'parabola.kappas=[1,2,4]'")
    cfg = ctx.cfg
    sec = cfg.parabola
    problem = problem_of(cfg)
    st = settings_of(cfg, problem, seed=int(sec.seed) + int(ctx.seed))
    rho_main = float(sec.rho_bases[0] if cfg.ema.momentum is None else cfg.ema.momentum)
    configs = configurations(sec.rho_bases, sec.dims, rho_main)
    workers = int(sec.workers)
    console = wide_console(quiet=ctx.quiet)
    out = Path(ctx.out)
    out.mkdir(parents=True, exist_ok=True)

    start, cpu0, t0 = time.perf_counter(), time.process_time(), time.time()
    total = sum(steps_of(settings_for(st, d, sec.seed_dim_product), d) for _, d in configs)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=ctx.quiet) as progress:
        bar = progress.add_task("noisy parabola", total=total)
        outcomes = run_all(problem, configs, st, int(sec.seed_dim_product), workers,
                           tick=lambda msg: progress.update(bar, advance=1, description=msg))
    compute_s = time.perf_counter() - start
    for o in outcomes.values():  # when each configuration ran, in seconds from the start
        a, b = o.info.pop("window")
        o.info["ran_s"] = [round(a - t0, 2), round(b - t0, 2)]

    records = [r for key in configs for r in outcomes[key].records]
    atomic_write_text(out / "results.json", json.dumps(records, indent=1) + "\n")
    fig_dir = out / "figures"
    written = []
    for key in configs:
        for name, data in outcomes[key].figures.items():
            atomic_write_bytes(fig_dir / name, data)
            written.append(f"figures/{name}")
    from emarule.studies.parabola import figures  # matplotlib: imported where a figure is drawn

    atomic_write_bytes(fig_dir / "summary.png", figures.summary(records, rho_main, st.conventions))
    written.append("figures/summary.png")

    print_and_save(console, tables(outcomes, configs, st.conventions), out / "table.txt")
    wall_s = time.perf_counter() - start
    meta = {
        "experiment": cfg.name, "preset": ctx.preset, "seed": st.seed, "workers": workers,
        "wall_time_s": round(wall_s, 2), "compute_time_s": round(compute_s, 2),
        "cpu_time_main_process_s": round(time.process_time() - cpu0, 2),
        "problem": {"a": problem.a, "b": problem.b, "c": problem.c, "theta0_norm": problem.theta0,
                    "lr_base": problem.lr, "iterations_base": problem.iters},
        "noise": NOISE_READING, "time_unit": TIME_UNIT,
        "test_function": "g(ζ) = ζ for D=1, ‖ζ‖ for D>1; θ_0 = theta0/√D in every coordinate",
        "err": "max over the shared grid t_j = jκη_B, j = 0..⌊I_B/κ⌋, of |E g(ζ_base) − E g(ζ_scaled)|",
        "conventions": CONVENTION_TEXT,
        "kappas": st.kappas,
        "configurations": [{"rho_base": r, "dim": d} | outcomes[(r, d)].info for r, d in configs],
        "files": ["results.json", "table.txt"] + written,
    }
    atomic_write_text(out / "run.json", json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    console.print(f"parabola: {len(configs)} configurations × {len(st.kappas)} κ × {len(st.conventions)} conventions "
                  f"in {wall_s:.1f} s wall ({workers} worker{'s' if workers > 1 else ''}); results in {out}/")
    return {"records": records, "wall_time_s": wall_s, "out": str(out)}


def _e(v) -> str:
    return "—" if v is None else ("0" if v == 0 else f"{v:.2e}")


def tables(outcomes: dict, configs, conventions) -> list[Table]:
    """One table per convention; a block of rows per (ρ_B, D)."""
    out = []
    for conv in conventions:
        t = Table(title=f"noisy parabola, {conv} EMA ({CONVENTION_TEXT[conv]}); "
                        f"β*/β = (1 − ρ*)/(1 − ρ_B^κ), below 1 means ρ* above the rule", title_justify="left")
        for col in ("ρ_B", "D", "ρ* from", "κ", "ρ_B^κ", "ρ*", "β*/β", "Err rule", "Err ρ*", "Err no rule",
                    "Err linear", "Err target"):
            t.add_column(col, justify="left" if col == "ρ* from" else "right")
        for rho_base, dim in configs:
            o = outcomes[(rho_base, dim)]
            how = "exact" if o.info["method"] == "exact" else "hold-out"
            rows = sorted((r for r in o.records if r["convention"] == conv), key=lambda r: r["kappa"])
            for n, r in enumerate(rows):
                beta = 1.0 - r["rho_rule"]
                ratio = f"{(1.0 - r['rho_star']) / beta:.4f}" if beta > 0 else "—"
                t.add_row(f"{rho_base:g}" if n == 0 else "", str(dim) if n == 0 else "", how if n == 0 else "",
                          str(r["kappa"]), f"{r['rho_rule']:.6g}", f"{r['rho_star']:.6g}", ratio,
                          _e(r["err_rule"]), _e(r["err_star"]), _e(r["err_no_rule"]), _e(r["err_linear"]),
                          _e(r["err_target"]), end_section=n == len(rows) - 1)
        out.append(t)
    return out
