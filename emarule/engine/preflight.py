"""What a run checks before it writes anything, shared by the loop and the sweep: every stage's plan, the
training set's order and measure, that each stage's batch fits it, that a run continued in a directory
was made with the same settings (its fingerprint), and that its hparams.json is the record the run wrote."""

from __future__ import annotations

from emarule.engine import batching
from emarule.engine.clock import measure_for
from emarule.engine.context import RunContext
from emarule.config.identity import comparable
from emarule.engine.interface import TaskParts
from emarule.errors import UserError

EPS = 1e-6


def stage_plans(ctx: RunContext) -> list:
    """(stage, plan) for every stage the run goes through: the plan's stages, or its one plan."""
    return list(ctx.plan.stages) if ctx.plan.stages else [(None, ctx.plan)]


def make_batcher(ctx: RunContext, parts: TaskParts) -> batching.Batcher:
    """The training set's order and measure (its size, or its seconds of audio)."""
    n = len(parts.train_set)
    if n < 1:
        raise UserError("task error: the training set is empty")
    durations = measure_for(ctx.cfg.batch.unit).durations(parts, n, ctx.experiment)
    return batching.Batcher(n, ctx.seed, durations, int(ctx.cfg.batch.sort_window))


def check_batches_fit(ctx: RunContext, batcher: batching.Batcher, world_size: int) -> None:
    """Every stage's batch fits the world size and the data set (checked before anything is written)."""
    unit = ctx.cfg.batch.unit
    for _, p in stage_plans(ctx):
        lay = batching.layout(p["batch_size"], world_size, ctx.max_device_batch, unit)
        if lay.global_batch > batcher.epoch_measure + EPS:
            raise UserError(f"the batch κB = {lay.global_batch:g} is larger than the training set "
                            f"({measure_for(unit).training_set(batcher)}); "
                            f"use a smaller κ or more data")
        if unit == batching.SECONDS and batcher.take(0, 0, lay.global_batch) is None:
            # every epoch's padded cost is the same (n × the longest item): none would hold a step
            n, longest = batcher.n, max(batcher.durations)
            raise UserError(f"the batch κB = {lay.global_batch:.7g} s never fills: the training set's {n} items, "
                            f"padded to its longest ({longest:g} s), take {n * longest:.7g} s, less than κB, so "
                            f"every epoch ends before its first step; use a smaller κ (or --batch-size) or more data")


def fingerprint(ctx: RunContext) -> dict:
    """What must match for --resume to continue a run (not: world size, micro-batch, logging, nor
    data.skip_bad_items: a run stopped by a file that fails to decode continues with it turned on)."""
    spec = without_skip_flag({k: v for k, v in ctx.spec.items() if k not in ("source",)})
    return {"spec": spec, "kappa": ctx.kappa, "ema_rule": ctx.ema_rule, "seed": ctx.seed,
            "progressive": without_world(ctx.progressive)}


def without_skip_flag(spec: dict) -> dict:
    """The spec less data.skip_bad_items, which a resumed run may turn on (a copy where it was there)."""
    if isinstance(spec.get("data"), dict) and "skip_bad_items" in spec["data"]:
        return {**spec, "data": {k: v for k, v in spec["data"].items() if k != "skip_bad_items"}}
    return spec


def without_world(progressive):
    """The schedule less the multiple its ramp batches took from the world size (`plan`'s batch_multiple): a
    run resumes on another number of processes, and its remaining ramp batches follow that number. A
    multiple the spec sets stays in the spec, and is compared there."""
    if isinstance(progressive, dict) and "batch_multiple" in progressive:
        return {k: v for k, v in progressive.items() if k != "batch_multiple"}
    return progressive


def differences(a, b, prefix: str = "") -> list[str]:
    """Dotted names of the values that differ between two nested dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if a == b else [prefix or "(root)"]


def check_same_settings(ctx: RunContext, fp: dict | None, fix: str | None = None) -> None:
    """A run continued in `ctx.out` was made with these settings (`fp`: its recorded fingerprint). `fix`: what
    the error tells the user to do, where the caller is neither a sweep nor --resume."""
    import json

    def plain(x):  # as hparams.json holds it: tuples as lists, on both sides
        return json.loads(json.dumps(x))

    def compared(f):
        spec = f.get("spec") if isinstance(f, dict) else None
        f = {**f, "progressive": without_world(f.get("progressive"))} if isinstance(f, dict) else f
        return {**f, "spec": comparable(spec)} if isinstance(spec, dict) else f

    ours, theirs = plain(fingerprint(ctx)), plain(fp or {})
    spec = theirs.get("spec") if isinstance(theirs, dict) else None
    other = spec.get("name") if isinstance(spec, dict) else None
    if isinstance(other, str) and other != ctx.experiment:  # another experiment's run: say whose
        how = fix or ("give the sweep a new --out or remove that run" if ctx.resume_hint else
                      f"pass --out with a {ctx.experiment} run's directory, or a new --out")
        raise UserError(f"{'' if ctx.resume_hint or fix else '--resume: '}{ctx.out} holds a run of {other}, not "
                        f"{ctx.experiment}; {how}")
    diff = differences(compared(theirs), compared(ours))
    if diff:
        shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
        if fix:
            raise UserError(f"{ctx.out} was made with other settings ({shown} differ); {fix}")
        if ctx.resume_hint:  # a sweep continuing what its root holds
            raise UserError(f"{ctx.out} was made with other settings ({shown} differ); give the sweep a new --out "
                            f"or remove that run")
        raise UserError(f"--resume: {ctx.out} was made with other settings ({shown} differ); use the original "
                        f"command or a new --out")


# How a run executes, not what it computes: these may change from one --resume to the next.
EXECUTION_KEYS = frozenset({"layout", "world_size", "max_device_batch", "device", "num_workers", "torch", "python",
                            "sync_bn_effective", "data"})


def check_record(ctx: RunContext, copy: dict | None) -> None:
    """hparams.json says what the checkpoint's own copy says: a record edited, deleted or damaged after
    the run wrote it would make the summary and `compare` report settings the run did not use."""
    import json

    from emarule.engine.rundir import HPARAMS, jsonable

    if copy is None:  # a checkpoint written before checkpoints kept a copy
        return
    p = ctx.out / HPARAMS
    fix = "put back the file the run wrote (the checkpoint keeps a copy, see docs/faults.md) or start a new run " \
          "with --out NEW_DIR"
    if not p.is_file():
        raise UserError(f"--resume: {p} is missing; {fix}")
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        why = "not valid JSON" if isinstance(e, ValueError) else (e.strerror or str(e))
        raise UserError(f"--resume: {p} is corrupt ({why}); {fix}") from None
    if not isinstance(record, dict):
        raise UserError(f"--resume: {p} is corrupt (not a JSON object); {fix}")
    ours = json.loads(json.dumps(jsonable(copy)))
    diff = differences(_resumable_record(ours), _resumable_record(record))
    if diff:
        shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise UserError(f"--resume: {p} was edited after the run wrote it ({shown} differ from the checkpoint's "
                        f"copy); {fix}")


def _resumable_spec(spec: dict) -> dict:
    """A spec as `--resume` compares it (`comparable`, less data.skip_bad_items as `fingerprint` leaves it)."""
    kept = comparable(spec)
    out = without_skip_flag(kept)
    if out is not kept and not out["data"]:  # a section that held only the flag computes what none does
        out = {k: v for k, v in out.items() if k != "data"}
    return out


def _resumable_record(record: dict) -> dict:
    """A run's record less what a `--resume` may change: how it executes (`EXECUTION_KEYS`), and in its spec (and
    its fingerprint's) what `--resume` does not compare. A resume that changed those rewrites hparams.json at once,
    while the checkpoint's copy changes only at its next save, so a stop in between must not read as an edit."""
    out = {k: v for k, v in record.items() if k not in EXECUTION_KEYS}
    if isinstance(out.get("spec"), dict):
        out["spec"] = _resumable_spec(out["spec"])
    fp = out.get("fingerprint")
    if isinstance(fp, dict) and isinstance(fp.get("spec"), dict):
        out["fingerprint"] = {**fp, "spec": _resumable_spec(fp["spec"])}
    return out


def check_record_if_edited(ctx: RunContext) -> None:
    """hparams.json names other settings than this run's. Where the checkpoint's own copy of the record names
    this run's, the run was made with them and the file was edited since: that is the line to give
    (`check_record`'s), not "made with other settings", whose fix (a new --out) would train the run again."""
    import torch

    from emarule.engine.rundir import CHECKPOINT

    try:
        copy = torch.load(ctx.out / CHECKPOINT, map_location="cpu", weights_only=False, mmap=True).get("record")
        check_same_settings(ctx, copy.get("fingerprint"))
    except Exception:  # no readable copy, or the run was made with other settings indeed
        return
    check_record(ctx, copy)
