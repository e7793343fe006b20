"""`emarule run precision`: the numerical-stability appendix (linear regression + Polyak-Ruppert EMA).

Writes into the run directory, each file atomically:
    results.json   per (run, ρ): MaxAbsDiff against FP32 of the EMA and target weights (mean and
                   spread over repeats), the share of due EMA updates that were lost, and, per ρ,
                   what `emarule limits` predicts for a bfloat16 EMA at the measured relative gap
    table.txt      the terminal table
    figures/precision.png

The study: SGD on linear regression with a Polyak-Ruppert EMA, the model
and EMA weights held in float32, bfloat16 and float16, compared with a float32 reference.

Besides runs with both model and EMA in a dtype, `<dtype>_ema` runs keep the model in float32 and
only the EMA in the dtype, which separates the EMA's rounding from the model's.

Every run sees the same data, the same initial weights and (except `fp32_seed`) the same
minibatches. Forward, backward, the SGD step and the EMA step all run in the held dtype; the EMA
step is ζ.lerp_(θ, 1 − ρ), the update `emarule.engine.ema.ModelEma` applies, whose weight 1 − ρ stays a
float32 scalar, so ρ itself is never rounded to the held dtype: an update is lost only when the
increment (1 − ρ)(θ − ζ) falls under half a unit in the last place of ζ.

Two "second FP32 runs" give the scale below which a difference means nothing:
- fp32_reorder: identical, except that each minibatch's gradient sums its samples in the reverse
  order, so the runs differ from the first rounding on. This is what a second FP32 run of the same
  seed gives on a GPU, whose reductions are not ordered; it is the floor for "the same run".
- fp32_seed: the minibatches come in another order; the run-to-run spread of training itself.

Repeats are independent regressions (data, w*, init, order) trained side by side as a batch.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.console import print_and_save, wide_console
from emarule.engine.rundir import atomic_write_bytes, atomic_write_text, png_bytes
from emarule.scaling.limits import FORMATS, limits
from emarule.config.typed import Section

FLOOR = 1e-12
SECOND_RUNS = {
    "fp32_reorder": "FP32 again, each minibatch gradient summed in reverse order: differs from the first "
                    "rounding on, as a second run of one seed on a GPU does (the floor for 'same run')",
    "fp32_seed": "FP32 again with another minibatch order: the run-to-run spread of training itself",
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Config:
    features: int = 64
    samples: int = 4096
    steps: int = 2000
    batch: int = 64
    lr: float = 0.01
    noise: float = 0.1
    init_std: float = 0.0
    momenta: tuple = (0.9, 0.99, 0.999, 0.9999, 0.99999)
    dtypes: tuple = ("fp32", "bf16", "fp16")
    repeats: int = 5
    seed: int = 0


@dataclass
class Run:
    """Final weights and per-step bookkeeping of one training run (all repeats)."""

    theta: torch.Tensor  # (repeats, F), float32 copy of the final target weights
    zeta: torch.Tensor  # (momenta, repeats, F), float32 copy of the final EMA weights
    lost: torch.Tensor  # (momenta,) fraction of due EMA updates (θ ≠ ζ) that left the weight unchanged
    frozen_steps: torch.Tensor  # (momenta,) fraction of steps at which updates were due and none moved ζ
    gap: torch.Tensor  # (momenta,) median |θ − ζ|/|ζ| over the due updates of the second half


def problem(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.repeats, cfg.samples, cfg.features, generator=g)
    w_true = torch.randn(cfg.repeats, cfg.features, generator=g)
    y = torch.einsum("rnf,rf->rn", x, w_true) + cfg.noise * torch.randn(cfg.repeats, cfg.samples, generator=g)
    theta0 = cfg.init_std * torch.randn(cfg.repeats, cfg.features, generator=g)
    return x, y, theta0


def batches(cfg: Config, order_seed: int) -> torch.Tensor:
    """(steps, repeats, batch) sample indices: epochs of shuffles, drawn once and shared by runs."""
    g = torch.Generator().manual_seed(order_seed)
    per_epoch = cfg.samples // cfg.batch
    epochs = -(-cfg.steps // per_epoch)
    perms = torch.stack([torch.stack([torch.randperm(cfg.samples, generator=g) for _ in range(cfg.repeats)])
                         for _ in range(epochs)])  # (epochs, repeats, samples)
    idx = perms[:, :, : per_epoch * cfg.batch].reshape(epochs, cfg.repeats, per_epoch, cfg.batch)
    return idx.permute(0, 2, 1, 3).reshape(epochs * per_epoch, cfg.repeats, cfg.batch)[: cfg.steps]


CHUNK = 512  # steps whose EMA history is kept, then counted (lost updates, gaps) in one go


def train(cfg: Config, dtype: str, order: torch.Tensor, data, reverse: bool = False,
          ema_dtype: str | None = None) -> Run:
    """The model in `dtype` and its EMA in `ema_dtype` (default: the same)."""
    e = ema_dtype or dtype
    return train_emas(cfg, dtype, order, data, (e,), reverse)[e]


def _products(xb_shape):
    """(forward, gradient): the two batched products of a step, "rbf,rf->rb" and "rbf,rb->rf".

    torch.einsum computes each as one torch.bmm on these very views (same strides, so the same floats);
    calling bmm directly skips its parsing and permutes, about 15 µs of a product's 40. Where a dimension has
    size 1 einsum takes other routes (a multiply, other strides), so those shapes keep einsum itself."""
    if min(xb_shape) > 1:
        return (lambda xb, theta: torch.bmm(xb, theta.unsqueeze(-1)).squeeze(-1),
                lambda xb, residual: torch.bmm(xb.transpose(1, 2), residual.unsqueeze(-1)).squeeze(-1))
    return (lambda xb, theta: torch.einsum("rbf,rf->rb", xb, theta),
            lambda xb, residual: torch.einsum("rbf,rb->rf", xb, residual))


class _Ema:
    """The EMAs (one per momentum) of one model held in one dtype, and their bookkeeping.

    A step only lerps and stores ζ; what the bookkeeping needs of a step (ζ before and after, the target) is
    kept for up to CHUNK steps and counted at once. Every comparison and every float of the relative gap is
    the same elementwise op as counted step by step; the counts are integers, exact in float64 whatever the
    order they are summed in, and the gaps land in the columns a step-by-step torch.cat would give them."""

    def __init__(self, cfg: Config, dtype: torch.dtype, theta: torch.Tensor):
        m = len(cfg.momenta)
        self.weights = [1.0 - float(r) for r in cfg.momenta]  # a float32 scalar in the lerp: ρ is never rounded
        self.zeta = theta.to(dtype).unsqueeze(0).repeat(m, 1, 1)
        self.rows = list(self.zeta)  # ζ of each momentum: views made once, not every step
        self.history = self.zeta.new_empty((CHUNK + 1, *self.zeta.shape))  # ζ before step j at j, after at j + 1
        self.targets = self.zeta.new_empty((CHUNK, *theta.shape))
        self.due_n, self.lost_n, self.frozen = (torch.zeros(m, dtype=torch.float64) for _ in range(3))
        self.half, self.width = cfg.steps // 2, theta.numel()
        self.gaps = torch.empty(m, (cfg.steps - self.half) * self.width)

    def start(self):
        self.history[0].copy_(self.zeta)

    def step(self, j: int, theta: torch.Tensor):
        target = self.targets[j]
        target.copy_(theta)  # = theta.to(dtype): lerp needs one dtype, as in emarule.engine.ema
        for zeta, w in zip(self.rows, self.weights, strict=True):
            zeta.lerp_(target, w)
        self.history[j + 1].copy_(self.zeta)

    def count(self, first: int, n: int):
        """Book steps first … first + n − 1, the last n steps taken."""
        before, target = self.history[:n], self.targets[:n, None]
        due = (before != target).flatten(2)  # (n, momenta, repeats·F)
        lost = (self.history[1 : n + 1] == before).flatten(2) & due
        self.due_n += due.sum(dim=(0, 2))
        self.lost_n += lost.sum(dim=(0, 2))
        self.frozen += (due.any(dim=2) & ~(due & ~lost).any(dim=2)).sum(dim=0)  # steps due and frozen
        k = max(self.half - first, 0)  # the relative gap is taken over the second half of the steps
        if k < n:
            b = before[k:].float()
            rel = ((target[k:].float() - b).abs() / b.abs().clamp_min(1e-30)).flatten(2)
            cols = self.gaps.view(len(self.weights), -1, self.width)[:, first + k - self.half : first + n - self.half]
            cols.copy_(torch.where(due[k:], rel, torch.nan).transpose(0, 1))

    def run(self, cfg: Config, theta: torch.Tensor) -> Run:
        # a median is one of the values (the lower middle one), so row by row gives the same as nanmedian(dim=1),
        # a third faster on rows of millions
        gap = torch.stack([row.nanmedian() for row in self.gaps])
        lost = self.lost_n / self.due_n.clamp_min(1)
        return Run(theta.float(), self.zeta.float(), lost, self.frozen / cfg.steps, gap)


def train_emas(cfg: Config, dtype: str, order: torch.Tensor, data, ema_dtypes, reverse: bool = False) -> dict:
    """{EMA dtype: Run}: one model in `dtype`, trained once, carrying its EMAs in each of `ema_dtypes`. The
    model's steps do not depend on its EMAs, so each Run is bit for bit `train(…, ema_dtype=that dtype)`."""
    d = DTYPES[dtype]
    x, y, theta0 = data
    repeats, samples, features = x.shape
    # x[rows, idx] as index_select of rows r·samples + i of the flattened data: the same copy, twice as fast
    x, y = x.to(d).reshape(-1, features), y.to(d).reshape(-1)
    offsets = torch.arange(repeats)[:, None] * samples
    theta = theta0.to(d).clone()
    forward, gradient = _products((repeats, cfg.batch, features))
    emas = {e: _Ema(cfg, DTYPES[e], theta) for e in ema_dtypes}
    for first in range(0, cfg.steps, CHUNK):
        idx = order[first : first + CHUNK]  # (n, repeats, batch)
        rows = ((idx.flip(-1) if reverse else idx) + offsets).flatten(1)
        for ema in emas.values():
            ema.start()
        for j, r in enumerate(rows):
            xb, yb = x.index_select(0, r).view(repeats, -1, features), y.index_select(0, r).view(repeats, -1)
            residual = forward(xb, theta) - yb
            theta.add_(gradient(xb, residual), alpha=-cfg.lr / cfg.batch)
            for ema in emas.values():
                ema.step(j, theta)
        for ema in emas.values():
            ema.count(first, len(rows))
    return {e: ema.run(cfg, theta) for e, ema in emas.items()}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max_i |a_i − b_i| over the weights of each repeat: (..., repeats, F) → (..., repeats)."""
    return (a - b).abs().amax(dim=-1)


def study(cfg: Config) -> dict:
    """{run name: Run}: the fp32 reference; for each other dtype the model and EMA held in it, and
    an fp32 model whose EMA alone is held in it (`<dtype>_ema`); the two second FP32 runs."""
    data = problem(cfg)
    order = batches(cfg, cfg.seed + 1)
    # the `<dtype>_ema` runs' model is the fp32 run's model, step for step: train it once, with every EMA
    fp32 = train_emas(cfg, "fp32", order, data, dict.fromkeys(("fp32", *cfg.dtypes)))
    runs = {"fp32": fp32["fp32"]}
    for dt in cfg.dtypes:
        if dt != "fp32":
            runs[dt] = train(cfg, dt, order, data)
            runs[f"{dt}_ema"] = fp32[dt]
    runs["fp32_reorder"] = train(cfg, "fp32", order, data, reverse=True)
    runs["fp32_seed"] = train(cfg, "fp32", batches(cfg, cfg.seed + 2), data)
    return runs


def config_of(typed_cfg: Section, seed: int) -> Config:
    """The study's settings from the run's typed config (`ctx.cfg`)."""
    sec = typed_cfg.precision_study
    steps, lr, batch = typed_cfg.schedule.total_steps, typed_cfg.optimizer.lr, typed_cfg.batch.size
    if not steps or not lr or not batch or float(batch) != int(batch):
        raise UserError("precision: the spec needs schedule.total_steps, optimizer.lr and a whole batch.size")
    if int(batch) > int(sec.samples):
        raise UserError(f"precision: batch.size {batch} exceeds precision_study.samples {sec.samples}")
    if "fp32" not in sec.dtypes:
        raise UserError("precision_study.dtypes must include fp32, the reference")
    return Config(features=int(sec.features), samples=int(sec.samples), steps=int(steps), batch=int(batch),
                  lr=float(lr), noise=float(sec.noise), init_std=float(sec.init_std),
                  momenta=tuple(float(m) for m in sec.momenta), dtypes=tuple(sec.dtypes),
                  repeats=int(sec.repeats), seed=int(sec.seed) + seed)


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
    cfg = config_of(ctx.cfg, int(ctx.seed))
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
    payload = {"experiment": ctx.cfg.name, "preset": ctx.preset, "wall_time_s": round(wall, 2),
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
    return png_bytes(fig, dpi=120, bbox_inches="tight")
