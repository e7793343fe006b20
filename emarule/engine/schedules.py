"""Learning-rate schedules in epochs, computed from the base spec and scaled for the current κ.

Time is the samples-seen clock: epoch = samples_seen / len(train_set), fractional. A schedule's
shape (warm-up length, cosine horizon, milestones) is fixed in epochs, so it is the same at every
batch size; only its end points change with κ. At epoch e under κ_e (Progressive Scaling may
change κ per epoch) the learning rate is the shape evaluated with the peak
`Plan(κ_e)["optimizer.lr"]` and floor `Plan(κ_e)["schedule.min_lr"]` (Appendix C.4: schedules are
computed from base hyperparameters, then modified by the scaling law).

Step-counted specs (`schedule.total_steps`, `schedule.warmup_steps`, written in base steps) are
converted to epochs through samples: N steps × base batch / dataset size.

Shapes:
- cosine:    linear warm-up to the peak (its first step at peak/W_steps, not 0), then half a cosine
             from the peak to min_lr.
- multistep: linear warm-up, then the peak × gamma^(milestones passed); min_lr is not used.
- constant:  linear warm-up, then the peak.
Pure Python (no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emarule.config.typed import Config, config_of
from emarule.errors import UserError


@dataclass(frozen=True)
class Schedule:
    kind: str
    total_epochs: float
    warmup_epochs: float
    milestones: tuple = ()
    gamma: float = 0.1

    def shape(self, epoch: float, peak: float, floor: float = 0.0, step: float = 0.0) -> float:
        """The learning rate of a step starting at fractional `epoch` and lasting `step` epochs.

        In the warm-up a step takes the rate at its end, so the first step is not wasted at lr 0:
        step k of W warm-up steps gets peak × k / W, as timm's and MAE's warm-ups start at step 1.
        """
        w = self.warmup_epochs
        if w > 0 and epoch < w:
            return peak * min(1.0, (epoch + step) / w)
        if self.kind == "constant":
            return peak
        if self.kind == "multistep":
            passed = sum(1 for m in self.milestones if epoch >= m)
            return peak * self.gamma ** passed
        if self.kind == "cosine":
            span = self.total_epochs - w
            t = 1.0 if span <= 0 else min(1.0, max(0.0, (epoch - w) / span))
            return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
        raise UserError(f"schedule.kind {self.kind!r}: use cosine, multistep or constant")

    def lr(self, epoch: float, plan, step: float = 0.0) -> float:
        """The lr of a step at `epoch` (lasting `step` epochs) under the plan of the current κ."""
        return self.shape(epoch, plan["optimizer.lr"], plan.get("schedule.min_lr", 0.0) or 0.0, step)


def from_spec(cfg: Config | dict, dataset_size: float) -> Schedule:
    """The schedule of a spec's typed config (or the spec) in epochs of a training set of `dataset_size` (samples,
    or seconds)."""
    cfg = config_of(cfg)
    s, base_batch = cfg.schedule, cfg.batch.size

    def steps_to_epochs(steps: float) -> float:
        return steps * base_batch / dataset_size

    if s.epochs is not None:
        total = float(s.epochs)
    elif s.total_steps is not None:
        total = steps_to_epochs(s.total_steps)
    else:
        raise UserError("the spec gives no training length; set schedule.epochs or schedule.total_steps")
    if s.warmup_epochs is not None:
        warm = float(s.warmup_epochs)
    elif s.warmup_steps is not None:
        warm = steps_to_epochs(s.warmup_steps)
    else:
        warm = 0.0
    if s.kind == "multistep" and not s.milestones_epochs:
        raise UserError("schedule.kind multistep needs schedule.milestones_epochs, e.g. [30, 60, 80]")
    return Schedule(kind=s.kind, total_epochs=total, warmup_epochs=warm,
                    milestones=tuple(float(m) for m in s.milestones_epochs), gamma=float(s.gamma))


# --- the EMA momenta ---------------------------------------------------------------------------


def momentum_key(ema: str, main: str = "ema") -> str:
    """The plan's name of an EMA's momentum: `ema.momentum` for the main EMA, `ema.momentum/<name>` for another."""
    return "ema.momentum" if ema == main else f"ema.momentum/{ema}"


def momentum_log_name(ema: str, main: str = "ema") -> str:
    """The same momentum as a metrics.jsonl column: `ema_momentum`, `ema_momentum/<name>`."""
    return "ema_momentum" if ema == main else f"ema_momentum/{ema}"


@dataclass(frozen=True)
class EmaMomenta:
    """Every EMA's ρ̂ at every stage, read from the plan once, before the loop (as DINO builds its momentum
    schedule before training): the loop sets a stage's values when it enters the stage and never scales ρ
    itself. A constant-κ run has one stage; Progressive Scaling one per κ. The ModelEmas get no base batch,
    so ρ is raised to κ in the plan alone."""

    by_kappa: dict  # κ of a stage -> {EMA name: ρ̂}

    @classmethod
    def from_plan(cls, plan, names: list[str], main: str = "ema") -> "EmaMomenta":
        stages = [p for _, p in plan.stages] if plan.stages else [plan]
        return cls({p.kappa: {n: p[momentum_key(n, main)] for n in names} for p in stages})

    def at(self, kappa: float) -> dict:
        return self.by_kappa[kappa]
