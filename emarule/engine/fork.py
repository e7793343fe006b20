"""A Progressive Scaling run starts from its seed's κ=1 baseline where its schedule first leaves κ=1.

Until that step the run is its baseline, bit for bit: the same spec and seed, so the same data order, the
same κ=1 plan (an EMA rule changes nothing at κ=1, ρ¹ = ρ) and the same random draws. A sweep therefore has
each baseline keep a snapshot at every point where a run of its seed leaves κ=1 (`fork-<key>.pt` in the
baseline's directory, a checkpoint as `checkpoint.save` writes one), and such a run, started fresh, copies
the snapshot and the baseline's log up to it and goes on from there as a resumed run would. Its
hparams.json names the baseline and the point (`forked_from`), and the rows it copied keep the baseline's
`wall_s`, which a reader of the run's own training time leaves out (`copied_wall_s`).

Nothing is assumed that is not checked: the snapshot must carry this run's key (its κ and schedule, which
fix where it leaves κ=1), the baseline's spec and seed must be this run's, every stage of this run before
that point must hold the baseline's plan values, and the copied log must be the bytes the snapshot
recorded. Where any of this fails, or the baseline kept no snapshot (it was trained by an earlier
invocation, or is still short of the point), the run trains from the start, as it always could.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from emarule.engine.preflight import comparable, without_world
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


def first_leave(plan: Plan) -> float:
    """Where the plan's first stage away from κ=1 starts, on its stage axis."""
    return min(stage.start_epoch for stage, p in plan.stages if p.kappa != 1.0)


def time_on_axis(plan: Plan, seen: float, epoch_measure: float, base_batch: float) -> float:
    """Where data seen `seen` lies on the plan's stage axis (epochs or base steps), as the loop reads it."""
    return seen / base_batch if plan.stages[0][0].axis == "base_steps" else seen / epoch_measure


def scaled_values(plan: Plan) -> dict:
    return {k: v.scaled for k, v in plan.values.items()}


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


def record(ctx) -> dict:
    """What a snapshot says about the baseline that kept it: the forked run checks it against its own."""
    return {"spec": comparable(json.loads(json.dumps(ctx.spec, default=str))), "seed": ctx.seed,
            "kappa": ctx.kappa, "plan": json.loads(json.dumps(scaled_values(ctx.plan.at(0.0)), default=str))}


def refusal(ck: dict, ctx, k: str) -> str:
    """Why the snapshot `ck` cannot start the run `ctx` ("" when it can)."""
    f = ck.get("fork") if isinstance(ck, dict) else None
    if not isinstance(f, dict):
        return "it is not a baseline's snapshot"
    if f.get("key") != k:
        return "it was kept for another schedule"
    base = f.get("baseline") or {}
    if base.get("kappa") != 1.0 or base.get("seed") != ctx.seed:
        return "its baseline is not this seed's κ=1 run"
    if base.get("spec") != comparable(json.loads(json.dumps(ctx.spec, default=str))):
        return "its baseline was made with another spec"
    want = base.get("plan")
    t = f.get("at")
    if not isinstance(t, (int, float)):
        return "it does not record where it was taken"
    # the plans in force before that point, as the loop looks them up (a stage may start inside an epoch that the
    # epoch axis gives whole to the stage before it)
    if any(json.loads(json.dumps(scaled_values(ctx.plan.at(stage.start_epoch)), default=str)) != want
           for stage, _ in ctx.plan.stages if stage.start_epoch < t):
        return "this run's plan differs from the baseline's before that point"
    if ctx.plan.at(t).kappa == 1.0:
        return "this run does not leave κ=1 there"
    return ""


def copy_log(src: Path, dst: Path, recorded: dict) -> float:
    """The baseline's log up to the snapshot (the bytes it recorded, checked) into `dst`; returns the last
    copied row's `wall_s`, the baseline's time that those rows stand for. ValueError where the log no longer
    holds those bytes."""
    from emarule.engine.rundir import atomic_write_bytes

    data = Path(src).read_bytes()[: int(recorded["bytes"])]
    if len(data) != int(recorded["bytes"]) or hashlib.sha256(data).hexdigest() != recorded["sha256"]:
        raise ValueError("the baseline's log changed since the snapshot")
    atomic_write_bytes(Path(dst), data)
    wall = 0.0
    for line in data.decode().splitlines():
        w = json.loads(line).get("wall_s")
        if isinstance(w, (int, float)) and not isinstance(w, bool):
            wall = float(w)
    return wall


def copied_wall_s(hparams: dict) -> float:
    """The baseline's time that a forked run's copied rows stand for (0 for a run trained from the start)."""
    f = hparams.get("forked_from") if isinstance(hparams, dict) else None
    w = f.get("wall_s") if isinstance(f, dict) else None
    return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else 0.0
