"""When continuous pseudo-labeling starts (§3.3, App. G), and the task state that records it.

Two ways to start, chosen by `pseudo_label.start`:

- steps: after `pretrain_steps` base steps (20k; 20k/κ optimizer steps), the EMA having accumulated
  from `ema.start_steps` (19k) on — the engine's EMA start. The paper's choice for κ ≤ 2.
- wer: the paper's heuristic for κ > 2: pre-training continues until the target's dev WER reaches
  the baseline's dev WER at the baseline's own start. The EMA's start moves with it: accumulation
  starts when the threshold is reached, and pseudo-labeling follows (pretrain_steps − ema.start_steps)
  base steps later, the same lead as in the baseline (1k steps).
- either way in wer mode, `latest_start_steps` (not the paper's; null by default) bounds the wait:
  a run whose pre-training never reaches the threshold starts there anyway, so that pseudo-labeling
  is still measured (the paper's runs all reached it, at 24k/κ and 29k/κ base steps).
- auto (default): steps for κ ≤ 2, wer for κ > 2 when a threshold is known (`start_wer`, or
  `start_wer_from` a baseline run directory, or the κ=1 run of the same preset and seed beside this
  run, as `emarule sweep` lays them out), else steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from emarule.errors import UserError

METRICS = "metrics.jsonl"
HPARAMS = "hparams.json"


class Phase:
    """Checkpointed: whether pseudo-labeling is on, and when things started (in base steps)."""

    def __init__(self, mode: str, pretrain_steps: float, ema_lead: float, threshold: float | None,
                 latest: float | None = None):
        self.mode, self.pretrain_steps, self.ema_lead, self.threshold = mode, pretrain_steps, ema_lead, threshold
        self.latest = latest  # base step by which pseudo-labeling starts in wer mode, threshold or not
        self.reason: str | None = None  # why the EMA (and then pseudo-labeling) started, in wer mode
        self.pseudo_labeling = False
        self.ema_started_at: float | None = None  # base step (wer mode)
        self.started_at: float | None = None  # base step at which pseudo-labeling began
        self.last_dev_wer: float | None = None  # the target's, from the latest main-split evaluation
        self.on_start = None  # called when pseudo-labeling starts, and again on resuming a run past it

    def due(self, base_step: float) -> bool:
        """Whether pseudo-labeling starts now (after this step)."""
        if self.pseudo_labeling:
            return False
        if self.mode == "steps":
            return base_step >= self.pretrain_steps - 1e-9
        return self.ema_started_at is not None and base_step >= self.ema_started_at + self.ema_lead - 1e-9

    def threshold_reached(self, base_step: float) -> bool:
        """Whether the EMA starts now (wer mode): the dev WER reached the threshold, or the wait is over."""
        if self.mode != "wer" or self.ema_started_at is not None:
            return False
        if self.last_dev_wer is not None and self.last_dev_wer <= self.threshold:
            self.reason = "wer"
            return True
        if self.latest is not None and base_step >= self.latest - self.ema_lead - 1e-9:
            self.reason = "latest_start_steps"
            return True
        return False

    def state_dict(self) -> dict:
        return {"pseudo_labeling": self.pseudo_labeling, "ema_started_at": self.ema_started_at,
                "started_at": self.started_at, "last_dev_wer": self.last_dev_wer, "mode": self.mode,
                "threshold": self.threshold, "reason": self.reason}

    def load_state_dict(self, state: dict) -> None:
        self.pseudo_labeling = bool(state["pseudo_labeling"])
        self.ema_started_at, self.started_at = state["ema_started_at"], state["started_at"]
        self.last_dev_wer = state["last_dev_wer"]
        self.reason = state.get("reason")
        if self.pseudo_labeling and self.on_start is not None:
            self.on_start()

    def start(self, base_step: float) -> None:
        self.pseudo_labeling, self.started_at = True, base_step
        if self.on_start is not None:
            self.on_start()


def baseline_wer(run: Path, pretrain_steps: float) -> float:
    """The target's main dev WER of a κ=1 run at its start of pseudo-labeling: its first evaluation at or
    after `pretrain_steps` base steps (evaluations every k base steps, k dividing pretrain_steps, hit it)."""
    run = Path(run)
    try:
        hp = json.loads((run / HPARAMS).read_text())
        rows = [json.loads(line) for line in (run / METRICS).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        raise UserError(f"pseudo_label.start_wer_from {run}: no readable {HPARAMS} and {METRICS}; point it at a "
                        f"finished κ=1 run of this experiment or give pseudo_label.start_wer") from None
    base = float(hp["spec"]["batch"]["size"])
    if not math.isclose(float(hp.get("kappa", 1.0)), 1.0):
        raise UserError(f"pseudo_label.start_wer_from {run}: a κ={hp.get('kappa')} run; the threshold comes from "
                        f"the κ=1 baseline")
    # its start is the first step past pretrain_steps base steps, and an evaluation due then runs at that step
    evals = [r for r in rows if r.get("kind") == "eval" and "wer" in r and "seconds_seen" in r
             and r["seconds_seen"] / base >= pretrain_steps - 1e-6]
    if not evals:
        raise UserError(f"pseudo_label.start_wer_from {run}: no dev WER logged from base step {pretrain_steps:g} "
                        f"on; let the baseline run past its pre-training or give pseudo_label.start_wer")
    return float(min(evals, key=lambda r: r["seconds_seen"])["wer"])


def choose(pl, kappa: float, out: Path | None, sibling: Path | None, pretrain_steps: float):
    """(mode, threshold or None, where the threshold came from) for this run, from the typed config's
    `pseudo_label` section (`ctx.cfg.pseudo_label`)."""
    mode, wer, src = pl.start, pl.start_wer, pl.start_wer_from
    if mode == "steps" or (mode == "auto" and kappa <= 2 + 1e-9):
        return "steps", None, None
    if wer is not None:
        return "wer", float(wer), "pseudo_label.start_wer"
    if src:
        return "wer", baseline_wer(Path(src), pretrain_steps), str(src)
    if sibling is not None and (sibling / METRICS).is_file() and sibling != out:
        return "wer", baseline_wer(sibling, pretrain_steps), str(sibling)
    if mode == "wer":
        raise UserError("pseudo_label.start wer needs a threshold: give pseudo_label.start_wer (a dev WER in %) "
                        "or pseudo_label.start_wer_from (a κ=1 run directory)")
    return "steps", None, None
