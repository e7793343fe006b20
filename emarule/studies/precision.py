"""`emarule run precision`: the numerical-stability appendix (linear regression + Polyak-Ruppert EMA).

Writes into the run directory, each file atomically:
    results.json   per (run, ρ): MaxAbsDiff against FP32 of the EMA and target weights (mean and
                   spread over repeats), the share of due EMA updates that were lost, and, per ρ,
                   what `emarule limits` predicts for a bfloat16 EMA at the measured relative gap
    table.txt      the terminal table
    figures/precision.png
"""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import torch
from rich.table import Table

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.cli.render import print_and_save, wide_console
from emarule.studies.precision_study import Config, max_abs_diff, study
from emarule.engine.rundir import atomic_write_bytes, atomic_write_text
from emarule.scaling.limits import FORMATS, limits
from emarule.config.load import get
from emarule.config.schema import value

FLOOR = 1e-12
SECOND_RUNS = {
    "fp32_reorder": "FP32 again, each minibatch gradient summed in reverse order: differs from the first "
                    "rounding on, as a second run of one seed on a GPU does (the floor for 'same run')",
    "fp32_seed": "FP32 again with another minibatch order: the run-to-run spread of training itself",
}


def config_of(spec: dict, seed: int) -> Config:
    sec = spec["precision_study"]
    steps, lr, batch = get(spec, "schedule.total_steps"), get(spec, "optimizer.lr"), get(spec, "batch.size")
    if not steps or not lr or not batch or float(batch) != int(batch):
        raise UserError("precision: the spec needs schedule.total_steps, optimizer.lr and a whole batch.size")
    if int(batch) > int(sec["samples"]):
        raise UserError(f"precision: batch.size {batch} exceeds precision_study.samples {sec['samples']}")
    if "fp32" not in sec["dtypes"]:
        raise UserError("precision_study.dtypes must include fp32, the reference")
    return Config(features=int(sec["features"]), samples=int(sec["samples"]), steps=int(steps), batch=int(batch),
                  lr=float(lr), noise=float(sec["noise"]), init_std=float(value(spec, "precision_study.init_std")),
                  momenta=tuple(float(m) for m in sec["momenta"]), dtypes=tuple(sec["dtypes"]),
                  repeats=int(value(spec, "precision_study.repeats")),
                  seed=int(value(spec, "precision_study.seed")) + seed)


def summarize(cfg: Config, runs: dict) -> dict:
    ref = runs["fp32"]
    scale = ref.zeta.abs().amax(dim=-1)  # (momenta, repeats): size of the reference EMA weights
    records = []
    for name, r in runs.items():
        if name == "fp32":
            continue
        ema = max_abs_diff(r.zeta, ref.zeta)  # (momenta, repeats)
        target = max_abs_diff(r.theta, ref.theta)  # (repeats,)
        for i, m in enumerate(cfg.momenta):
            records.append({
                "run": name, "model_dtype": "fp32" if name.startswith("fp32") or name.endswith("_ema") else name,
                "ema_dtype": name.split("_")[0], "momentum": m,
                "ema_maxabsdiff": float(ema[i].mean()), "ema_maxabsdiff_std": float(ema[i].std()),
                "ema_maxabsdiff_relative": float((ema[i] / scale[i]).mean()),
                "target_maxabsdiff": float(target.mean()), "target_maxabsdiff_std": float(target.std()),
                "ema_updates_lost": float(r.lost[i]), "ema_frozen_steps": float(r.frozen_steps[i]),
                "ema_relative_gap": float(r.gap[i]),
            })
    p = FORMATS["bfloat16"][0]
    bf16 = []
    for i, m in enumerate(cfg.momenta):
        gap = float(ref.gap[i])
        lim = limits(m, cfg.batch, "bfloat16", relative_gap=gap) if gap > 0 and math.isfinite(gap) else None
        held = runs.get("bf16_ema")
        both = runs.get("bf16")
        bf16.append({
            "momentum": m, "fp32_relative_gap": gap, "step_times_gap": (1 - m) * gap,
            "half_ulp_range": [2.0 ** -(p + 1), 2.0**-p],
            "kappa_update": lim.kappa_update if lim else None,
            "kappa_min_if_rho_rounded": limits(m, cfg.batch, "bfloat16").kappa_min,
            "predicted_lost_at_kappa_1": bool(lim and lim.kappa_update > 1),
            "measured_lost": float(held.lost[i]) if held is not None else None,
            "bf16_relative_gap": float(held.gap[i]) if held is not None else None,
            "bf16_step_times_gap": (1 - m) * float(held.gap[i]) if held is not None else None,
            "measured_lost_model_in_bf16_too": float(both.lost[i]) if both is not None else None,
        })
    return {"records": records, "bf16_limits": bf16}


def run(ctx: RunContext) -> dict:
    if ctx.kappa != 1:
        raise UserError("precision compares dtypes at the spec's batch; drop --kappa/--batch-size")
    cfg = config_of(ctx.spec, int(ctx.seed))
    console = wide_console(quiet=ctx.quiet)
    out = Path(ctx.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: thread hand-offs cost more than they bring
    try:
        with console.status(f"precision: {cfg.steps} steps × {len(cfg.dtypes) + 1} runs × {cfg.repeats} repeats"):
            runs = study(cfg)
    finally:
        torch.set_num_threads(threads)
    summary = summarize(cfg, runs)
    wall = time.perf_counter() - start
    payload = {"experiment": ctx.spec["name"], "preset": ctx.preset, "wall_time_s": round(wall, 2),
               "config": cfg.__dict__ | {"momenta": list(cfg.momenta), "dtypes": list(cfg.dtypes)},
               "samples_seen": cfg.steps * cfg.batch, "ema_update": "ζ.lerp_(θ, 1 − ρ) in the held dtype",
               "second_fp32_runs": SECOND_RUNS} | summary
    atomic_write_text(out / "results.json", json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
    atomic_write_bytes(out / "figures" / "precision.png", figure(cfg, summary))
    print_and_save(console, [table(summary), limits_table(summary)], out / "table.txt")
    console.print(f"precision: {wall:.1f} s; results in {out}/")
    return payload


def _e(v) -> str:
    return "—" if v is None else f"{v:.2e}"


def _f3(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def table(summary: dict) -> Table:
    t = Table(title="MaxAbsDiff against the FP32 reference (mean ± std over repeats); EMA updates lost = "
                    "share of due updates (θ ≠ ζ) that left ζ unchanged", title_justify="left")
    for c in ("run", "ρ", "EMA MaxAbsDiff", "relative", "target MaxAbsDiff", "EMA updates lost", "frozen steps"):
        t.add_column(c, justify="left" if c == "run" else "right")
    runs = list(dict.fromkeys(r["run"] for r in summary["records"]))
    for name in runs:
        rows = [r for r in summary["records"] if r["run"] == name]
        for n, r in enumerate(rows):
            t.add_row(name if n == 0 else "", f"{r['momentum']:g}",
                      f"{_e(r['ema_maxabsdiff'])} ± {r['ema_maxabsdiff_std']:.1e}",
                      f"{r['ema_maxabsdiff_relative']:.3f}",
                      f"{_e(r['target_maxabsdiff'])} ± {r['target_maxabsdiff_std']:.1e}",
                      f"{r['ema_updates_lost']:.3f}", f"{r['ema_frozen_steps']:.3f}", end_section=n == len(rows) - 1)
    return t


def limits_table(summary: dict) -> Table:
    t = Table(title="bfloat16 EMA: an increment (1−ρ)(θ−ζ) is lost when (1−ρ)·r is under half an ulp, 2^-9…2^-8 "
                    "of |ζ| (r = |θ−ζ|/|ζ|); `emarule limits --dtype bfloat16 --relative-gap r` gives κ_update",
              title_justify="left")
    for c in ("ρ", "r (fp32 run)", "(1−ρ)·r", "κ_update at r", "lost at κ=1?", "bf16_ema: lost", "bf16_ema: r",
              "bf16_ema: (1−ρ)·r", "bf16: lost"):
        t.add_column(c, justify="right")
    for b in summary["bf16_limits"]:
        t.add_row(f"{b['momentum']:g}", _e(b["fp32_relative_gap"]), _e(b["step_times_gap"]), _e(b["kappa_update"]),
                  "yes" if b["predicted_lost_at_kappa_1"] else "no",
                  _f3(b["measured_lost"]), _e(b["bf16_relative_gap"]),
                  _e(b["bf16_step_times_gap"]),
                  _f3(b["measured_lost_model_in_bf16_too"]))
    return t


def figure(cfg: Config, summary: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"bf16": "tab:blue", "fp16": "tab:red", "bf16_ema": "tab:cyan", "fp16_ema": "tab:orange",
               "fp32_reorder": "black", "fp32_seed": "tab:gray"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name in dict.fromkeys(r["run"] for r in summary["records"]):
        rows = [r for r in summary["records"] if r["run"] == name]
        x = [1 - r["momentum"] for r in rows]
        c = colours.get(name, None)
        ema = [max(r["ema_maxabsdiff"], FLOOR) for r in rows]  # a log axis: exact zeros sit on the floor
        low = [min(r["ema_maxabsdiff_std"], e - FLOOR * 0.5) for r, e in zip(rows, ema, strict=True)]
        axes[0].errorbar(x, ema, yerr=[low, [r["ema_maxabsdiff_std"] for r in rows]], color=c, marker="o", ms=3,
                         capsize=2, label=f"{name} EMA")
        if not name.endswith("_ema"):  # the target of an EMA-only run is the fp32 model itself
            axes[0].plot(x, [max(r["target_maxabsdiff"], FLOOR) for r in rows], color=c, ls=":", lw=1,
                         label=f"{name} target")
        axes[1].plot(x, [r["ema_updates_lost"] for r in rows], color=c, marker="o", ms=3, label=name)
    for ax in axes:
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("1 − ρ")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("MaxAbsDiff against FP32")
    axes[0].set_title(f"final weights after {cfg.steps * cfg.batch:,} samples ({cfg.repeats} repeats)", fontsize=9)
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].set_ylabel("share of due EMA updates lost")
    axes[1].set_ylim(-0.02, 1.02)
    axes[1].set_title("EMA updates that left ζ unchanged", fontsize=9)
    axes[1].legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
