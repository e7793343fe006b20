"""A sweep family's figure in the paper's style: the EMA-dependent metric beside the target model's.

Every κ is overlaid on one axis per metric, against epochs (or reference steps: units seen / the base batch),
the same clock at every κ. The κ=1 baseline is black and dashed, runs with the EMA Scaling Rule blue and runs
without it red, darker for larger κ; each line is the mean over seeds with a band of ± one standard deviation.
A sparse curve (evaluations, not per-step losses) has a marker at each point, so that a setting evaluated once
is a point: a small filled dot for the baseline, hollow and larger for the others (a square with the rule, a
triangle without), so that settings that coincide stay visible. Side by side the two panels separate an EMA
failure (left strays, right tracks) from an optimizer-rule one (both stray). A metric measured once on each
finished run (the final teachers' converged probe) gets a panel of its own: a column per setting.
"""

from __future__ import annotations

import math
from pathlib import Path

from emarule.analysis.compare import mean_curve
from emarule.engine.rundir import atomic_write_bytes, png_bytes

COLORMAPS = {"with": "Blues", "without": "Reds", "linear": "Purples"}
ARM_COLORMAPS = ("Greens", "Oranges", "Greys", "YlOrBr")  # a reproduction's arms, in the family's order
LABELS = {"with": "with EMA rule", "without": "without EMA rule", "linear": "linear EMA rule"}


def reference_steps_per_epoch(run) -> float:
    """Units in one epoch / the base batch: epochs → κ=1 steps (the speech figures' x-axis)."""
    h = run.hparams
    measure = h.get("epoch_measure") or h.get("dataset_size")
    base = ((h.get("hyperparameters") or {}).get("batch_size") or {}).get("base")
    return float(measure) / float(base) if measure and base else 1.0


def momentum_text(rho: float) -> str:
    """ρ with 3 significant digits of 1 − ρ, so that momenta near 1 stay apart: 0.99995, 0.9998, 0.9224."""
    if not 0 < 1 - rho < 1:
        return f"{rho:g}"
    digits = 2 - math.floor(math.log10(1 - rho))
    return f"{rho:.{digits}f}".rstrip("0").rstrip(".")


def panel_momentum(run, metric: str) -> float | None:
    """The scaled momentum of the EMA a panel shows: `ema.momentum/0.9` for `ema_wer/0.9`, else the main one."""
    if "/" in metric:
        suffix = metric.split("/", 1)[1]
        try:
            return float(run.hparams["hyperparameters"][f"ema.momentum/{suffix}"]["scaled"])
        except (ValueError, KeyError, TypeError):
            pass
    return run.ema_momentum


MARKED = 60  # curves with at most this many points (evaluations, not per-step losses) get a marker at each
MARKERS = {"baseline": ("o", 4), "with": ("s", 7), "without": ("^", 9), "linear": ("D", 7)}


def marker(n: int, rule: str) -> dict:
    if n > MARKED:
        return {}
    shape, size = MARKERS.get(rule, ("v", 8))
    return {"marker": shape, "ms": size} | ({} if rule == "baseline" else {"mfc": "none", "mew": 1.4})


def shades(n: int) -> list[float]:
    """Colormap positions for n κ values, light to dark."""
    return [0.75] if n <= 1 else [0.45 + 0.5 * i / (n - 1) for i in range(n)]


def _curve(ax, xs, mean, std, color, alpha: float, **line) -> None:
    """A mean over seeds, with a band of ± one standard deviation where the seeds differ."""
    ax.plot(xs, mean, color=color, **line)
    if len(xs) and any(s > 0 for s in std):
        ax.fill_between(xs, [m - s for m, s in zip(mean, std, strict=True)],
                        [m + s for m, s in zip(mean, std, strict=True)], color=color, alpha=alpha, lw=0)


def _style(family, rule: str, k: float, pos: dict) -> tuple:
    """(colour, label) of a setting that is not the baseline: the rule's colour map, darker for larger κ,
    or an arm's own map in the family's order."""
    import matplotlib.pyplot as plt

    if rule in COLORMAPS:
        return plt.get_cmap(COLORMAPS[rule])(pos.get(k, 0.75)), f"κ={k:g} {LABELS[rule]}"
    names = [a.name for a in getattr(family, "arms", ())]
    j = names.index(rule) if rule in names else 0
    return plt.get_cmap(ARM_COLORMAPS[j % len(ARM_COLORMAPS)])(0.75), f"κ={k:g} arm {rule}"


def _finals(ax, family, metric, table: dict, pos: dict) -> None:
    """A metric measured once on each finished run (`Metric.file`): one column per setting, each seed's
    value a dot and the mean over seeds a bar with ± one standard deviation."""
    labels = []
    for i, ((rule, k), row) in enumerate(table["rows"].items()):
        values = [c[1][0] for c in row["curves"] if c[1]]
        color, label = ("k", "κ=1 baseline") if rule == "baseline" else _style(family, rule, k, pos)
        labels.append(f"{label} (n={len(values)})")
        if not values:
            continue
        m = sum(values) / len(values)
        sd = (sum((v - m) ** 2 for v in values) / len(values)) ** 0.5
        ax.bar(i, m, width=0.6, color=color, alpha=0.35, yerr=sd, capsize=4)
        ax.plot([i] * len(values), values, "o", color=color, ms=4)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(f"{metric.name}: the final teachers, each seed a dot", fontsize=9)
    ax.set_ylabel(metric.label)
    ax.grid(alpha=0.3, axis="y")


def plot(family, measured: dict, runs: list, out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    base_runs = [r for r in runs if r.is_baseline]
    scale = reference_steps_per_epoch(base_runs[0]) if family.x_axis == "reference steps" and base_runs else 1.0
    kappas = measured["kappas"]
    pos = dict(zip(kappas, shades(len(kappas)), strict=True))
    metrics = [t["metric"] for t in measured["tables"].values()]  # named and labelled for the runs' spec
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.0 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        table = measured["tables"][metric.name]
        if metric.file:
            _finals(ax, family, metric, table, pos)
            continue
        bx, bm, bs = table["baseline"]
        n_base = len(table["rows"][("baseline", 1.0)]["curves"])
        rho_b = panel_momentum(base_runs[0], metric.name) if base_runs else None
        _curve(ax, [x * scale for x in bx], bm, bs, "k", 0.12, ls="--", lw=1.6, zorder=5, **marker(len(bx), "baseline"),
               label="κ=1 baseline" + (f", ρ={momentum_text(rho_b)}" if rho_b is not None else "") + f" (n={n_base})")
        for (rule, k), row in table["rows"].items():
            if rule == "baseline":
                continue
            arm = rule not in COLORMAPS
            color, label = _style(family, rule, k, pos)
            xs, mean, std = mean_curve(row["curves"])
            if not xs:
                continue
            first = None if arm else next((r for r in runs if r.kappa == k and r.rule_label == rule), None)
            rho = panel_momentum(first, metric.name) if first else None
            label = (label + (f", ρ={momentum_text(rho)}" if rho is not None else "")
                     + (f", progressive {first.progressive}" if first and first.progressive else ""))
            _curve(ax, [x * scale for x in xs], mean, std, color, 0.18, lw=1.5, **marker(len(xs), rule),
                   label=f"{label} (n={len(row['curves'])})")
        smooth = f" (trailing mean over {metric.smooth_epochs:g} epoch)" if metric.smooth_epochs else ""
        ax.set_title(f"{metric.name}: {'EMA-dependent' if metric.depends_on_ema else 'target model, EMA-blind'}"
                     + smooth, fontsize=9)
        ax.set_xlabel(family.x_axis)
        ax.set_ylabel(metric.label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write_bytes(Path(out), png_bytes(fig, dpi=120))
    return Path(out)
