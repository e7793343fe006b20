"""What `emarule run` hands a task: the resolved spec and its typed config, κ, the plan, and where to write.

Pure Python (no torch) so the CLI can build it before choosing a task.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from emarule.config.typed import Section, typed
from emarule.scaling import Plan


@dataclass
class RunContext:
    spec: dict  # the resolved spec, as hparams.json records it
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
    resume_hint: str | None = None  # how to continue the run when it is not `--resume` (a sweep's)
    warnings: tuple = ()  # the plan's warnings, said on stderr once the run's own checks have passed
    # Engine settings that are not part of a recipe (tests and benchmarks set them, `--num-workers` the last;
    # a task may set the first):
    checkpoint_every_epochs: float = 1.0
    checkpoint_every_minutes: float = 30.0
    log_every_steps: int = 0  # 0: every ⌈S/50⌉ steps of an epoch of S (docs/cli.md)
    num_workers: int | None = None  # DataLoader workers; None: the task's (TaskParts.num_workers), else the loop's
    cfg: Section | None = None  # the typed config of `spec` (emarule/config/typed.py); made from it when not given
    # A sweep's runs that leave κ=1 start from their seed's baseline there (emarule/engine/fork.py): the baseline
    # gets one `fork.Offer` per point to keep a snapshot at, such a run the baseline's directory.
    forks: tuple = ()
    fork_from: Path | None = None

    def __post_init__(self):
        if self.cfg is None:
            self.cfg = typed(self.spec)

    @property
    def experiment(self) -> str:
        return self.spec["name"]

    def say_warnings(self) -> None:
        """The plan's warnings on stderr; the caller says them on the main rank, once the run's checks passed."""
        for w in self.warnings:
            print(f"warning: {w}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RuleNames:
    """Every name one form of the EMA rule goes by, so that they are spelled in one place."""

    rule: str | None  # the plan's ema_rule: "exponential", "linear", or None (the baseline without it)
    word: str  # `emarule sweep --rule` word and compare's short label
    tag: str  # in run-directory names
    label: str  # in sweep progress lines, compare legends and tables
    plan: str  # in `emarule plan` titles


EMA_RULE_NAMES = (
    RuleNames("exponential", "with", "rule", "with EMA rule", "EMA rule ρ^κ"),
    RuleNames(None, "without", "norule", "without EMA rule", "without the EMA rule"),
    RuleNames("linear", "linear", "linrule", "linear EMA rule", "linear EMA rule"),
)


def rule_names(rule: str | None) -> RuleNames:
    for r in EMA_RULE_NAMES:
        if r.rule == rule:
            return r
    return RuleNames(rule, str(rule), str(rule), f"{rule} EMA rule", f"{rule} EMA rule")


def rule_from_word(word: str) -> str | None:
    """`with` → "exponential", `without` → None, `linear` → "linear"; KeyError for anything else."""
    for r in EMA_RULE_NAMES:
        if r.word == word:
            return r.rule
    raise KeyError(word)


def rule_of_hparams(h: dict) -> str | None:
    """The rule a run used, from its hparams.json: a bool with the form beside it (what the engine
    writes, plan.as_dict style), or the form as a string or null (older and hand-made runs)."""
    r = h.get("ema_rule")
    if isinstance(r, bool):
        return (h.get("ema_rule_form") or "exponential") if r else None
    if r in (None, "", "none", "None"):
        plan = h.get("plan") or {}
        if isinstance(plan.get("ema_rule"), bool) and plan["ema_rule"]:
            return plan.get("ema_rule_form") or "exponential"
        return None
    return str(r)


def progressive_label(progressive: dict | None) -> str | None:
    """`step30`, `smooth120`, `incremental60`; None for constant κ. Used in run names and figures."""
    if not isinstance(progressive, dict) or progressive.get("kind", "constant") == "constant":
        return None
    kind = progressive["kind"]
    first = progressive.get("epoch", progressive.get("start_epoch"))
    return f"{kind}{first:g}" if isinstance(first, (int, float)) else str(kind)


def default_run_name(kappa: float, ema_rule: str | None, seed: int, progressive: dict | None,
                     preset: str | None = None, arm: str | None = None) -> str:
    """`tiny-k4-rule-s0`, `k4-norule-s0`, `cpu-k8-rule-step30-s0`: the preset first, so that runs of
    different presets never share a directory; sortable and readable in `compare`. A reproduction's
    arm adds `arm-<name>` before the seed (`cpu-k2-rule-arm-bn-scale-s0`), so that an arm that differs
    from a standard setting only by `--set` gets a directory of its own."""
    parts = [preset] if preset else []
    parts += [f"k{kappa:g}", rule_names(ema_rule).tag]
    label = progressive_label(progressive)
    if label:
        parts.append(label)
    if arm:
        parts.append(f"arm-{arm}")
    parts.append(f"s{seed}")
    return "-".join(parts)
