"""Every task family, one `TaskSpec` each: the one place a family is registered. Torch-free.

A new family is one module (its builder), one `register(TaskSpec(...))` line here (or in the module that
adds it, before the run) and its `emarule/experiments/<name>.yaml`. Everything else reads this registry: the runnable
tasks, the spec checks (`schema_for`), the pre-run checks (default data source, studies, metrics), `compare`'s
default metric and the training loss a sweep compares after it.

A task module is imported only when its task runs (`TaskSpec.load`): `table`, `plan`, `limits` and `compare`
read this file and never import torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from emarule.registry import sections as keys

KINDS = ("training", "study")


@dataclass(frozen=True)
class TaskSpec:
    name: str  # the spec's `task:`
    kind: str  # training: `builder(ctx)` returns the TaskParts the engine trains; study: `builder(ctx)` runs it
    module: str  # dotted module path, imported only when the task runs
    builder: str  # the function of `module`: build (training) or run (study)
    config: dict[str, Any] = field(default_factory=dict)  # its own spec sections (emarule/registry/sections.py)
    units: tuple[str, ...] = ("samples",)  # the batch.unit values it batches by; a run with another is refused
    metrics: tuple[str, ...] = ()  # what it logs besides the loop's loss and grad_norm (ema_ and /split aside)
    # those of `metrics` scored on every EMA too (ema_X, ema_X/<ρ> for each ema.also) and, with data.eval_splits,
    # on each split after the first (X/<split>); a task whose evaluations score its teacher alone has none
    ema_metrics: tuple[str, ...] = ()
    # those of `metrics` a run logs only where its spec has the named section (ctc's pseudo-labeling metrics)
    section_metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    headline: str | None = None  # what compare, sweep and reproduce judge by default
    loss: str = "loss"  # the training loss a sweep compares after the headline
    experiments: str = ""  # its specs and their presets (`presets:` in each YAML)
    extras: tuple[str, ...] = ("plots",)  # the pip extras a run needs (emarule.extras): a run draws its figures
    doc: str = ""  # the paper section it reproduces

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"TaskSpec {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def sources(self) -> tuple[str, ...]:
        """The data.source values its spec accepts; the first is the default (the spec names none)."""
        data = self.config.get("data") or {}
        source = data.get("source") if isinstance(data, dict) else None
        return tuple(getattr(source, "choices", None) or ())

    @property
    def default_source(self) -> str | None:
        data = self.config.get("data") or {}
        return getattr(data.get("source"), "default", None)

    def load(self) -> Callable:
        """The builder, importing the task's module (and, for most, torch) now."""
        return getattr(importlib.import_module(self.module), self.builder)

    def build(self, ctx):
        """The builder called on `ctx`: a training task's TaskParts, or a study's result."""
        return self.load()(ctx)


REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Add a family; registering the same name again with a different record is refused."""
    if spec.name in REGISTRY and REGISTRY[spec.name] != spec:
        raise ValueError(f"task {spec.name!r} is registered already ({REGISTRY[spec.name].module})")
    REGISTRY[spec.name] = spec
    return spec


def lookup(name: str | None) -> TaskSpec | None:
    return REGISTRY.get(name or "")


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


register(TaskSpec("parabola", "study", "emarule.studies.parabola.run", "run", keys.PARABOLA,
                  experiments="parabola", doc="§3.1, App. F.1"))
register(TaskSpec("precision", "study", "emarule.studies.precision", "run", keys.PRECISION,
                  experiments="precision", doc="App. I"))
register(TaskSpec("byol", "training", "emarule.tasks.byol", "build", keys.BYOL,
                  metrics=("byol_loss", "probe_loss", "probe_train_top1", "probe_top1"),
                  headline="probe_top1", loss="byol_loss",
                  experiments="byol-r18, byol-vit, byol-r50-lars", doc="§3.4, App. H", extras=("vision", "plots")))
register(TaskSpec("dino", "training", "emarule.tasks.dino", "build", keys.DINO,
                  metrics=("dino_loss", "probe_loss", "probe_train_top1", "probe_top1", "center_momentum",
                           "teacher_entropy", "teacher_temp"),
                  headline="probe_top1", experiments="dino-vit", doc="App. H.11", extras=("vision", "plots")))
register(TaskSpec("polyak", "training", "emarule.tasks.polyak", "build", keys.POLYAK,
                  metrics=("train_top1", "bn_momentum", "top1", "val_loss"), ema_metrics=("top1", "val_loss"),
                  headline="ema_top1", experiments="polyak-r50", doc="§3.2, App. F.2–F.3",
                  extras=("vision", "plots")))
register(TaskSpec("ctc", "training", "emarule.tasks.ctc", "build", keys.CTC, units=("seconds",),
                  metrics=("ctc_loss", "wer", "pl_wer", "phase", "unlabeled_share"), ema_metrics=("wer",),
                  section_metrics={"pseudo_label": ("pl_wer", "phase", "unlabeled_share")},
                  headline="ema_wer", experiments="ctc-polyak, ctc-pseudo-label", doc="§3.2, §3.3, App. G",
                  extras=("speech", "plots")))
register(TaskSpec("toy", "training", "emarule.tasks.toy", "build", keys.TOY, units=("samples", "seconds"),
                  metrics=("mse", "val_mse"), ema_metrics=("val_mse",), headline="loss",
                  doc="the engine's tests (tests/engine_util.py; no emarule/experiments/*.yaml)"))


def training() -> tuple[TaskSpec, ...]:
    return tuple(t for t in REGISTRY.values() if t.kind == "training")


def preferred_metrics() -> tuple[str, ...]:
    """`compare`'s default metric, in order: each training task's headline (an EMA's, then the target's
    own), then the generic evaluation names and the loss."""
    heads = [t.headline for t in training() if t.headline and t.headline != "loss"]
    out: list[str] = []
    for m in [*heads, *(h[len("ema_"):] for h in heads if h.startswith("ema_")), "val_top1", "test_top1", "loss"]:
        if m not in out:
            out.append(m)
    return tuple(out)


def training_losses() -> tuple[str, ...]:
    """The task's own training losses, then the loop's `loss`: a sweep compares the first one logged."""
    return tuple(dict.fromkeys([*(t.loss for t in training() if t.loss != "loss"), "loss"]))
