"""The training loop shared by every task: `train(ctx, parts) -> final metrics`, one visible loop.

Each step reads stage → batch → lr → step → log, evaluate, checkpoint. Time is the clock of data seen, in
the batch's unit (samples, or seconds of audio; emarule/engine/clock.py); every cadence (evaluations,
checkpoints by epoch and by wall time, log rows) is a `Cadence` (emarule/engine/cadence.py). The data feed
is emarule/engine/feed.py, the optimizer step and its one collective emarule/engine/step.py. Below the loop:
setup (every check before the first file), opening a fresh or resumed run, and what each phase calls.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from emarule.config.typed import Config, config_of
from emarule.engine import batching, checkpoint, distributed, evaluation, fork, optimizers, runlock, schedules
from emarule.engine.baditems import SKIP_KEY, ItemError
from emarule.engine.cadence import BATCHES, EPOCHS, SECONDS, Cadence
from emarule.engine.clock import Clock, Measure, measure_for
from emarule.engine.context import RunContext
from emarule.engine.ema import ModelEma
from emarule.engine.feed import Batch, Feed
from emarule.engine.interface import MAIN_EMA, Now, TaskParts
from emarule.engine.preflight import (check_batches_fit, check_record, check_same_settings, fingerprint, make_batcher,
                                      stage_plans)
from emarule.engine.progress import Progress, Window
from emarule.engine.rundir import (FIGURES, METRICS, UNSAVED, DiskFull, MetricsLog, atomic_write_text, holds_a_run,
                                   nothing_to_resume, write_hparams)
from emarule.engine.seeding import mix
from emarule.engine.step import StepOutcome, optimizer_step
from emarule.errors import TrainingDiverged, UserError
from emarule.scaling import BatchSchedule
from emarule.scaling.plan import extra_ema_name

EPS = 1e-6


def train(ctx: RunContext, parts: TaskParts) -> dict:
    """Train `parts.model` as `ctx` says; returns the final metrics."""
    dist = distributed.setup()
    try:
        run = setup(ctx, parts, dist)  # every check that can refuse the run, before its first file
        with runlock.lock_dir(ctx.out, "run", enabled=dist.is_main), one_line_errors(run):
            log = MetricsLog(ctx.out, enabled=dist.is_main)
            if not open_run(run, log):  # a resumed run that had finished
                log.close()
                return run.final
            with stops_cleanly(run, log, Progress(run.total, run.clock.seen, unit=run.unit,
                                                  enabled=dist.is_main and not ctx.quiet)) as (stop, progress):
                loop(run, log, progress, stop)
                finish(run, log)
            return run.final
    finally:
        distributed.teardown()


def loop(run: Run, log: MetricsLog, progress: Progress, stop: checkpoint.StopSignal) -> None:
    while run.clock.seen < run.total - EPS:
        if run.forks:  # a baseline: the state where a run of its seed leaves κ=1
            keep_snapshots(run, log)
        enter_stage(run, run.ctx.plan.at(schedule_time(run)).kappa)  # stage
        batch = run.feed.next_batch(run.clock, run.layout)  # batch
        if batch is None:
            end_epoch(run)
            continue
        lr = set_lr(run, batch)  # lr
        step = optimizer_step(run, batch, lambda: stop.requested, checkpoint_time_due(run))  # step
        if step.problem:
            raise diverged(run, f"{step.problem} in the batch")
        # one process: a signal that came later in the step stops it too (no other rank to agree with)
        stop_now = step.agreed.stop or (run.dist.world_size == 1 and stop.requested)
        index = advance_clock(run, batch.items, batch.seen_after)
        at_end = run.clock.seen >= run.total - EPS
        count_step(run, step, progress)
        if row_due(run, batch, index, at_end):  # log
            log_train(run, log, lr, progress)
        if batch.ends_epoch:
            end_epoch(run)
        evaluate_due(run, log, at_end)  # evaluate
        if not at_end and (run.checkpoints.due(run.epoch_now) or step.agreed.checkpoint_due or stop_now):
            save(run, log)  # checkpoint (at the end, the final one follows)
            run.checkpoints.start(run.epoch_now)
        if stop_now and not at_end:
            raise Interrupted(stop.signal_name)


def finish(run: Run, log: MetricsLog) -> None:
    """The evaluations not yet run at the last step, the final metrics and the final checkpoint."""
    if run.last_eval_at != run.clock.seen:
        evaluate_due(run, log, at_end=True)
    run.final = {**run.final, "samples_seen": run.clock.samples, "epoch": run.epoch_now,
                 "steps": run.clock.step, "kappa": run.kappa}
    run.final.update(run.measure.fields(run.clock))
    if run.feed.skip_bad:
        run.feed.sync_skipped(run.clock)
        run.final["skipped_items"] = run.clock.skipped
    save(run, log, finished=True)


@dataclass
class Run:
    """Everything the loop carries from one step to the next."""

    ctx: RunContext
    parts: TaskParts
    dist: distributed.Dist
    unit: str
    measure: Measure  # what the unit decides, decided once (emarule/engine/clock.py)
    base_batch: float
    batcher: batching.Batcher
    feed: Feed
    sched: schedules.Schedule
    batch_schedule: BatchSchedule  # Progressive Scaling: the batch size over the run
    total: float  # the run's length in the batch unit
    model: nn.Module
    source: nn.Module  # what the EMAs average
    emas: dict  # name -> ModelEma, the main one first
    optimizer: torch.optim.Optimizer
    precision: str
    sync_bn: bool
    aux_ids: frozenset
    workers: int
    evaluations: list  # (Evaluation, its Cadence in epochs)
    checkpoints: Cadence  # in epochs (RunContext.checkpoint_every_epochs)
    checkpoint_clock: Cadence  # in seconds of wall time (RunContext.checkpoint_every_minutes)
    rows: Cadence = field(default_factory=lambda: Cadence(1, BATCHES))  # train rows, in the epoch's batches
    window: Window = field(default_factory=Window)  # the steps the next train row averages; checkpointed
    kappa: float = 0.0
    plan: object = None
    layout: batching.BatchLayout | None = None
    clock: Clock = field(default_factory=Clock)
    final: dict = field(default_factory=dict)
    momenta: dict = field(default_factory=dict)  # the ρ each EMA used in the last step, by log name
    momentum_schedule: schedules.EmaMomenta | None = None  # each EMA's ρ̂ per stage, from the plan
    params: list = field(default_factory=list)  # model.parameters(), listed at each stage change, not each step
    last_eval_at: float = -1.0
    last_ckpt: tuple | None = None
    record: dict = field(default_factory=dict)  # what hparams.json holds; every checkpoint keeps a copy
    forks: list = field(default_factory=list)  # a baseline's snapshots still to keep (fork.Offer)
    forked: dict | None = None  # where a run that started from its baseline's snapshot took it up
    task_state0: dict | None = None  # the task's state before any step, where a snapshot is kept or taken up

    @property
    def epoch_measure(self) -> float:
        return self.batcher.epoch_measure

    @property
    def epoch_now(self) -> float:
        return self.clock.seen / self.epoch_measure

    def now(self) -> Now:
        c = self.clock
        return Now(seen=c.seen, samples=c.samples, epoch=self.epoch_now, base_step=c.seen / self.base_batch,
                   step=c.step, kappa=self.kappa, plan=self.plan, emas=self.emas, unit=self.unit)

    def autocast(self):
        if self.precision != "bf16":  # what autocast(enabled=False) does outside any autocast region, for free
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.dist.device.type, dtype=torch.bfloat16)


# --- setup: everything checked and built before the first file is written ----------------------


def seed_everything(seed: int, rank: int) -> None:
    """Dropout and other in-model randomness: one stream per rank, fixed by (seed, rank)."""
    s = mix(seed, rank, 0x5EED)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


def set_precision(precision: str) -> None:
    if torch.cuda.is_available():
        tf32 = precision in ("tf32", "bf16")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def set_bn_momentum(model: nn.Module, plan, accumulation: int = 1) -> None:
    """torch's BatchNorm momentum = 1 − ρ_BN (ρ_BN^κ when norm.bn_scale), per optimizer step.

    BatchNorm updates its running statistics on every forward, so with A micro-batches a step makes A
    updates: each one takes ρ_BN^(1/A), and the step's decay is the plan's whatever the device memory."""
    m = plan.get("norm.bn_torch_momentum")
    if m is None:
        return
    if accumulation > 1:
        m = -math.expm1(math.log1p(-m) / accumulation) if m < 1.0 else 1.0
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.momentum = m


def memory_format(cfg: Config) -> torch.memory_format:
    """The layout `memory_format` names. Set before the EMAs copy the model, so they share it (an EMA in
    another layout would average correctly, but its evaluations would run the slower kernels)."""
    return torch.channels_last if cfg.memory_format == "channels_last" else torch.contiguous_format


def build_emas(cfg: Config | dict, source: nn.Module, plan) -> dict:
    """The main EMA (`ema.momentum`) and one per `ema.also` momentum, each scaled by the plan."""
    ema = config_of(cfg).ema
    if ema.momentum is None:
        return {}
    names = [MAIN_EMA] + [extra_ema_name(r) for r in ema.also]
    # ema.start_steps counts base steps: the EMA starts after N × B of data at every κ and in every stage,
    # compared in samples (or seconds) as the other step-counted values are
    start = float(ema.start_steps or 0) * float(config_of(cfg).batch.size)
    emas = {}
    for name in names:
        key = schedules.momentum_key(name)
        if plan[key] >= 1.0:  # ρ^κ can round to 1 in float64; the plan warns, a run refuses
            raise UserError(f"{key}: ρ̂ = {plan[key]:g} at κ={plan.kappa:g} never "
                            f"moves the EMA; use a smaller ρ or a larger κ (see `emarule limits`)")
        e = ModelEma(source, plan[key], buffers=ema.buffers, start_samples=start, dtype=ema.dtype)
        e.module.train()
        emas[name] = e
    return emas


def check_ema_dtype(cfg) -> None:
    """The loop forwards its EMAs (a teacher, an evaluation) on the batch as the data gives it, in float32,
    through their BatchNorm statistics: an EMA held in a lower precision cannot take that input."""
    ema = config_of(cfg).ema
    if ema.momentum is not None and ema.dtype != "float32":
        raise UserError(f"ema.dtype {ema.dtype}: the training loop forwards its EMAs on float32 batches, which an "
                        f"EMA held in {ema.dtype} cannot take; drop ema.dtype (float32, the paper's setting, also "
                        f"under precision: bf16), or hold a low-precision EMA with emarule.ModelEma in your own loop")


def check_run_dir(ctx: RunContext, dist: distributed.Dist) -> None:
    """A fresh run needs a directory without a checkpoint; --resume one with it (or one stopped before it)."""
    has_checkpoint = checkpoint.path_in(ctx.out).exists()
    if ctx.resume and not has_checkpoint and (ctx.out / UNSAVED).exists():
        if dist.is_main:
            print(f"--resume: {ctx.out} stopped before its first checkpoint; starting it from the beginning",
                  file=sys.stderr)
        ctx.resume = False
    if ctx.resume and not has_checkpoint:
        raise nothing_to_resume(ctx.out)
    if not ctx.resume and has_checkpoint:
        raise holds_a_run(ctx.out)


def setup(ctx: RunContext, parts: TaskParts, dist: distributed.Dist) -> Run:
    cfg = ctx.cfg
    unit = cfg.batch.unit
    batcher = make_batcher(ctx, parts)
    base_batch = float(cfg.batch.size)
    sched = schedules.from_spec(cfg, batcher.epoch_measure)
    # the schedule in force: the spec's own, one given to the run, or none where the plan skipped it
    batches = BatchSchedule(ctx.plan.progressive, base_batch, ctx.kappa, cfg.schedule.epochs,
                            cfg.schedule.total_steps)
    batches.check_base_step_in_run(batcher.epoch_measure)
    check_batches_fit(ctx, batcher, dist.world_size)
    check_ema_dtype(cfg)
    check_run_dir(ctx, dist)

    precision = cfg.precision
    set_precision(precision)
    seed_everything(ctx.seed, dist.rank)
    sync_bn = distributed.sync_batchnorm_possible(bool(cfg.norm.sync_bn))
    model = distributed.maybe_sync_batchnorm(parts.model.to(dist.device, memory_format=memory_format(cfg)),
                                             bool(cfg.norm.sync_bn))
    parts.model = model
    distributed.broadcast_module_(model)
    model.train()
    source = parts.ema_source if parts.ema_source is not None else model
    plan = ctx.plan.at(0.0)
    emas = build_emas(cfg, source, plan)
    named = dict(model.named_parameters())
    workers = parts_workers(parts, ctx, dist)
    run = Run(ctx=ctx, parts=parts, dist=dist, unit=unit, measure=measure_for(unit), base_batch=base_batch,
              batcher=batcher, sched=sched, batch_schedule=batches, total=sched.total_epochs * batcher.epoch_measure,
              feed=Feed(batcher, parts, dist, ctx.seed, workers, bool("data" in cfg and cfg.data.skip_bad_items)),
              model=model, source=source, emas=emas,
              momentum_schedule=schedules.EmaMomenta.from_plan(ctx.plan, list(emas), MAIN_EMA),
              optimizer=optimizers.build(cfg, model, parts.no_decay, plan, frozenset(parts.aux_params),
                                         parts.aux_lr_ratio),
              precision=precision, sync_bn=sync_bn,
              aux_ids=frozenset(id(named[k]) for k in parts.aux_params if k in named), workers=workers,
              evaluations=[(ev, Cadence(evaluation.every_epochs(ev, base_batch, batcher.epoch_measure), EPOCHS))
                           for ev in parts.evaluations],
              checkpoints=Cadence(float(ctx.checkpoint_every_epochs), EPOCHS),
              checkpoint_clock=Cadence(60.0 * float(ctx.checkpoint_every_minutes), SECONDS).start(time.monotonic()))
    enter_stage(run, plan.kappa)
    if (ctx.forks or ctx.fork_from is not None) and parts.state is not None:
        import copy

        run.task_state0 = copy.deepcopy(parts.state.state_dict())
    return run


def parts_workers(parts: TaskParts, ctx: RunContext, d: distributed.Dist) -> int:
    w = ctx.num_workers if ctx.num_workers is not None else parts.num_workers
    if w is not None:
        return int(w)
    if d.device.type == "cpu":
        return 0  # CPU training shares the same cores; workers would only compete
    import os

    # the ranks on this node share its cores: the ranks of other nodes have their own
    return min(8, max(1, (os.cpu_count() or 2) // max(1, d.local_world_size) - 1))


# --- open: a fresh run directory, or the run resumed from its checkpoint ------------------------


def open_run(run: Run, log: MetricsLog) -> bool:
    """Open the run directory and write hparams.json; False when a resumed run had already finished."""
    ctx, dist = run.ctx, run.dist
    if ctx.resume:
        if open_resumed(run, log):
            return False
    elif not open_forked(run, log):
        open_fresh(run, log)
    # a baseline keeps the snapshots still ahead of it (one resumed past a point can no longer take it there)
    run.forks = [o for o in ctx.forks if schedule_time_on(run, o.plan) <= fork.first_leave(o.plan) + EPS]
    if run.forks and dist.is_main:
        for stale in ctx.out.glob(f".{fork.PREFIX}*.tmp"):  # a snapshot's write cut short by SIGKILL
            stale.unlink(missing_ok=True)
    if dist.is_main:  # after every check that could refuse the run: a refusal stays one line
        ctx.say_warnings()
    hp = run.record = hparams(run)
    if dist.is_main:
        write_hparams(ctx.out, hp)
    log.attach_wandb(ctx.wandb, ctx.out, ctx.out.name, hp)
    return True


def open_fresh(run: Run, log: MetricsLog) -> None:
    if run.dist.is_main:
        atomic_write_text(run.ctx.out / UNSAVED, "")  # first: whatever follows may be cut short
        (run.ctx.out / FIGURES).mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    log.start_fresh()
    start_cadences(run)


def open_resumed(run: Run, log: MetricsLog) -> bool:
    """Load the checkpoint into the run; True when that run had already finished."""
    ctx = run.ctx
    ck = checkpoint.load(ctx.out, run.dist.device)
    check_same_settings(ctx, ck.get("fingerprint"))
    check_record(ctx, ck.get("record"))
    load_state(run, ck)
    run.forked = (ck.get("record") or {}).get("forked_from")  # a run that started from its baseline says so still
    run.last_ckpt = (str(checkpoint.path_in(ctx.out)), where(run))
    log.truncate_after(run.clock.samples, ck.get("log"), finished=bool(ck.get("finished")))
    run.final = ck.get("final_metrics") or {}
    if run.dist.is_main and not ck.get("finished"):
        print(f"resuming {ctx.out} at {where(run)}", file=sys.stderr)
    return bool(ck.get("finished"))


def open_forked(run: Run, log: MetricsLog) -> bool:
    """A fresh run that leaves κ=1 takes up its baseline's snapshot of that point and the baseline's log up to it
    (emarule/engine/fork.py); False, and nothing written, where there is none it can take up."""
    ctx = run.ctx
    if ctx.fork_from is None or not fork.leaves_kappa_one(ctx.plan):
        return False
    k = fork.key(ctx.plan)
    src, ck, copied = fork.path(ctx.fork_from, k), None, 0
    if not src.is_file():
        why = "its baseline kept no snapshot of that step"
    else:
        try:
            ck = torch.load(src, map_location=run.dist.device, weights_only=False)
            why = fork.refusal(ck, ctx, k, run.task_state0)
        except Exception as e:  # a snapshot cut short or damaged: the run trains from the start, as it always can
            why = f"it cannot be read ({type(e).__name__})"
    if not why and (set(ck["model"]) != set(run.model.state_dict()) or set(ck["emas"]) != set(run.emas)):
        why = "its model or EMAs are not this run's"
    if not why and run.dist.is_main:
        atomic_write_text(ctx.out / UNSAVED, "")  # first: whatever follows may be cut short
        try:
            copied = fork.copy_log(Path(ctx.fork_from) / METRICS, ctx.out / METRICS, ck["log"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = str(e) or type(e).__name__
    if run.dist.world_size > 1:  # every rank takes the snapshot up, or none does
        why = next((w for w in distributed.gather_objects(why) if w), "")
    if why:
        if run.dist.is_main:
            print(f"{ctx.out}: not starting from its baseline {ctx.fork_from} ({why}); training from the start",
                  file=sys.stderr)
        return False
    if run.dist.is_main:
        (ctx.out / FIGURES).mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    load_state(run, ck)
    log.truncate_after(run.clock.samples, ck.get("log"))
    run.final = ck.get("final_metrics") or {}
    # the baseline relative to this run, so that a root moved whole keeps the record true
    run.forked = {"run": os.path.relpath(ctx.fork_from, ctx.out), "at": where(run), "samples": run.clock.samples,
                  "log_bytes": copied}
    if run.dist.is_main:
        print(f"starting {ctx.out} from its baseline {ctx.fork_from} at {where(run)}", file=sys.stderr)
    return True


def load_state(run: Run, ck: dict) -> None:
    """A checkpoint's state into the run: weights, EMAs, optimizer, task state, clock, the stage in force, the
    log's window, the RNG states, and the cadences from the clock's position."""
    ctx = run.ctx
    try:
        run.model.load_state_dict(ck["model"])
        for name, e in run.emas.items():
            e.load_state_dict(ck["emas"][name])
        run.optimizer.load_state_dict(ck["optimizer"])
        if run.parts.state is not None:
            run.parts.state.load_state_dict(ck["task_state"])
        run.clock = Clock(**ck["clock"])
    except (RuntimeError, KeyError, TypeError, ValueError) as e:  # a checkpoint edited by hand past its key check
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"the checkpoint in {ctx.out} does not fit this run ({type(e).__name__}: {first[:200]}); "
                        f"it was edited or damaged: start a new run with --out NEW_DIR") from None
    run.kappa = 0.0  # re-enter the stage in force: plan values into the optimizer, EMAs and BatchNorm
    enter_stage(run, run.ctx.plan.at(schedule_time(run)).kappa)
    restore_rows(run, ck.get("window"))
    if not checkpoint.restore_rng(ck):
        seed_everything(mix(ctx.seed, run.clock.samples), run.dist.rank)
    start_cadences(run)


def start_cadences(run: Run) -> None:
    """The epoch cadences fall on multiples of their period: started at the clock's position, a resumed run's
    fall where the uninterrupted run's did. The wall-clock one counts from setup."""
    run.checkpoints.start(run.epoch_now)
    for _, cadence in run.evaluations:
        cadence.start(run.epoch_now)


def rows_state(run: Run) -> dict:
    """What the next train row needs from the steps before a checkpoint: the steps it averages (Window's count
    and sums) and the κ of the last step, which says whether the step after the checkpoint starts a stage."""
    return {"n": run.window.n, "sums": dict(run.window.sums), "kappa": run.kappa}


def restore_rows(run: Run, state: dict | None) -> None:
    """The window and the row cadence of the run the checkpoint cut short. A checkpoint without them resumes
    with an empty window and a row at the first step after the resume."""
    if not isinstance(state, dict):
        return
    run.window.n, run.window.sums = int(state["n"]), dict(state["sums"])
    # A segment starts at an epoch's batch 0 (checkpoint after its last step) or at a stage change (the step
    # before the checkpoint ran at another κ): those log their first step whether or not the run was resumed.
    run.feed.continues = run.clock.batch > 0 and float(state["kappa"]) == run.kappa


def where(run: Run) -> str:
    c = run.clock
    return f"{run.measure.seen(c)} seen, epoch {run.epoch_now:.4g}, step {c.step}"


def hparams(run: Run) -> dict:
    """The plan as `emarule plan --format json` prints it, plus how this run executes it."""
    import platform

    ctx, d = run.ctx, run.dist
    layout = []
    for stage, p in stage_plans(ctx):
        lay = batching.layout(p["batch_size"], d.world_size, ctx.max_device_batch, run.unit)
        layout.append({"start_epoch": stage.start_epoch if stage else 0.0,
                       "end_epoch": stage.end_epoch if stage else run.sched.total_epochs,
                       "axis": stage.axis if stage else "epochs", "batch_size": lay.global_batch,
                       "kappa": p.kappa, "world_size": d.world_size, "accumulation": lay.accumulation,
                       "micro_batch": lay.max_micro,
                       "steps_per_epoch": run.measure.steps_per_epoch(run.batcher.n, lay.global_batch)})
    return {
        **ctx.plan.as_dict(), "seed": ctx.seed, "preset": ctx.preset, "progressive": ctx.progressive,
        "spec": ctx.spec, "layout": layout, "world_size": d.world_size, "max_device_batch": ctx.max_device_batch,
        "device": str(d.device), "batch_unit": run.unit, "dataset_size": run.batcher.n,
        "epoch_measure": run.epoch_measure, "total_epochs": run.sched.total_epochs,
        "warmup_epochs": run.sched.warmup_epochs, "total": run.total, "num_workers": run.workers,
        "emas": list(run.emas), "sync_bn_effective": run.sync_bn, "task": run.parts.info,
        "torch": torch.__version__, "python": platform.python_version(),
        "data": str(ctx.data) if ctx.data else None, "fingerprint": fingerprint(ctx),
        **({"forked_from": run.forked} if run.forked else {}),
    }


# --- stage, lr and the clock -------------------------------------------------------------------


def schedule_time(run: Run) -> float:
    """Where the clock is on the Progressive Scaling schedule's axis: epochs or base steps."""
    return run.clock.seen / run.base_batch if run.batch_schedule.axis == "base_steps" else run.epoch_now


def schedule_time_on(run: Run, plan) -> float:
    """Where the clock is on another plan's stage axis (a run that starts from this baseline)."""
    return fork.time_on_axis(plan, run.clock.seen, run.epoch_measure, run.base_batch)


def keep_snapshots(run: Run, log: MetricsLog) -> None:
    """A baseline keeps a snapshot where a run of its seed enters its first stage away from κ=1 (this step, as
    that run's loop would look its stage up), for that run to start from (emarule/engine/fork.py)."""
    kept = None  # one file a step: a second κ or schedule leaving κ=1 there gets a hard link to it
    for offer in list(run.forks):
        t = schedule_time_on(run, offer.plan)
        if offer.plan.at(t).kappa == 1.0:
            continue
        target = fork.path(run.ctx.out, offer.key)
        if kept is None:
            keys = [o.key for o in run.forks if o.plan.at(schedule_time_on(run, o.plan)).kappa != 1.0]
            baseline = fork.record(run.ctx, run.task_state0)
            checkpoint.save(run.ctx.out, {**state(run, log), "fork": {"keys": keys, "at": t, "baseline": baseline}},
                            target.name)
            kept = target
        elif run.dist.is_main:
            fork.link(kept, target)
        run.forks.remove(offer)


def enter_stage(run: Run, kappa: float) -> None:
    """Progressive Scaling: every scaled value from the plan of the stage running at κ (looked up at every step,
    whole epochs or a base step; a new stage takes lr peak and floor, betas, eps, weight decay, each EMA's ρ^κ and
    the BatchNorm momentum from `Plan.for_kappa`)."""
    if kappa == run.kappa:
        return
    run.kappa, run.plan = kappa, run.ctx.plan.for_kappa(kappa)
    run.layout = batching.layout(run.plan["batch_size"], run.dist.world_size, run.ctx.max_device_batch, run.unit)
    set_bn_momentum(run.model, run.plan, run.layout.accumulation)
    run.params = list(run.model.parameters())
    for name, rho in run.momentum_schedule.at(kappa).items():
        run.emas[name].set_momentum(rho)
    optimizers.apply_plan(run.optimizer, run.plan, run.sched.lr(run.epoch_now, run.plan))
    run.feed.reset()


def set_lr(run: Run, batch: Batch) -> float:
    """The schedule's lr for this step (its fraction of an epoch decides a per-step warmup)."""
    lr = run.sched.lr(run.epoch_now, run.plan, (batch.seen_after - run.clock.seen) / run.epoch_measure)
    optimizers.set_lr(run.optimizer, lr)
    return lr


def advance_clock(run: Run, count: int, seen_after: float) -> int:
    """Count the step just taken; returns its global batch index within the epoch."""
    c = run.clock
    i = c.batch
    c.step, c.pos, c.batch, c.seen = c.step + 1, c.pos + count, i + 1, seen_after
    c.samples = run.measure.items_after_step(c, seen_after, count)
    return i


def end_epoch(run: Run) -> None:
    """An epoch's remainder that cannot fill a batch is dropped: the clock jumps to the epoch's end."""
    c = run.clock
    c.seen = max(c.seen, (c.epoch + 1) * run.epoch_measure)
    run.measure.end_epoch(c)
    c.epoch, c.pos, c.batch = c.epoch + 1, 0, 0
    run.feed.reset()


def count_step(run: Run, step: StepOutcome, progress: Progress) -> None:
    """The step's values into the task's on_step, the next row's window and the progress bar."""
    if run.parts.on_step is not None:
        run.parts.on_step(run.now(), step.agreed.reduced)
    metrics = step.metrics
    run.window.add(step.loss, metrics)
    progress.advance(run.clock.seen, metrics.get(run.parts.progress_metric, step.loss))


# --- log, evaluate, checkpoint -----------------------------------------------------------------


def checkpoint_time_due(run: Run) -> bool:
    """Rank 0's wall clock; the step's agreement makes its answer every rank's."""
    return run.dist.is_main and run.checkpoint_clock.due(time.monotonic())


def row_due(run: Run, batch: Batch, index: int, at_end: bool) -> bool:
    """A row every `every` batches of the epoch (log_every_steps, else ⌈S/50⌉ of an epoch's S), and at a
    segment's first step (the epoch's first, or the first at a new stage's batch size) and the epoch's and the
    run's end. The row cadence starts again with each segment; its window is checkpointed (rows_state)."""
    if batch.opens_segment:
        every = int(run.ctx.log_every_steps) or max(1, math.ceil(batch.per_epoch / 50))
        run.rows = Cadence(every, BATCHES).start(batch.first)
    done = index + 1
    if run.rows.due(done) or batch.starts_rows or batch.ends_epoch or at_end:
        run.rows.start(done)
        return True
    return False


def log_train(run: Run, log: MetricsLog, lr: float, progress: Progress) -> None:
    run.feed.sync_skipped(run.clock)
    skipped = {"skipped_items": run.clock.skipped} if run.feed.skip_bad else {}
    log.log({"kind": "train", **time_fields(run), "batch_size": run.layout.global_batch,
             "accumulation": run.layout.accumulation, "lr": lr, **(run.momenta or {"ema_momentum": None}),
             **run.window.mean(), **skipped, "samples_per_s": progress.rate(), "wall_s": progress.elapsed(),
             "data_wait_s": run.feed.wait_s})
    run.window = Window()


def evaluate_due(run: Run, log: MetricsLog, at_end: bool) -> None:
    epoch = run.epoch_now
    due = [(ev, cadence) for ev, cadence in run.evaluations if at_end or cadence.due(epoch)]
    if not due:
        return
    ev = evaluation.run([ev for ev, _ in due], run.model, run.source, run.emas, run.parts.teacher, run.now(),
                        run.dist.device, run.autocast, run.workers)
    for _, cadence in due:
        cadence.start(epoch)
    run.final, run.last_eval_at = {**run.final, **ev}, run.clock.seen
    if ev:
        log.log({"kind": "eval", **time_fields(run), **ev})


def time_fields(run: Run) -> dict:
    c = run.clock
    return {"samples_seen": c.samples, **run.measure.fields(c), "epoch": run.epoch_now, "step": c.step,
            "kappa": run.kappa}


def save(run: Run, log: MetricsLog, finished: bool = False) -> None:
    if not all(bool(torch.isfinite(p).all()) for p in run.model.parameters()):
        # never overwrite the last good checkpoint with a diverged model
        raise diverged(run, "the weights became non-finite")
    checkpoint.save(run.ctx.out, state(run, log, finished))
    if run.dist.is_main:
        (run.ctx.out / UNSAVED).unlink(missing_ok=True)
    run.last_ckpt = (str(checkpoint.path_in(run.ctx.out)), where(run))
    run.checkpoint_clock.start(time.monotonic())


def state(run: Run, log: MetricsLog, finished: bool = False) -> dict:
    """What a checkpoint holds (emarule/engine/checkpoint.py), the RNG states aside."""
    run.feed.sync_skipped(run.clock)
    return {"model": run.model.state_dict(), "emas": {k: e.checkpoint() for k, e in run.emas.items()},
            "optimizer": run.optimizer.state_dict(), "clock": asdict(run.clock), "fingerprint": fingerprint(run.ctx),
            "task_state": run.parts.state.state_dict() if run.parts.state is not None else None,
            "finished": finished, "final_metrics": run.final, "record": run.record, "window": rows_state(run),
            "log": log.digest()}


# --- how a run stops: a signal, a diverged step, a full disk, an item that cannot be decoded ------


class Interrupted(Exception):
    def __init__(self, signal: str):
        super().__init__(signal)
        self.signal = signal


@contextlib.contextmanager
def stops_cleanly(run: Run, log: MetricsLog, progress: Progress):
    """The signal handler, the progress bar and the log around the loop; a signal ends the run with the
    checkpoint just written and the command that continues it."""
    try:
        with checkpoint.StopSignal() as stop, progress, contextlib.closing(log):
            yield stop, progress
    except Interrupted as e:
        log.close()
        progress.stop()
        if run.dist.is_main:
            how = run.ctx.resume_hint or f"continue with the same command and --resume --out {run.ctx.out}"
            print(f"{e.signal}: checkpoint written at {where(run)}; {how}", file=sys.stderr)
        raise SystemExit(130 if e.signal == "SIGINT" else 143) from None
    except (TrainingDiverged, DiskFull):
        log.close()
        progress.stop()
        raise


@contextlib.contextmanager
def one_line_errors(run: Run):
    """A full disk and an undecodable item end the run with what was kept and what to do next."""
    try:
        yield
    except DiskFull as e:
        raise e.kept(kept_after_disk_full(run)) from None
    except ItemError as e:
        raise UserError(f"cannot decode {e.path} ({e.why}); fix or remove the file (or add --set "
                        f"{SKIP_KEY}=true to skip such items, counted in the summary), then "
                        + (f"continue from the last good checkpoint ({run.last_ckpt[1]}) with --resume"
                           if run.last_ckpt else "run the same command again")) from None


def kept_after_disk_full(run: Run) -> str:
    fix = "free space (or raise the limit) and"
    if run.last_ckpt:
        return f"the last good checkpoint is kept ({run.last_ckpt[1]}): {fix} continue with --resume"
    return f"no checkpoint was written yet, so nothing is lost: {fix} run the same command again"


def diverged(run: Run, what: str) -> TrainingDiverged:
    last = run.last_ckpt
    # --resume continues only with the run's own settings, so the fix is a run of its own
    fix = "lower the learning rate or κ and train again with a new --out"
    fix = f"{fix}; the last good checkpoint is {last[0]} ({last[1]})" if last else f"{fix}; no checkpoint was written"
    return TrainingDiverged(f"{what} after {where(run)}; stopped: {fix}")
