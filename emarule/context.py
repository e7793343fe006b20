"""What `emarule run` hands a task: the resolved spec, κ, the plan, and where to write.

Pure Python (no torch) so the CLI can build it before choosing a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from emarule.scaling import Plan


@dataclass
class RunContext:
    spec: dict
    kappa: float
    ema_rule: str | None  # "exponential", "linear", or None for the baseline without the rule
    plan: Plan
    out: Path  # the run directory
    progressive: dict | None = None
    preset: str | None = None
    data: Path | None = None
    resume: bool = False
    seed: int = 0
    wandb: str = "off"  # off | offline | online
    max_device_batch: int | None = None
    quiet: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def experiment(self) -> str:
        return self.spec["name"]


def progressive_label(progressive: dict | None) -> str | None:
    """`step30`, `smooth120`, `incremental60`; None for constant κ. Used in run names and figures."""
    if not isinstance(progressive, dict) or progressive.get("kind", "constant") == "constant":
        return None
    kind = progressive["kind"]
    first = progressive.get("epoch", progressive.get("start_epoch"))
    return f"{kind}{first:g}" if isinstance(first, (int, float)) else str(kind)


def default_run_name(kappa: float, ema_rule: str | None, seed: int, progressive: dict | None) -> str:
    """`k4-rule-s0`, `k4-norule-s0`, `k8-rule-step30-s0`: sortable and readable in `compare`."""
    parts = [f"k{kappa:g}", "norule" if ema_rule is None else ("rule" if ema_rule == "exponential" else "linrule")]
    label = progressive_label(progressive)
    if label:
        parts.append(label)
    parts.append(f"s{seed}")
    return "-".join(parts)
