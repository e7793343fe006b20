"""`emarule compare`: overlay runs against the κ=1 baseline and measure how far each one strays.

Reads what `emarule run` writes in each run directory — `hparams.json` (experiment, kappa,
ema_rule, seed, progressive, dataset_size) and `metrics.jsonl` (rows with samples_seen, epoch and
metric values) — and

- plots one metric against epochs (samples seen / training-set size) in the style of the paper's
  Fig. 5: one panel per κ, the κ=1 baseline black dashed, runs with the EMA Scaling Rule blue,
  without it red (linear rule purple, Progressive Scaling green/orange), mean ± std bands when
  several seeds share a setting; the PNG is written atomically;
- reports each run's gap to the baseline: the baseline curve (the mean over its seeds) is the
  reference grid; a run is linearly interpolated onto the grid points inside the range both
  cover, and max |Δ| and mean |Δ| are taken there; Δ final is the difference at the last such
  point. A run whose log ends before its planned end (it diverged, was killed, or still trains) or
  whose metric went non-finite has an infinite gap: measured on the shared epochs only, it would look
  like a match. Each run's last epoch is reported with its final value.

Pure Python + numpy + matplotlib: no torch, so it runs anywhere the run directories are.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from emarule.errors import UserError
from emarule.engine.context import progressive_label, rule_names, rule_of_hparams
from emarule.engine.rundir import CHECKPOINT, HPARAMS, METRICS, atomic_write_bytes, jsonable, numbered_rows, png_bytes
from emarule.registry import preferred_metrics

# Row keys that are clocks or settings, not metrics (also with a `/suffix`: `ema_momentum/0.9999`).
NOT_METRICS = {"kind", "samples_seen", "seconds_seen", "epoch", "step", "kappa", "batch_size", "accumulation", "lr",
               "ema_momentum", "samples_per_s", "wall_s", "data_wait_s", "stage", "world_size"}


def is_metric(key: str) -> bool:
    return key.split("/", 1)[0] not in NOT_METRICS
# The EMA-dependent metric first: the paper's figures compare what the EMA rule acts on.

COLORS = {"with": "tab:blue", "without": "tab:red", "linear": "tab:purple"}
PROGRESSIVE_COLORS = ("tab:green", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


@dataclass
class Run:
    path: Path
    experiment: str
    kappa: float
    rule: str | None  # "exponential", "linear" or None (no EMA rule)
    seed: int | None
    progressive: str | None  # e.g. "step30", None when constant
    batch_size: float | None
    ema_momentum: float | None
    rows: list = field(default_factory=list)
    dataset_size: float | None = None
    hparams: dict = field(default_factory=dict)  # hparams.json as read, for what the fields above leave out
    arm: str | None = None  # a reproduction's arm (`...-arm-<name>-s<seed>`): a setting of its own
    # A comparison asks for a run's curve and ending several times; its rows never change once read.
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_baseline(self) -> bool:
        return math.isclose(self.kappa, 1.0)  # Progressive Scaling to κ=1 changes nothing

    @property
    def rule_label(self) -> str:
        return "baseline" if self.is_baseline else rule_names(self.rule).word

    @property
    def group(self) -> tuple:
        return ("baseline",) if self.is_baseline else (self.kappa, self.rule_label, self.progressive, self.arm)

    def group_label(self) -> str:
        if self.is_baseline:
            return "κ=1 baseline"
        return (rule_names(self.rule).label + (f", progressive {self.progressive}" if self.progressive else "")
                + (f", arm {self.arm}" if self.arm else ""))

    def metrics(self) -> set[str]:
        out = set()
        for r in self.rows:
            for k, v in r.items():
                if is_metric(k) and finite_number(v) is not None:
                    out.add(k)
        return out

    def epoch_of(self, row: dict) -> float | None:
        x = finite_number(row.get("epoch"))
        if x is None and finite_number(row.get("samples_seen")) is not None and self.dataset_size:
            x = row["samples_seen"] / self.dataset_size
        return x

    def curve(self, metric: str) -> tuple[list[float], list[float]]:
        """(epochs, values) of the rows that carry `metric`, sorted, one value per time."""
        if ("curve", metric) not in self._memo:
            self._memo["curve", metric] = self._curve(metric)
        return self._memo["curve", metric]

    def _curve(self, metric: str) -> tuple[list[float], list[float]]:
        pts: dict[float, float] = {}
        for r in self.rows:
            v, x = finite_number(r.get(metric)), self.epoch_of(r)
            if v is not None and x is not None:
                pts[x] = v
        xs = sorted(pts)
        return xs, [pts[x] for x in xs]

    def ending(self, metric: str) -> dict:
        """How the run's `metric` ends: its last finite value `final` at `final_epoch` (where the curve ends),
        `nonfinite_epoch` (its first "nan"/"inf", a diverged run's; None without one) and `stopped_early` (the
        log ends before the run's planned end; None where hparams.json records no end)."""
        if ("ending", metric) not in self._memo:
            xs, ys = self.curve(metric)
            bad = [x for x in (self.epoch_of(r) for r in self.rows if r.get(metric) in DIVERGED) if x is not None]
            self._memo["ending", metric] = {"final": ys[-1] if ys else None, "final_epoch": xs[-1] if xs else None,
                                            "nonfinite_epoch": min(bad, default=None),
                                            "stopped_early": self.stopped_early()}
        return dict(self._memo["ending", metric])

    def stopped_early(self) -> bool | None:
        """Whether the log ends before the run's planned end (`total` in hparams.json, in the batch unit: samples,
        or seconds of audio, logged as `seconds_seen`): a run that diverged or is still training. None where the
        run does not record its end."""
        if "stopped_early" not in self._memo:
            total = finite_number(self.hparams.get("total"))
            unit = self.hparams.get("batch_unit") or "samples"
            seen = [x for x in (finite_number(r.get(f"{unit}_seen")) for r in self.rows) if x is not None]
            self._memo["stopped_early"] = None if total is None or not seen else max(seen) < total * (1 - 1e-9)
        return self._memo["stopped_early"]

    def incomplete(self, metric: str) -> str | None:
        """Why this run's gap cannot be measured ("stopped early", "nan from epoch 2"), None if it can."""
        end = self.ending(metric)
        if end["nonfinite_epoch"] is not None:
            return f"nan from epoch {end['nonfinite_epoch']:g}"
        return "stopped early" if end["stopped_early"] else None


def arm_of_name(name: str) -> str | None:
    """The arm a run belongs to, from the name `emarule.engine.context.default_run_name` gives it: an arm differs
    from a standard setting by --set or --progressive, so without this `compare` would pool the two."""
    m = re.search(r"-arm-([a-z0-9][a-z0-9-]*)-s\d+$", name)
    return m.group(1) if m else None


def finite_number(v) -> float | None:
    """A logged value as a float, or None for text, bools and the "nan"/"inf" strings a diverged run logs."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _scaled(h: dict, key: str) -> float | None:
    hp = h.get("hyperparameters") or (h.get("plan") or {}).get("hyperparameters") or {}
    v = hp.get(key)
    return finite_number(v.get("scaled")) if isinstance(v, dict) else None


def load_run(path: Path) -> Run:
    p = Path(path)
    if not p.exists():
        raise UserError(f"run directory not found: {p}; pass directories written by `emarule run` or `emarule sweep`")
    if not p.is_dir():
        raise UserError(f"{p} is not a directory; pass run directories (each holding {HPARAMS} and {METRICS})")
    hp_path = p / HPARAMS
    if not hp_path.is_file():
        raise UserError(f"{p} has no {HPARAMS}: not a run directory (or the run has not started); "
                        f"pass directories written by `emarule run` or `emarule sweep`")
    try:
        h = json.loads(hp_path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        raise UserError(f"{hp_path}: cannot read it as JSON ({e}); the run directory is damaged") from None
    if not isinstance(h, dict) or finite_number(h.get("kappa")) is None:
        raise UserError(f"{hp_path}: no numeric 'kappa'; was it written by `emarule run`?")
    experiment = h.get("experiment") or (h.get("plan") or {}).get("experiment")
    seed = h.get("seed")
    # What `emarule run` writes; anything else was edited, and would be compared under a wrong label.
    for key, bad in (("experiment", not isinstance(experiment, str)), ("kappa", h["kappa"] <= 0),
                     ("seed", seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)))):
        if bad:
            got = f"is {json.dumps(h[key])}" if key in h else "is missing"
            raise UserError(f"{hp_path}: {key!r} {got}, which `emarule run` never writes; the run directory is "
                            f"damaged (or the file was edited): run it again")
    if not (p / METRICS).exists() and (p / CHECKPOINT).exists():  # a run logs before its first checkpoint
        raise UserError(f"{p} has a checkpoint but no {METRICS}: the run directory is damaged; run it again")
    numbered = list(numbered_rows(p / METRICS, strict=True))
    numeric_metrics(p / METRICS, numbered)
    rows = [r for _, r in numbered]
    run = Run(path=p, experiment=experiment,
              kappa=float(h["kappa"]), rule=rule_of_hparams(h), seed=seed,
              progressive=progressive_label(h.get("progressive")), batch_size=_scaled(h, "batch_size"),
              ema_momentum=_scaled(h, "ema.momentum"), rows=rows, dataset_size=finite_number(h.get("dataset_size")),
              hparams=h, arm=arm_of_name(p.name))
    return run


DIVERGED = ("nan", "inf", "-inf")  # how `rundir.jsonable` logs a non-finite value: as text, never a JSON NaN


def numeric_metrics(path: Path, numbered: list[tuple[int, dict]]) -> None:
    """Every metric value is a number, null, or a diverged run's "nan"/"inf" text: any other value (a JSON
    NaN token, which emarule never writes, included) is damage that would otherwise drop out of the curve
    and show the previous evaluation as the final one."""
    for n, r in numbered:
        for k, v in r.items():
            ok = v is None or v in DIVERGED or (finite_number(v) is not None)
            if not ok and is_metric(k):
                raise UserError(f"{path}, line {n}: {k!r} is {json.dumps(v)}, not a number; the log is "
                                f"damaged: delete that line or run the run again")


def _run_subdirs(p: Path) -> list[Path]:
    try:
        return sorted(d for d in p.iterdir() if d.is_dir() and (d / HPARAMS).exists())
    except OSError:
        return []


def expand(paths: list[Path]) -> list[Path]:
    """Run directories as given; a directory without hparams.json stands for its run subdirectories.

    A sweep's root (ROOT/<experiment>/<run>) holds experiment folders, not runs: the error names them.
    The same run given twice (or reached twice) is compared once.
    """
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir() and not (p / HPARAMS).exists():
            subs = _run_subdirs(p)
            if subs:
                out.extend(subs)
                continue
            exps = [d for d in sorted(p.iterdir()) if d.is_dir() and _run_subdirs(d)] if os.access(p, os.R_OK) else []
            if exps:
                which = str(exps[0]) if len(exps) == 1 else "one of " + ", ".join(str(d) for d in exps)
                raise UserError(f"{p} holds experiment folders, not runs; pass {which}")
        out.append(p)
    seen, uniq = set(), []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    return uniq


def load_runs(paths: list[Path]) -> list[Run]:
    if not paths:
        raise UserError("no run directories given; e.g. `emarule compare runs/byol-r18/*`")
    runs = [load_run(p) for p in expand(paths)]
    exps = sorted({r.experiment for r in runs})
    if len(exps) > 1:
        raise UserError(f"runs of different experiments ({', '.join(exps)}); compare one experiment at a time")
    # One folder holds every preset's runs of an experiment (tiny-k1-..., cpu-k1-...): pooled, a tiny run would
    # join a cpu run's baseline.
    presets = sorted({str(r.hparams.get("preset")) for r in runs})
    if len(presets) > 1:
        first = next(r for r in runs if str(r.hparams.get("preset")) == presets[0])
        raise UserError(f"runs of different presets ({', '.join(presets)}); compare one preset at a time, e.g. "
                        f"{first.path.parent / (presets[0] + '-*')}")
    check_baselines(runs)
    return runs


def check_baselines(runs: list[Run]) -> None:
    """The κ=1 runs are one baseline's seeds: one run a seed, one spec. Two runs of one seed, or baselines
    trained with other settings (`--set schedule.epochs=30`), pooled, would make a spread and a mean of
    unlike runs."""
    from emarule.config.identity import comparable

    base = [r for r in runs if r.is_baseline and r.arm is None]
    by_seed: dict = {}
    for r in base:
        by_seed.setdefault(r.seed, []).append(r)
    twice = next((rs for rs in by_seed.values() if len(rs) > 1), None)
    if twice:
        raise UserError(f"two κ=1 baselines of seed {twice[0].seed} ({twice[0].path}, {twice[1].path}); a "
                        f"comparison takes one baseline a seed: leave one out")
    specs = [comparable(r.hparams.get("spec") or {}) for r in base]
    other = next((i for i, sp in enumerate(specs) if sp != specs[0]), None)
    if other is not None:
        raise UserError(f"κ=1 baselines made with other settings ({base[0].path} and {base[other].path}: their "
                        f"specs differ); compare the runs of one spec at a time")


def pick_metric(runs: list[Run], metric: str | None) -> str:
    """--metric, or the first of the registry's preferred metrics (each task's headline first) the baselines
    logged; every run must have logged it."""
    base = [r for r in runs if r.is_baseline]
    have = set.intersection(*(r.metrics() for r in base)) if base else set()
    if metric is None:
        if not have:
            raise UserError(f"the baseline run has no metrics yet ({base[0].path / METRICS if base else '?'} is "
                            f"empty); wait for it to log or pass finished runs")
        metric = next((m for m in preferred_metrics() if m in have), sorted(have)[0])
    for r in runs:
        # A run that stopped (diverged) before its first evaluation is shown as such, with an infinite gap.
        if metric not in r.metrics() and not r.stopped_early():
            known = ", ".join(sorted(r.metrics())) or "none logged yet"
            raise UserError(f"metric {metric!r} is not in {r.path / METRICS} ({len(r.rows)} rows); "
                            f"available: {known}")
    return metric


# --- numbers ------------------------------------------------------------------------------------


def interp(xs: list[float], ys: list[float], grid: list[float]) -> list[float]:
    import numpy as np

    return list(np.interp(np.asarray(grid, float), np.asarray(xs, float), np.asarray(ys, float)))


def slack(xs: list[float]) -> float:
    """How far outside another curve's range a grid point may lie and still count as the same evaluation:
    a quarter of the grid's smallest spacing. Seconds batches end epochs at slightly different points per
    seed, so evaluations due at the same base step land a few thousandths of an epoch apart."""
    steps = [b - a for a, b in zip(xs, xs[1:], strict=False) if b > a]
    return 0.25 * min(steps) if steps else 0.0


def mean_curve(curves: list[tuple[list, list]]) -> tuple[list, list, list]:
    """Mean and std of several curves on the first one's grid, within the range all of them cover."""
    import numpy as np

    curves = [c for c in curves if c[0]]
    if not curves:
        return [], [], []
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    tol = slack(curves[0][0]) + 1e-12
    grid = [x for x in curves[0][0] if lo - tol <= x <= hi + tol]
    if not grid:
        return [], [], []
    vals = np.array([interp(xs, ys, grid) for xs, ys in curves])
    return grid, list(vals.mean(0)), list(vals.std(0))


def gap(run_curve: tuple[list, list], base_curve: tuple[list, list]) -> dict:
    """max |Δ|, mean |Δ|, mean Δ (signed: run − baseline) and Δ final on the baseline's grid points inside the
    shared range."""
    rx, ry = run_curve
    bx, by = base_curve
    if not rx or not bx:
        return {"gap_max": None, "gap_mean": None, "signed_mean": None, "gap_final": None, "points": 0}
    lo, hi = max(rx[0], bx[0]), min(rx[-1], bx[-1])
    tol = slack(bx) + 1e-12
    idx = [i for i, x in enumerate(bx) if lo - tol <= x <= hi + tol]
    if not idx:
        return {"gap_max": None, "gap_mean": None, "signed_mean": None, "gap_final": None, "points": 0}
    grid = [bx[i] for i in idx]
    d = [a - by[i] for a, i in zip(interp(rx, ry, grid), idx, strict=True)]
    ad = [abs(v) for v in d]
    return {"gap_max": max(ad), "gap_mean": sum(ad) / len(ad), "signed_mean": sum(d) / len(d), "gap_final": d[-1],
            "points": len(d),
            "from_epoch": grid[0], "to_epoch": grid[-1]}


def compare(paths: list[Path], metric: str | None = None) -> dict:
    """Everything `emarule compare` prints, as a plain dict (also its --format json)."""
    runs = load_runs(paths)
    base = sorted((r for r in runs if r.is_baseline), key=lambda r: (r.seed is None, r.seed, r.name))
    if not base:
        have = ", ".join(f"{r.name} (κ={r.kappa:g})" for r in runs)
        from emarule.request.suggest import baseline_command

        raise UserError(f"no κ=1 baseline among the runs ({have}); add one, e.g. "
                        f"`{baseline_command(runs[0].hparams, runs[0].path)}` or `emarule sweep "
                        f"{runs[0].experiment} ...`")
    metric = pick_metric(runs, metric)
    bgrid, bmean, bstd = mean_curve([r.curve(metric) for r in base])
    if not bgrid:
        raise UserError(f"the baseline runs have no common {metric!r} values to compare against; "
                        f"let them run longer or pass one baseline")
    rows = []
    order = sorted(runs, key=lambda r: (not r.is_baseline, r.kappa, r.progressive or "", r.rule_label,
                                        r.seed if r.seed is not None else -1, r.name))
    for r in order:
        g = gap(r.curve(metric), (bgrid, bmean))
        why = r.incomplete(metric)
        if why:  # its shared epochs may match the baseline exactly: the run still did not get there
            g.update(gap_max=math.inf, gap_mean=math.inf, gap_final=None)
        rows.append({"run": str(r.path), "name": r.name, "kappa": r.kappa, "batch_size": r.batch_size,
                     "ema_momentum": r.ema_momentum, "ema_rule": r.rule is not None, "ema_rule_form": r.rule,
                     "rule": r.rule_label, "progressive": r.progressive, "seed": r.seed,
                     "baseline": r.is_baseline, **r.ending(metric), "incomplete": why, **g})
    groups = []
    by_group: dict = {}
    for r, row in zip(order, rows, strict=True):
        by_group.setdefault(r.group, (r, []))[1].append(row)
    for r, rs in by_group.values():
        vals = [x["gap_mean"] for x in rs if x["gap_mean"] is not None]
        finals = [x["final"] for x in rs if x["final"] is not None and not x["incomplete"]]
        groups.append({"label": r.group_label(), "kappa": r.kappa, "rule": r.rule_label, "progressive": r.progressive,
                       "runs": len(rs), "incomplete": sum(1 for x in rs if x["incomplete"]),
                       "final_mean": _mean(finals), "final_std": _std(finals),
                       "gap_mean": _mean(vals), "gap_max": max((x["gap_max"] for x in rs if x["gap_max"] is not None),
                                                               default=None)})
    return {"experiment": runs[0].experiment, "metric": metric,
            "baseline": {"runs": [str(r.path) for r in base], "final": bmean[-1], "final_epoch": bgrid[-1],
                         "points": len(bgrid)},
            "runs": rows, "groups": groups, "notes": baseline_notes(base, metric, bgrid[-1]),
            "_runs": runs, "_baseline_curve": (bgrid, bmean, bstd)}


def baseline_notes(base: list[Run], metric: str, end: float) -> list[str]:
    """What limits every gap: the baseline's mean stops where its shortest seed's curve does."""
    notes = [f"baseline {r.name} ends at epoch {_f(r.ending(metric)['final_epoch'])} ({r.incomplete(metric)})"
             for r in base if r.incomplete(metric)]
    ends = {r.name: r.curve(metric)[0][-1] for r in base if r.curve(metric)[0]}
    longest = max(ends.values(), default=end)
    if longest > end + slack(base[0].curve(metric)[0]) + 1e-12:
        notes.append(f"the baseline's mean ends at epoch {end:g}, where its shortest seed "
                     f"({min(ends, key=ends.get)}) ends; the gaps are measured up to there, not to epoch {longest:g}")
    return notes


def _mean(v: list) -> float | None:
    return sum(v) / len(v) if v else None


def _std(v: list) -> float | None:
    if len(v) < 2:
        return None
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / len(v))


# --- figure -------------------------------------------------------------------------------------


def _band(mean: list, std: list) -> tuple[list, list]:
    return [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)]


def plot(result: dict, out: Path) -> Path:
    """The paper-style figure, one panel per κ, written atomically to `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    metric = result["metric"]
    runs: list[Run] = result["_runs"]
    bgrid, bmean, bstd = result["_baseline_curve"]
    kappas = sorted({r.kappa for r in runs if not r.is_baseline}) or [1.0]
    n = len(kappas)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False, sharey=True)
    prog_colors: dict = {}
    for ax, k in zip(axes[0], kappas, strict=True):
        ax.plot(bgrid, bmean, "k--", lw=1.5, label="κ=1 baseline", zorder=3)
        if any(s > 0 for s in bstd):
            ax.fill_between(bgrid, *_band(bmean, bstd), color="k", alpha=0.12, lw=0)
        groups: dict = {}
        for r in runs:
            if not r.is_baseline and math.isclose(r.kappa, k):
                groups.setdefault(r.group, []).append(r)
        for _, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
            first = members[0]
            if first.progressive:
                color = prog_colors.setdefault((first.progressive, first.rule_label),
                                               PROGRESSIVE_COLORS[len(prog_colors) % len(PROGRESSIVE_COLORS)])
            else:
                color = COLORS.get(first.rule_label, "tab:gray")
            grid, mean, std = mean_curve([m.curve(metric) for m in members])
            if not grid:
                continue
            rho = f", ρ={first.ema_momentum:.4g}" if first.ema_momentum is not None else ""
            label = f"{first.group_label()}{rho}" + (f" (n={len(members)})" if len(members) > 1 else "")
            ax.plot(grid, mean, color=color, lw=1.5, label=label)
            if len(members) > 1:
                ax.fill_between(grid, *_band(mean, std), color=color, alpha=0.2, lw=0)
        b = next((r.batch_size for r in runs if math.isclose(r.kappa, k) and r.batch_size), None)
        ax.set_title(f"κ={k:g}" + (f" (B={b:,.0f})" if b else ""))
        ax.set_xlabel("epochs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel(metric)
    fig.suptitle(f"{result['experiment']}: {metric}", fontsize=10)
    fig.tight_layout()
    atomic_write_bytes(Path(out), png_bytes(fig, dpi=130))
    return Path(out)


def default_figure(result: dict) -> Path:
    parents = [Path(r["run"]).resolve().parent for r in result["runs"]]
    common = Path(os.path.commonpath([str(p) for p in parents])) if parents else Path(".")
    return common / figure_name(result["metric"])


def figure_name(metric: str) -> str:
    """`compare-<metric>.png`, with a further EMA's or split's `/` as `_`, so that the name is one file, not folders."""
    return f"compare-{metric.replace('/', '_')}.png"


# --- output -------------------------------------------------------------------------------------


def public(result: dict) -> dict:
    return {k: v for k, v in result.items() if not k.startswith("_")}


def _f(v, digits: int = 4, signed: bool = False) -> str:
    if v is None:
        return "—"
    if math.isinf(v):  # a run that stopped early or diverged
        return "∞"
    return f"{v:+.{digits}g}" if signed else f"{v:.{digits}g}"


def print_table(console, result: dict) -> None:
    from rich.table import Table

    m = result["metric"]
    t = Table(title=f"{result['experiment']}: {m} vs the κ=1 baseline (gaps on the baseline's epoch grid)",
              title_justify="left")
    for c in ("run", "κ", "batch", "EMA ρ", "rule", "seed", "last epoch", f"final {m}", "Δ final", "max |Δ|",
              "mean |Δ|"):
        t.add_column(c, justify="left" if c in ("run", "rule") else "right")
    for r in result["runs"]:
        t.add_row(r["name"], f"{r['kappa']:g}", _f(r["batch_size"], 6), _f(r["ema_momentum"], 6),
                  r["rule"] + (f" {r['progressive']}" if r["progressive"] else ""),
                  "—" if r["seed"] is None else str(r["seed"]),
                  _f(r["final_epoch"]) + (f" ({r['incomplete']})" if r["incomplete"] else ""),
                  _f(r["final"]), _f(r["gap_final"], 3, True), _f(r["gap_max"], 3), _f(r["gap_mean"], 3))
    console.print(t)
    for note in result.get("notes", ()):
        console.print(f"note: {note}", markup=False, highlight=False)
    if any(g["runs"] > 1 for g in result["groups"]):
        s = Table(title="per setting (mean over seeds)", title_justify="left")
        for c in ("setting", "κ", "runs", f"final {m}", "± std", "mean |Δ|", "max |Δ|"):
            s.add_column(c, justify="left" if c == "setting" else "right")
        for g in result["groups"]:
            runs = str(g["runs"]) + (f" ({g['incomplete']} incomplete)" if g["incomplete"] else "")
            s.add_row(g["label"], f"{g['kappa']:g}", runs, _f(g["final_mean"]), _f(g["final_std"], 3),
                      _f(g["gap_mean"], 3), _f(g["gap_max"], 3))
        console.print(s)
    if result.get("figure"):
        console.print(f"figure: {result['figure']}", highlight=False)


def not_the_users(png: Path, what: str) -> None:
    """A file already at the figure's path is replaced only when emarule wrote it."""
    from emarule.engine.rundir import written_by_emarule

    if os.path.lexists(png) and not written_by_emarule(png):
        raise UserError(f"{what} {png} is a file emarule did not write; pass --out with another path, or move it "
                        f"away")


def run_compare(console, paths: list[Path], metric: str | None, out: Path | str | None, fmt: str = "table",
                figure: bool = True) -> dict:
    """Load, measure, plot (unless figure=False) and print; returns the public result.

    The figure's path is checked before anything is read, and the default one (beside the runs)
    before it is written, so that an unwritable place is a one-line error, not a half-done command.
    """
    from emarule import extras
    from emarule.request import checks

    if figure:
        extras.require("compare's figure", ("plots",))
    if figure and out is not None:
        out = checks.out_file(out)
        if out.suffix.lower() != ".png":
            raise UserError(f"--out {out}: the figure is written as PNG; give a path ending in .png, "
                            f"e.g. --out {out.with_suffix('.png') if out.suffix else Path(str(out) + '.png')}")
        not_the_users(out, "--out")
    result = compare(paths, metric)
    if figure:
        target = out or checks.out_file(default_figure(result), "the figure", "pass --out PNG with another path")
        not_the_users(target, "the figure")
        result["figure"] = str(plot(result, target))
    pub = public(result)
    if fmt == "json":  # an infinite gap as "inf" text (strict JSON), as metrics.jsonl logs a non-finite value
        print(json.dumps(jsonable(pub), indent=2, ensure_ascii=False))
    else:
        print_table(console, result)
    return pub
