"""Fig. 1a/1b of the paper for every (ρ_B, D), one row per EMA convention, and a summary.

Colours follow the paper: baseline black dashed, with the EMA Scaling Rule blue, without it
red, target model orange; the linear rule 1 − κ(1 − ρ_B) green and ρ* black.
"""

from __future__ import annotations


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RULE, NO_RULE, LINEAR, STAR, TARGET = "tab:blue", "tab:red", "tab:green", "black", "tab:orange"
# A title's height given (the default's): matplotlib otherwise searches every axis for top tick labels to clear
# on each draw, a third of the drawing time here; these axes have none, so the titles sit where they did.
TITLE = {"fontsize": 9, "y": 1.0}


def png(fig) -> bytes:
    from emarule.engine.rundir import png_bytes

    return png_bytes(fig, dpi=110)


def _fixed_layout(fig, left=0.8, right=0.15, bottom=0.5, top=0.5, wspace=0.85, hspace=0.45) -> None:
    """Margins and gaps in inches, set once: constrained layout measured every text artist on each save,
    half of the time these figures took. The gaps hold a column's y label and tick labels (log-scale
    ones too) and a row's title, at the sizes used here."""
    w, h = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    aw = (w - left - right - wspace * (cols - 1)) / cols
    ah = (h - bottom - top - hspace * (rows - 1)) / rows
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, wspace=wspace / aw,
                        hspace=hspace / ah)


def _thin(t, y, points: int = 1500):
    """Every k-th point, the last one kept: 10⁴-step curves drawn at a fraction of the cost."""
    k = max(1, len(t) // points)
    idx = list(range(0, len(t), k))
    if idx[-1] != len(t) - 1:
        idx.append(len(t) - 1)
    return [t[i] for i in idx], [y[i] for i in idx]


def _ylabel(dim: int) -> str:
    return "ζ" if dim == 1 else "‖ζ‖"


def trajectories(curves: dict, rho_base: float, dim: int, conventions, kappas, lr: float) -> bytes:
    """Fig. 1a: one simulated run of the EMA at each κ against the baseline, on the shared time axis."""
    kappas = [k for k in kappas if (conventions[0], k) in curves]
    fig, axes = plt.subplots(len(conventions), max(1, len(kappas)), figsize=(4.2 * max(1, len(kappas)),
                                                                             3.0 * len(conventions)),
                             squeeze=False, sharex=True)
    _fixed_layout(fig, wspace=0.7, hspace=0.35)
    for i, conv in enumerate(conventions):
        base = curves[(conv, 1)]
        for j, k in enumerate(kappas):
            ax = axes[i][j]
            c = curves[(conv, k)]
            ax.plot(*_thin(base["t"], base["base"]), "k--", lw=1.2, label="κ=1 (baseline)", zorder=3)
            ax.plot(*_thin(c["t"], c["rule"]), color=RULE, lw=1.2, label=f"κ={k}, ρ=ρ_B^κ")
            ax.plot(*_thin(c["t"], c["no_rule"]), color=NO_RULE, lw=1.2, label=f"κ={k}, ρ=ρ_B")
            ax.set_title(f"κ={k}, {conv} EMA", **TITLE)
            ax.set_ylabel(_ylabel(dim))
            if i == len(conventions) - 1:
                ax.set_xlabel("time t (samples seen / B × η_B, units of T)")
            ax.legend(fontsize=7)
    fig.suptitle(f"EMA trajectories, ρ_B={rho_base:g}, η_B={lr:g}, D={dim} (one run)", fontsize=10)
    return png(fig)


def momenta_and_errors(records: list, rho_base: float, dim: int, conventions) -> bytes:
    """Fig. 1b: the momentum choices against κ (left) and their approximation errors (middle); on the
    right ρ* and the linear form as (1 − ρ)/(1 − ρ_B^κ), where a ρ* above the rule shows below 1
    (ρ_B itself sits at ≈ 1/κ there and is left out)."""
    fig, axes = plt.subplots(len(conventions), 3, figsize=(15, 3.4 * len(conventions)), squeeze=False)
    _fixed_layout(fig, hspace=0.55)
    for i, conv in enumerate(conventions):
        rows = sorted((r for r in records if r["convention"] == conv), key=lambda r: r["kappa"])
        k = [r["kappa"] for r in rows]
        lin = [(r["kappa"], 1 - r["kappa"] * (1 - rho_base)) for r in rows if r["err_linear"] is not None]
        ax = axes[i][0]
        ax.plot(k, [r["rho_rule"] for r in rows], "o-", color=RULE, ms=3, label="ρ_B^κ (EMA Scaling Rule)")
        ax.plot(k, [rho_base] * len(k), "o-", color=NO_RULE, ms=3, label="ρ_B (no rule)")
        if lin:
            ax.plot(*zip(*lin, strict=True), "o-", color=LINEAR, ms=3, label="1 − κ(1 − ρ_B)")
        ax.plot(k, [r["rho_star"] for r in rows], "x", color=STAR, ms=6, label="ρ* (optimal)")
        ax.set_xscale("log", base=2)
        ax.set_ylabel("momentum ρ")
        ax.set_title(f"momenta, {conv} EMA", **TITLE)
        ax.legend(fontsize=7)
        ax = axes[i][1]
        for key, colour, style, label in (("err_rule", RULE, "o-", "ρ_B^κ"), ("err_no_rule", NO_RULE, "o-", "ρ_B"),
                                          ("err_linear", LINEAR, "o-", "1 − κ(1 − ρ_B)"),
                                          ("err_star", STAR, "x--",
                                           "ρ* (exact moments)" if dim == 1 else "ρ* (hold-out seeds)"),
                                          ("err_target", TARGET, "s-", "target model θ")):
            pts = [(r["kappa"], r[key]) for r in rows if r[key] is not None and r[key] > 0]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=colour, ms=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel(f"Err (max_t |E g(ζ) − E g(ζ̂)|), g = {'ζ' if dim == 1 else '‖·‖'}")
        ax.set_title(f"approximation error, {conv} EMA", **TITLE)
        ax.legend(fontsize=7)
        ax = axes[i][2]
        rule_beta = [1 - r["rho_rule"] for r in rows]
        ax.plot(k, [1.0] * len(k), "-", color=RULE, label="ρ_B^κ")
        if lin:
            ax.plot([kk for kk, _ in lin], [(1 - v) / (1 - rho_base**kk) for kk, v in lin], "o-", color=LINEAR,
                    ms=3, label="1 − κ(1 − ρ_B)")
        star = [(1 - r["rho_star"]) / b for r, b in zip(rows, rule_beta, strict=True)]
        ax.plot(k, star, "x-", color=STAR, ms=6, label="ρ*")
        ax.set_xscale("log", base=2)
        ax.set_ylabel("(1 − ρ) / (1 − ρ_B^κ)")
        ax.set_title(f"relative to the rule, {conv} EMA", **TITLE)
        ax.legend(fontsize=7)
        if i == len(conventions) - 1:
            for ax in axes[i]:
                ax.set_xlabel("scaling κ")
    fig.suptitle(f"ρ_B={rho_base:g}, D={dim}", fontsize=10)
    return png(fig)


def summary(records: list, rho_main: float, conventions) -> bytes:
    """The rule's error against κ for every base momentum (D=1, left) and dimension (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    _fixed_layout(fig, top=0.3, wspace=0.3)
    styles = {c: s for c, s in zip(conventions, ("-", "--"), strict=False)}
    bases = sorted({r["rho_base"] for r in records if r["dim"] == 1}, reverse=True)
    dims = sorted({r["dim"] for r in records if r["rho_base"] == rho_main})
    for ax, groups, label in ((axes[0], [(b, 1) for b in bases], "ρ_B={:g}"),
                              (axes[1], [(rho_main, d) for d in dims], "D={}")):
        for n, (b, d) in enumerate(groups):
            colour = plt.get_cmap("viridis")(n / max(1, len(groups) - 1))
            for conv in conventions:
                rows = sorted((r for r in records if (r["rho_base"], r["dim"], r["convention"]) == (b, d, conv)
                               and r["err_rule"]), key=lambda r: r["kappa"])
                name = label.format(b if label.startswith("ρ") else d)
                ax.plot([r["kappa"] for r in rows], [r["err_rule"] for r in rows], styles[conv], color=colour,
                        marker="o", ms=3, label=f"{name}, {conv}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("scaling κ")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("Err of the EMA Scaling Rule ρ_B^κ")
    axes[0].set_title("D=1, by base momentum", **TITLE)
    axes[1].set_title(f"ρ_B={rho_main:g}, by dimension", **TITLE)
    return png(fig)
