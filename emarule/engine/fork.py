"""A Progressive Scaling run starts from its seed's κ=1 baseline where its schedule first leaves κ=1.

Until that step the run is its baseline, bit for bit: the same spec and seed, so the same data order, the same
κ=1 plan (an EMA rule changes nothing at κ=1, ρ¹ = ρ) and the same random draws. A sweep therefore has each
baseline keep a snapshot at every point where a run of its seed leaves κ=1 (`fork-<key>.pt` in the baseline's
directory, a checkpoint as `checkpoint.save` writes one), and such a run, started fresh, copies the snapshot and
the baseline's log up to it and goes on from there as a resumed run would. Its hparams.json names the baseline
and the point (`forked_from`, with the bytes of the log it copied: those rows keep the baseline's `wall_s`,
which a reader of the run's own training time leaves out, `copied_bytes`).

Nothing is assumed that is not checked: the snapshot must carry this run's key (its κ and schedule, which fix
where it leaves κ=1) and have been taken where this run leaves κ=1, the baseline's spec and seed must be this
run's, every stage of this run in force before that point must hold the baseline's plan values, the task must
build the same state at both κ, the model and EMAs must hold the same tensors, and the copied log must be the
bytes the snapshot recorded. Bit for bit holds as for `--resume`: on the CPU, in one process, with the same
world size and device batch (another world size reseeds the random streams). Where any of this fails, or the
baseline kept no snapshot (it was trained by an earlier invocation, or is still short of the point), the run
trains from the start, as it always could.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from emarule.config.identity import comparable
from emarule.engine.preflight import without_world
from emarule.scaling import Plan

PREFIX = "fork-"


def key(plan: Plan) -> str:
    """What fixes where a run leaves κ=1: its κ and its schedule (less the world size's batch multiple)."""
    text = json.dumps({"kappa": plan.kappa, "progressive": without_world(plan.progressive)}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def path(run_dir: Path, k: str) -> Path:
    return Path(run_dir) / f"{PREFIX}{k}.pt"


def leaves_kappa_one(plan: Plan) -> bool:
    """Whether the plan starts at κ=1 and leaves it: a run that can start from its baseline."""
    return bool(plan.stages) and plan.at(0.0).kappa == 1.0 and any(p.kappa != 1.0 for _, p in plan.stages)


def in_force_from(plan: Plan, stage) -> float:
    """Where the loop first looks up `stage` on the plan's axis: on the epoch axis a stage holds whole epochs
    (`Plan.at` reads ⌊t⌋), so one that starts inside an epoch is in force from the next whole one."""
    return math.ceil(stage.start_epoch - 1e-9) if plan.stages[0][0].axis == "epochs" else stage.start_epoch


def first_leave(plan: Plan) -> float:
    """Where the loop first runs a stage away from κ=1, on the plan's stage axis."""
    return min(in_force_from(plan, stage) for stage, p in plan.stages if p.kappa != 1.0)


def time_on_axis(plan: Plan, seen: float, epoch_measure: float, base_batch: float) -> float:
    """Where data seen `seen` lies on the plan's stage axis (epochs or base steps), as the loop reads it."""
    return seen / base_batch if plan.stages[0][0].axis == "base_steps" else seen / epoch_measure


def values(plan: Plan) -> dict:
    """The plan's scaled values as a record holds them (JSON's types), so a snapshot's and a run's compare."""
    return json.loads(json.dumps({k: v.scaled for k, v in plan.values.items()}, default=str))


def spec_of(ctx) -> dict:
    """The run's spec as far as what it computes (`config.identity.comparable`), in JSON's types."""
    return comparable(json.loads(json.dumps(ctx.spec, default=str)))


@dataclass
class Offer:
    """A snapshot a baseline keeps for the runs that leave κ=1 under `plan`."""

    key: str
    plan: Plan


def offers(plans: list[Plan]) -> tuple[Offer, ...]:
    """One offer per distinct key among `plans` that start at κ=1 and leave it (`refusal` checks the rest when a
    run starts from the snapshot)."""
    out: dict[str, Offer] = {}
    for p in plans:
        if leaves_kappa_one(p) and key(p) not in out:
            out[key(p)] = Offer(key(p), p)
    return tuple(out.values())


def record(ctx, task_state: dict | None) -> dict:
    """What a snapshot says about the baseline that kept it, which the run starting from it checks against its own:
    spec, seed, κ, the κ=1 plan's values, and the task's state as the task built it, before any step (a task whose
    state depends on κ, such as pseudo-labeling's start rule, builds another one at another κ)."""
    return {"spec": spec_of(ctx), "seed": ctx.seed, "kappa": ctx.kappa, "plan": values(ctx.plan.at(0.0)),
            "task_state": task_state}


def same_state(a, b) -> bool:
    """Equality of nested state dicts, tensors compared bit for bit."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def refusal(ck: dict, ctx, k: str, task_state: dict | None) -> str:
    """Why the snapshot `ck` cannot start the run `ctx`, whose task built `task_state` ("" when it can)."""
    f = ck.get("fork") if isinstance(ck, dict) else None
    if not isinstance(f, dict):
        return "it is not a baseline's snapshot"
    if k not in (f.get("keys") or ()):
        return "it was kept for another schedule"
    base = f.get("baseline") or {}
    if base.get("kappa") != 1.0 or base.get("seed") != ctx.seed:
        return "its baseline is not this seed's κ=1 run"
    if base.get("spec") != spec_of(ctx):
        return "its baseline was made with another spec"
    t = f.get("at")
    if not isinstance(t, (int, float)):
        return "it does not record where it was taken"
    # on the epoch axis the loop leaves κ=1 at a whole epoch exactly; on the base-step axis at the first step at
    # or after the stage's start, less than one base step (one κ=1 step) after it
    leave = first_leave(ctx.plan)
    after = 1e-6 if ctx.plan.stages[0][0].axis == "epochs" else 1.0 - 1e-9
    if not leave - 1e-6 <= t < leave + after:
        return "it was not taken where this run leaves κ=1"
    # the stages in force before the run leaves κ=1: the stage it leaves to may start between two steps, before t
    if any(values(p) != base.get("plan") for stage, p in ctx.plan.stages
           if in_force_from(ctx.plan, stage) < leave - 1e-9):
        return "this run's plan differs from the baseline's before that point"
    if not same_state(base.get("task_state"), task_state):
        return "this run's task starts in another state than the baseline's"
    return ""


def link(kept: Path, target: Path) -> None:
    """`target` as a second name of the snapshot file `kept` (a copy where the file system has no hard links)."""
    import os
    import shutil

    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(kept, tmp)
    except OSError:
        shutil.copyfile(kept, tmp)
    os.replace(tmp, target)


def copy_log(src: Path, dst: Path, recorded: dict) -> int:
    """The baseline's log up to the snapshot (the bytes it recorded, checked) into `dst`; returns their count.
    ValueError where the log no longer holds those bytes."""
    from emarule.engine.rundir import atomic_write_bytes

    data = Path(src).read_bytes()[: int(recorded["bytes"])]
    if len(data) != int(recorded["bytes"]) or hashlib.sha256(data).hexdigest() != recorded["sha256"]:
        raise ValueError("the baseline's log changed since the snapshot")
    atomic_write_bytes(Path(dst), data)
    return len(data)


def copied_bytes(hparams: dict) -> int:
    """How much of a forked run's log is the baseline's rows, copied (0 for a run trained from the start)."""
    f = hparams.get("forked_from") if isinstance(hparams, dict) else None
    n = f.get("log_bytes") if isinstance(f, dict) else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
