"""Progressive Scaling (Definition 3.2, Algorithm 1): the batch size as a function of the epoch.

The batch is constant within an epoch, as in Algorithm 1; every hyperparameter is re-derived
from the base values for each epoch's κ. Four kinds, all reaching the run's final κ:

- constant:     κB from the start (no progressive scaling).
- step:         B before `epoch`, κB from it on. Given as `base_step` instead, the transition is a
                point on the clock in base steps (base steps × base batch of data seen), for recipes
                counted in steps (speech: 8 → 16 at 29k reference steps). `from_kappa` (default
                1) sets the batch before the step: from_kappa × B.
- incremental:  B before `start_epoch`, then +`delta_batch` every `every_epochs`, capped at κB.
                `from_kappa` sets the batch before `start_epoch` here too: App. H's "waterfall"
                starts at 3072 = 0.75 × 4096 and adds 3072 every 60 epochs up to 24,576.
- smooth:       B before `start_epoch`, κB from `end_epoch`, linear in epochs between.

The batches of a ramp (smooth's, and incremental's between its first batch and κB) are rounded to
a multiple of `batch_multiple` (default 1: whole samples), so that every stage's batch splits over
the processes of a run: a run sets it to its world size. Each stage's κ is its batch / B.

On the command line: `constant`, `step:E`, `smooth:E1-E2`, `incremental:START,DELTA_B,EVERY` or
`incremental:START,DELTA_B,EVERY,FROM_KAPPA`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emarule.errors import UserError


RAMPS = ("smooth", "incremental")  # the kinds whose batches between their ends are rounded to batch_multiple
# A plan holds one full plan per stage; past this many the schedule is a mistake, not a recipe (the paper's
# longest ramp has 120 stages).
MAX_STAGES = 10_000


def whole_multiple(m) -> int:
    """`batch_multiple` checked: a whole number ≥ 1 (None: 1)."""
    if m is None:
        return 1
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not float(m).is_integer() or m < 1:
        raise UserError(f"progressive.batch_multiple must be a whole number ≥ 1, got {m!r}")
    return int(m)


@dataclass(frozen=True)
class Stage:
    start_epoch: float  # in base steps when axis == "base_steps"
    end_epoch: float
    batch_size: float
    kappa: float
    axis: str = "epochs"


def parse(text: str) -> dict:
    """`step:10` → {"kind": "step", "epoch": 10.0}, and so on (see the module docstring)."""
    kind, _, arg = text.strip().partition(":")
    usage = "use constant, step:E, smooth:E1-E2 or incremental:START,DELTA_B,EVERY[,FROM_KAPPA]"
    try:
        if kind == "constant" and not arg:
            return {"kind": "constant"}
        if kind == "step":
            return _checked(text, {"kind": "step", "epoch": float(arg)})
        if kind == "smooth":
            a, b = arg.split("-")
            return _checked(text, {"kind": "smooth", "start_epoch": float(a), "end_epoch": float(b)})
        if kind == "incremental":
            a, d, n, *k0 = arg.split(",")
            out = {"kind": "incremental", "start_epoch": float(a), "delta_batch": float(d), "every_epochs": float(n)}
            if len(k0) > 1:
                raise ValueError
            if k0:
                out["from_kappa"] = float(k0[0])
            return _checked(text, out)
    except UserError:
        raise  # a value _checked refused, named by it
    except ValueError:
        pass
    raise UserError(f"--progressive {text!r}: cannot parse; {usage}")


def _checked(text: str, spec: dict) -> dict:
    """Epochs are ≥ 0 and finite; increments and their period are > 0 (the spec's own section is
    held to the same by the schema)."""
    for key, value in spec.items():
        positive = key in ("delta_batch", "every_epochs", "from_kappa")
        if key != "kind" and (not math.isfinite(value) or value < 0 or (positive and value == 0)):
            need = "a finite number > 0" if positive else "a finite number ≥ 0"
            raise UserError(f"--progressive {text!r}: {key} must be {need}, got {value:g}")
    return spec


class BatchSchedule:
    """Batch size per epoch for a base batch `base_batch` growing to `kappa` × base_batch."""

    def __init__(self, progressive: dict | None, base_batch: float, kappa: float, epochs: float | None,
                 total_steps: float | None = None):
        self.spec = dict(progressive) if progressive else {"kind": "constant"}
        self.base = float(base_batch)
        self.kappa = float(kappa)
        self.epochs = epochs
        self.total_steps = total_steps
        # Ramp batches are multiples of this (1: whole samples); see the module docstring.
        self.multiple = whole_multiple(self.spec.get("batch_multiple"))
        # The time axis of the schedule: epochs, or base steps for a step given as `base_step`.
        self.axis = "base_steps" if self.spec.get("base_step") is not None else "epochs"
        self._validate()

    def _need(self, *keys: str) -> None:
        missing = [k for k in keys if self.spec.get(k) is None]
        if missing:
            raise UserError(f"progressive {self.spec['kind']}: missing {', '.join(missing)}")

    def _validate(self) -> None:
        if "kind" not in self.spec:
            raise UserError("progressive: missing kind (constant, step, incremental or smooth)")
        kind = self.spec["kind"]
        if kind not in ("constant", "step", "incremental", "smooth"):
            raise UserError(f"progressive.kind {kind!r}: use constant, step, incremental or smooth")
        if kind == "constant":
            return
        if self.kappa < 1:
            raise UserError(f"progressive {kind} grows the batch; it needs κ ≥ 1, got κ={self.kappa:g}")
        if self.axis == "base_steps":
            self._validate_base_steps(kind)
            return
        if self.epochs is None:
            raise UserError("progressive scaling is scheduled in epochs, but this spec counts its "
                            "duration in steps; set schedule.epochs or drop --progressive")
        if kind == "step":
            self._need("epoch")
            self._check_from_kappa()
        elif kind == "smooth":
            self._need("start_epoch", "end_epoch")
            if self.spec["end_epoch"] <= self.spec["start_epoch"]:
                raise UserError("progressive smooth: end_epoch must be after start_epoch")
            if self.spec.get("from_kappa") is not None:
                raise UserError("progressive smooth: from_kappa applies to step and incremental only (a smooth "
                                "ramp starts at the base batch); drop from_kappa, or use kind incremental")
        else:
            self._need("start_epoch", "delta_batch", "every_epochs")
            self._check_from_kappa()
        last = max(float(self.spec.get(k) or 0) for k in ("epoch", "start_epoch", "end_epoch"))
        if last >= self.epochs:
            raise UserError(f"progressive {kind}: epoch {last:g} is not before the end of training "
                            f"({self.epochs:g} epochs)")
        if kind == "incremental":
            self._check_incremental_reaches_kappa()

    def _check_incremental_reaches_kappa(self) -> None:
        """The last epoch trains at κB: a run named and planned at κ that never gets there is refused."""
        final, last = self.base * self.kappa, math.ceil(self.epochs) - 1
        if self.batch_at(last) >= final * (1 - 1e-12):
            return
        s = self.spec
        first = self.base * float(s.get("from_kappa") or 1.0)
        increments = math.ceil((final - first) / s["delta_batch"] - 1e-9)
        reached = s["start_epoch"] + (increments - 1) * s["every_epochs"]
        raise UserError(f"progressive incremental: the batch reaches κB = {final:g} only at epoch {reached:g}, "
                        f"not before the end of training ({self.epochs:g} epochs); use a larger delta_batch, a "
                        f"shorter every_epochs or an earlier start_epoch, or set schedule.epochs above {reached:g}")

    def _validate_base_steps(self, kind: str) -> None:
        if kind != "step" or self.spec.get("epoch") is not None:
            raise UserError("progressive: base_step goes with kind step (and replaces epoch)")
        if self.total_steps is not None and self.spec["base_step"] >= self.total_steps:
            raise UserError(f"progressive step: base_step {self.spec['base_step']:g} is not before the end of "
                            f"training ({self.total_steps:g} base steps)")
        self._check_from_kappa()

    def check_base_step_in_run(self, epoch_measure: float) -> None:
        """A `base_step` before the end of a run counted in epochs, whose length in base steps is known only
        with its training set (`epoch_measure`: one epoch in the batch unit): refused as an `epoch` after the
        end is, before anything is written."""
        if self.axis != "base_steps" or self.epochs is None or self.total_steps is not None:
            return
        end = float(self.epochs) * float(epoch_measure) / self.base
        if self.spec["base_step"] >= end - 1e-9:
            raise UserError(f"progressive step: base_step {self.spec['base_step']:g} is not before the end of "
                            f"training ({end:g} base steps: {self.epochs:g} epochs of {epoch_measure:g} at "
                            f"batch.size {self.base:g}); use a base_step below {end:g}, or `epoch` instead")

    def _check_from_kappa(self) -> None:
        k0 = self.spec.get("from_kappa")
        if k0 is not None and not 0 < k0 <= self.kappa:
            raise UserError(f"progressive {self.spec['kind']}: from_kappa must be in (0, κ={self.kappa:g}], "
                            f"got {k0:g}")

    def batch_at(self, t: float) -> float:
        """Batch size (in the spec's batch unit) at time `t` on the schedule's axis.

        On the epoch axis the batch is constant within an epoch, as in Algorithm 1: thresholds
        are whole epochs and ramps are evaluated at ⌊t⌋. A `base_step` transition takes effect at
        the first optimizer step that starts at or after it.
        """
        s, e = self.spec, math.floor(t + 1e-9)
        final = self.base * self.kappa
        kind = s.get("kind", "constant")
        if kind == "constant":
            return final
        if kind == "step":
            before = self.base * float(s.get("from_kappa") or 1.0)
            if self.axis == "base_steps":
                return final if t + 1e-9 >= s["base_step"] else before
            return final if e >= s["epoch"] else before
        if kind == "smooth":
            e1, e2 = s["start_epoch"], s["end_epoch"]
            if e < e1:
                return self.base
            if e >= e2:
                return final
            return self._on_ramp(self.base + (final - self.base) * (e - e1) / (e2 - e1), self.base, final)
        # incremental
        first = self.base * float(s.get("from_kappa") or 1.0)
        if e < s["start_epoch"]:
            return first
        grown = first + s["delta_batch"] * (math.floor((e - s["start_epoch"]) / s["every_epochs"]) + 1)
        return final if grown >= final else self._on_ramp(grown, first, final)

    def _on_ramp(self, batch: float, lo: float, hi: float) -> float:
        """A ramp's batch: a whole number of samples, or for a `batch_multiple` above 1 the nearest multiple of it,
        kept within the ramp's ends [lo, hi] either way: a base batch that is not a whole number (0.5 samples)
        would otherwise round outside them, even to 0, and the batch must never shrink."""
        m = self.multiple
        if m == 1:
            return float(min(max(round(batch), lo), hi))
        return float(min(max(m * round(batch / m), lo), hi))

    def kappa_at(self, epoch: float) -> float:
        return self.batch_at(epoch) / self.base

    def stages(self) -> list[Stage]:
        """Consecutive epochs with the same batch merged into one stage."""
        if self.axis == "base_steps":
            p, end = float(self.spec["base_step"]), float(self.total_steps or math.inf)
            k0 = float(self.spec.get("from_kappa") or 1.0)
            return [Stage(0.0, p, self.base * k0, k0, self.axis), Stage(p, end, self.base * self.kappa, self.kappa,
                                                                        self.axis)]
        if self.epochs is None or self.spec.get("kind", "constant") == "constant":
            return [Stage(0.0, float(self.epochs or math.inf), self.base * self.kappa, self.kappa)]
        out: list[Stage] = []
        n, e = int(math.ceil(self.epochs)), 0
        while e < n:
            b = self.batch_at(e)
            last = self._last_epoch_at(b, e, n)
            out.append(Stage(float(e), float(min(last + 1, self.epochs)), b, b / self.base))
            if len(out) > MAX_STAGES:
                raise UserError(f"progressive {self.spec['kind']}: more than {MAX_STAGES:,} stages (one per batch "
                                f"size the ramp passes through, each a plan of its own); use a shorter ramp or a "
                                f"larger batch_multiple")
            e = last + 1
        return out

    def _last_epoch_at(self, b: float, e: int, n: int) -> int:
        """The last epoch before `n` whose batch is still `b`, given batch_at(e) == b. The batch never shrinks
        with the epoch (every kind grows from B or from_kappa·B to κB), so the epochs at one batch are
        consecutive: found by doubling then halving, not by visiting each of `schedule.epochs` (1e9) epochs."""
        lo, step = e, 1  # batch_at(lo) == b
        while lo + step < n and self.batch_at(lo + step) == b:
            lo, step = lo + step, step * 2
        hi = min(lo + step, n)  # batch_at(hi) != b, or hi == n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.batch_at(mid) == b else (lo, mid)
        return lo
