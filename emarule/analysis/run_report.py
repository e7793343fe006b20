"""What a training run did: its figures, drawn from metrics.jsonl, and the summary printed at its end.

    <run>/figures/loss.png        the training loss (`loss`) and the task's own losses (`*_loss`)
    <run>/figures/eval.png        one panel per evaluation metric X: the target's X beside the EMAs'
                                  `ema_X` and `ema_X/<name>`, and other splits' `X/<split>`
    <run>/figures/schedules.png   the learning rate, every EMA momentum (`ema_momentum`,
                                  `ema_momentum/<name>`) and, when Progressive Scaling changes it, κ

all against epochs. A figure with nothing to draw is not written. Metric names follow the engine's
convention: an EMA's metric is the target's name prefixed `ema_`; further EMAs add `/<name>`, the
name under which their momentum is logged (`ema_momentum/<name>`). The tracking probe's metrics
(`probe_*`, BYOL and DINO) measure the EMA teacher and are listed with the EMA's.

Torch-free: it reads only the run directory, so it runs anywhere the run directory is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from emarule.analysis.compare import DIVERGED, finite_number, is_metric
from emarule.engine.context import rule_names, rule_of_hparams
from emarule.engine.rundir import FIGURES, HPARAMS, METRICS, atomic_write_bytes, png_bytes, read_json, read_metrics

EMA_PREFIX = "ema_"
PROBE_PREFIX = "probe_"  # the tracking probe: it measures the EMA teacher
MOMENTUM = "ema_momentum"


@dataclass
class Report:
    run: Path
    figures: list[Path] = field(default_factory=list)
    final: dict[str, dict[str, float]] = field(default_factory=dict)  # "target", "EMA", "EMA <name>" → metrics
    # metric → where its final value is from ("epoch 3; nan from epoch 4"), where rows of its kind (train, eval)
    # went on after it without a finite value of it
    stale: dict[str, str] = field(default_factory=dict)
    where: dict = field(default_factory=dict)  # epoch, step, samples_seen, kappa of the last row
    wall_s: float | None = None
    headline: str = ""
    skipped: int | None = None  # training items skipped for failing to decode (data.skip_bad_items)
    data_wait: str = ""  # how long training waited for its batches, and a hint where the loader held it back

    def text(self) -> str:
        lines = [f"run finished: {self.run}" + (f" ({self.headline})" if self.headline else "")]
        width = max((len(k) for k in self.final), default=0)
        for who, metrics in self.final.items():
            lines.append(f"  {who + ':':<{width + 1}} " + ", ".join(
                f"{k} {_g(v)}" + (f" ({self.stale[k]})" if k in self.stale else "")
                for k, v in metrics.items()))
        if not self.final:
            lines.append("  no metrics logged")
        if self.skipped is not None:
            lines.append(f"  skipped: {self.skipped} training item{'s' * (self.skipped != 1)} that failed to decode "
                         f"(data.skip_bad_items)")
        if self.wall_s is not None:
            lines.append(f"  wall time: {self.wall_s:.1f} s")
        if self.data_wait:
            lines.append(f"  {self.data_wait}")
        lines.append("  figures: " + (", ".join(str(f) for f in self.figures) or "none (nothing logged to plot)"))
        return "\n".join(lines)


def _g(v: float) -> str:
    return f"{v:.4g}"


def _rows(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r.get("kind", "train") == kind and finite_number(r.get("epoch")) is not None]


def _columns(rows: list[dict], keep) -> list[str]:
    out: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in out and keep(k) and finite_number(v) is not None:
                out.append(k)
    return out


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["epoch"]), finite_number(r.get(key))) for r in rows]
    pts = [(x, y) for x, y in pts if y is not None]
    return [x for x, _ in pts], [y for _, y in pts]


def is_loss(key: str) -> bool:
    base = key.split("/", 1)[0]
    return base == "loss" or base.endswith("_loss")


def base_metric(key: str) -> str:
    """`ema_top1/0.9999` → `top1`: the target metric an EMA's or a split's metric belongs with."""
    key = key[len(EMA_PREFIX):] if key.startswith(EMA_PREFIX) else key
    return key.split("/", 1)[0]


def ema_names(train: list[dict]) -> list[str]:
    """Names of the further EMAs, from their logged momenta (`ema_momentum/<name>`)."""
    return [k.split("/", 1)[1] for k in _columns(train, lambda k: k.startswith(MOMENTUM + "/"))]


def owner(key: str, extra_emas: list[str]) -> str:
    """Whose metric `key` is: "target", "EMA" (the main one) or "EMA <name>".

    The tracking probe of BYOL and DINO (`probe_top1`, `probe_loss`, `probe_train_top1`;
    emarule/vision/probe.py) reads the EMA teacher's representation, so its metrics are the EMA's.
    """
    if key.startswith(PROBE_PREFIX):
        return "EMA"
    if not key.startswith(EMA_PREFIX):
        return "target"
    for part in key.split("/")[1:]:
        if part in extra_emas:
            return f"EMA {part}"
    return "EMA"


def _first_nonfinite(rows: list[dict], key: str) -> float | None:
    """The epoch of the first "nan"/"inf" (a diverged run's) logged for `key`."""
    return next((float(r["epoch"]) for r in rows if r.get(key) in DIVERGED), None)


def final_metrics(train: list[dict], evals: list[dict]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """The last finite value of each training loss and each evaluation metric, by model, and for each whose value
    comes before the last row of its kind (the metric went non-finite, stopped being logged, or a split is
    evaluated less often) where it is from, so that it is not read as the headline's epoch."""
    extra = ema_names(train)
    out: dict[str, dict[str, float]] = {}
    last: dict[str, float] = {}
    stale: dict[str, str] = {}
    for rows, keep in ((train, is_loss), (evals, is_metric)):
        end = max((float(r["epoch"]) for r in rows), default=None)
        for k in _columns(rows, keep):
            xs, ys = _series(rows, k)
            last[k] = ys[-1]
            if xs[-1] < end:
                bad = _first_nonfinite(rows, k)
                stale[k] = f"epoch {xs[-1]:.4g}" + (f"; nan from epoch {bad:.4g}" if bad is not None else "")
    for k, v in last.items():
        out.setdefault(owner(k, extra), {})[k] = v
    order = ["target", "EMA", *(f"EMA {n}" for n in extra)]
    by_model = {who: out[who] for who in sorted(out, key=lambda w: order.index(w) if w in order else len(order))}
    return by_model, stale


# --- figures ------------------------------------------------------------------------------------


def _panels(series: list[tuple[str, list[tuple[str, list, list]]]], title: str) -> bytes:
    """A figure with one panel per (ylabel, [(label, xs, ys)]), returned as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = len(series)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (ylabel, lines) in zip(axes.flat, series, strict=False):
        for i, (label, xs, ys) in enumerate(lines):
            ax.plot(xs, ys, lw=1.4, ls="-" if i == 0 else "--", label=label, marker="." if len(xs) < 30 else None)
        ax.set_xlabel("epochs")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return png_bytes(fig, dpi=120)


def loss_panels(train: list[dict]) -> list:
    keys = _columns(train, is_loss)
    return [(k, [(k, *_series(train, k))]) for k in keys]


def eval_panels(evals: list[dict]) -> list:
    groups: dict[str, list[str]] = {}
    for k in _columns(evals, is_metric):
        groups.setdefault(base_metric(k), []).append(k)
    panels = []
    for base, keys in groups.items():
        keys.sort(key=lambda k: (k.startswith(EMA_PREFIX), k != base, k))  # the target's own first
        panels.append((base, [(k, *_series(evals, k)) for k in keys]))
    return panels


def schedule_panels(train: list[dict]) -> list:
    panels = []
    if _columns(train, lambda k: k == "lr"):
        panels.append(("learning rate", [("lr", *_series(train, "lr"))]))
    momenta = _columns(train, lambda k: k == MOMENTUM or k.startswith(MOMENTUM + "/"))
    if momenta:
        panels.append(("EMA momentum ρ̂", [(k, *_series(train, k)) for k in momenta]))
    kappas = _series(train, "kappa")[1]
    if len(set(kappas)) > 1:
        panels.append(("κ", [("kappa", *_series(train, "kappa"))]))
    return panels


def write_figures(run: Path, rows: list[dict], name: str) -> list[Path]:
    train, evals = _rows(rows, "train"), _rows(rows, "eval")
    out = []
    for fname, panels, what in (("loss.png", loss_panels(train), "training loss"),
                                ("eval.png", eval_panels(evals), "evaluation: target and EMAs"),
                                ("schedules.png", schedule_panels(train), "learning rate and EMA momentum")):
        if not panels:
            continue
        path = Path(run) / FIGURES / fname
        atomic_write_bytes(path, _panels(panels, f"{name}: {what}"))
        out.append(path)
    return out


# --- the report ---------------------------------------------------------------------------------


# Where the loader took this share of the training time on a GPU, it held the steps back: on one H100,
# dino-vit's full recipe waited 56 % of its time with 8 workers and 16 % with 15, at 1.9x the rate (docs/gpu.md).
LOADER_BOUND = 0.25
HINT_AFTER_S = 60.0  # a shorter loop's share is mostly its workers' start, which more workers would lengthen


def data_wait(train: list[dict], h: dict | None) -> str:
    """One line: the time the last train row says the loop waited for batches, as a share of its wall time."""
    rows = [r for r in train if finite_number(r.get("data_wait_s")) is not None
            and (finite_number(r.get("wall_s")) or 0.0) > 0]
    if not rows:
        return ""
    wait, wall = float(rows[-1]["data_wait_s"]), float(rows[-1]["wall_s"])
    line = f"waiting for training batches: {_s(wait)} s of the loop's {_s(wall)} s ({100 * wait / wall:.0f} %)"
    h = h or {}
    if wait / wall >= LOADER_BOUND and wall >= HINT_AFTER_S and str(h.get("device", "")).startswith("cuda"):
        line += (f"; the DataLoader held the GPU back: more workers may help (--num-workers; this run had "
                 f"{h.get('num_workers', '?')})")
    return line


def _s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2f}"


def _hparams(run: Path) -> dict | None:
    h = read_json(run / HPARAMS)
    return h if isinstance(h, dict) else None


def _headline(h: dict | None, last: dict) -> str:
    parts = []
    if isinstance(h, dict):
        if finite_number(h.get("kappa")) is not None:
            parts.append(f"κ={h['kappa']:g}")
        parts.append(rule_names(rule_of_hparams(h)).label)
        if h.get("seed") is not None:
            parts.append(f"seed {h['seed']}")
    for key, text in (("epoch", "epoch {:.4g}"), ("step", "step {:.0f}")):
        v = finite_number(last.get(key))
        if v is not None:
            parts.append(text.format(v))
    samples, seconds = finite_number(last.get("samples_seen")), finite_number(last.get("seconds_seen"))
    if samples is not None:  # a batch in seconds of audio is timed in seconds too, as the stop and resume lines say
        parts.append(f"{samples:.0f} samples" + (f" ({seconds:.1f} s of audio)" if seconds is not None else "")
                     + " seen")
    return ", ".join(parts)


def report(run: Path | str, wall_s: float | None = None, figures: bool = True) -> Report | None:
    """Draw the run's figures and gather its final metrics; None for a run without metrics.jsonl
    (the parabola and precision studies, which write their own figures)."""
    run = Path(run)
    if not (run / METRICS).exists():
        return None
    rows = read_metrics(run / METRICS)  # lenient: the log of the run that just ended
    train, evals = _rows(rows, "train"), _rows(rows, "eval")
    last = max(train + evals, key=lambda r: float(r["epoch"])) if train or evals else {}
    h = _hparams(run)
    final, stale = final_metrics(train, evals)
    rep = Report(run=run, final=final, stale=stale, where=last, wall_s=wall_s, headline=_headline(h, last))
    skipped = [r["skipped_items"] for r in train if isinstance(r.get("skipped_items"), int)]
    rep.skipped = skipped[-1] if skipped else None
    rep.data_wait = data_wait(train, h)
    if figures:
        rep.figures = write_figures(run, rows, run.name)
    return rep


def print_report(console, rep: Report | None) -> None:
    if rep is not None:
        console.print(rep.text(), markup=False, highlight=False, soft_wrap=True)
