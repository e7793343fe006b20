"""The training loop shared by every task: one visible loop of plain functions.

    train(ctx, parts) -> final metrics

Read it top to bottom; `_train` is the whole story:

    setup   validate everything and build the model, EMAs, optimizer and schedules: no file yet
    open    a fresh run directory, or the run resumed from its checkpoint
    loop    stage change → the next global batch → one optimizer step → log, evaluate, checkpoint
    finish  the evaluations due at the end and the final checkpoint

Time is the clock of data seen, in the batch's unit: samples, or seconds of audio. One epoch is
the training set's measure (its size, or its total duration); a step-counted recipe value is the
point base steps × base batch. Progressive Scaling looks up κ at the start of every step (whole
epochs, or a base step) and, when it changes, takes every scaled value from the plan of the new
stage (`Plan.for_kappa`): lr peak and floor, betas, eps, weight decay, each EMA's ρ^κ and the
BatchNorm momentum. Data order, batching and the split over ranks are in `emarule.engine.batching`; an
epoch's remainder that cannot fill a batch is dropped and the clock jumps to the epoch's end.

Recipe values come from the typed config `ctx.cfg` (emarule/config/typed.py); engine settings that are not
part of a recipe are RunContext fields: checkpoint_every_epochs (1), checkpoint_every_minutes (30),
log_every_steps (0: a row every ⌈S/50⌉ of an epoch's S steps), num_workers (TaskParts.num_workers, else 0
on CPU and, on GPU, the cores per rank less one, at most 8).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from emarule.engine import batching, checkpoint, distributed, evaluation, optimizers, runlock, schedules
from emarule.engine.baditems import SKIP_KEY, Guarded, ItemError, guarded_collate
from emarule.engine.clock import Clock, Measure, measure_for
from emarule.engine.context import RunContext
from emarule.engine.ema import ModelEma
from emarule.errors import TrainingDiverged, UserError
from emarule.engine.progress import Progress, Window
from emarule.engine.rundir import FIGURES, UNSAVED, DiskFull, MetricsLog, atomic_write_text, write_hparams
from emarule.scaling import BatchSchedule
from emarule.scaling.plan import extra_ema_name
from emarule.engine.seeding import mix
from emarule.config.typed import Config, config_of
from emarule.engine.interface import MAIN_EMA, Now, TaskParts
from emarule.engine.preflight import (check_batches_fit, check_record, check_same_settings, fingerprint, make_batcher,
                                      stage_plans)

EPS = 1e-6


@dataclass
class Segment:
    """The global batches from the current position to the epoch's end at one batch size, with
    this rank's DataLoader over them (rebuilt when the epoch or the batch size changes)."""

    epoch: int
    size: float
    first: int  # the epoch's batch index at which the segment starts
    batches: list  # (items, measure, this rank's micro-batch index lists)
    loader: object
    next: int = 0
    # the segment starts a new run of rows: its first step logs one. False for the rest of a segment that a
    # checkpoint cut short (the resumed run's first segment, unless it starts an epoch or a stage there)
    starts_rows: bool = True

    @property
    def per_epoch(self) -> int:
        return self.first + len(self.batches)


@dataclass
class Run:
    """Everything the loop carries from one step to the next."""

    ctx: RunContext
    parts: TaskParts
    d: distributed.Dist
    unit: str
    measure: Measure  # what the unit decides, decided once (emarule/engine/clock.py)
    base_batch: float
    batcher: batching.Batcher
    sched: schedules.Schedule
    batches: BatchSchedule
    total: float  # the run's length in the batch unit
    model: nn.Module
    source: nn.Module  # what the EMAs average
    emas: dict  # name -> ModelEma, the main one first
    optimizer: torch.optim.Optimizer
    precision: str
    sync_bn: bool
    aux_ids: frozenset
    evals: list  # [Evaluation, cadence in epochs, next due epoch]
    workers: int
    kappa: float = 0.0
    plan: object = None
    lay: batching.BatchLayout | None = None
    clock: Clock = field(default_factory=Clock)
    segment: Segment | None = None
    final: dict = field(default_factory=dict)
    momenta: dict = field(default_factory=dict)  # the ρ each EMA used in the last step, by log name
    momentum_schedule: schedules.EmaMomenta | None = None  # each EMA's ρ̂ per stage, from the plan
    params: list = field(default_factory=list)  # model.parameters(), listed at each stage change, not each step
    last_eval_at: float = -1.0
    next_ckpt: float = 0.0
    last_ckpt: tuple | None = None
    t_ckpt: float = field(default_factory=time.monotonic)
    record: dict = field(default_factory=dict)  # what hparams.json holds; every checkpoint keeps a copy
    skip_bad: bool = False  # data.skip_bad_items
    new_skipped: int = 0  # this rank's skipped items not yet added to clock.skipped
    data_wait_s: float = 0.0  # time this invocation spent getting training batches (logged as data_wait_s)
    window: Window = field(default_factory=Window)  # the steps the next train row averages; checkpointed
    continues: bool = False  # the next segment opened goes on with one a checkpoint cut short (open_resumed)

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
        return torch.autocast(device_type=self.d.device.type, dtype=torch.bfloat16)


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


def setup(ctx: RunContext, parts: TaskParts, d: distributed.Dist) -> Run:
    cfg = ctx.cfg
    unit = cfg.batch.unit
    batcher = make_batcher(ctx, parts)
    base_batch = float(cfg.batch.size)
    sched = schedules.from_spec(cfg, batcher.epoch_measure)
    # the schedule in force: the spec's own, one given to the run, or none where the plan skipped it
    batches = BatchSchedule(ctx.plan.progressive, base_batch, ctx.kappa, cfg.schedule.epochs,
                            cfg.schedule.total_steps)
    batches.check_base_step_in_run(batcher.epoch_measure)
    check_batches_fit(ctx, batcher, d.world_size)
    check_ema_dtype(cfg)
    if ctx.resume and not checkpoint.path_in(ctx.out).exists() and (ctx.out / UNSAVED).exists():
        if d.is_main:
            print(f"--resume: {ctx.out} stopped before its first checkpoint; starting it from the beginning",
                  file=sys.stderr)
        ctx.resume = False
    if ctx.resume and not checkpoint.path_in(ctx.out).exists():
        raise UserError(f"--resume: no checkpoint in {ctx.out}; drop --resume to start the run from scratch")
    if not ctx.resume and checkpoint.path_in(ctx.out).exists():
        raise UserError(f"{ctx.out} already holds a run (checkpoint.pt); pass --resume to continue it or "
                        f"--out NEW_DIR to start another")

    precision = cfg.precision
    set_precision(precision)
    seed_everything(ctx.seed, d.rank)
    sync_bn = distributed.sync_batchnorm_possible(bool(cfg.norm.sync_bn))
    model = distributed.maybe_sync_batchnorm(parts.model.to(d.device, memory_format=memory_format(cfg)),
                                             bool(cfg.norm.sync_bn))
    parts.model = model
    distributed.broadcast_module_(model)
    model.train()
    source = parts.ema_source if parts.ema_source is not None else model
    plan = ctx.plan.at(0.0)
    emas = build_emas(cfg, source, plan)
    named = dict(model.named_parameters())
    run = Run(ctx=ctx, parts=parts, d=d, unit=unit, measure=measure_for(unit), base_batch=base_batch, batcher=batcher,
              sched=sched,
              batches=batches, total=sched.total_epochs * batcher.epoch_measure, model=model, source=source,
              emas=emas, momentum_schedule=schedules.EmaMomenta.from_plan(ctx.plan, list(emas), MAIN_EMA),
              optimizer=optimizers.build(cfg, model, parts.no_decay, plan, frozenset(parts.aux_params),
                                         parts.aux_lr_ratio),
              precision=precision, sync_bn=sync_bn,
              aux_ids=frozenset(id(named[k]) for k in parts.aux_params if k in named),
              evals=[[ev, evaluation.every_epochs(ev, base_batch, batcher.epoch_measure), 0.0]
                     for ev in parts.evaluations],
              workers=parts_workers(parts, ctx, d),
              skip_bad=bool("data" in cfg and cfg.data.skip_bad_items))
    enter_stage(run, plan.kappa)
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


def open_fresh(run: Run, log: MetricsLog) -> None:
    if run.d.is_main:
        atomic_write_text(run.ctx.out / UNSAVED, "")  # first: whatever follows may be cut short
        (run.ctx.out / FIGURES).mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    log.start_fresh()
    run.next_ckpt = next_checkpoint(run)
    for e in run.evals:
        e[2] = evaluation.next_due(0.0, e[1])


def open_resumed(run: Run, log: MetricsLog) -> bool:
    """Load the checkpoint into the run; True when that run had already finished."""
    ctx = run.ctx
    ck = checkpoint.load(ctx.out, run.d.device)
    check_same_settings(ctx, ck.get("fingerprint"))
    check_record(ctx, ck.get("record"))
    run.model.load_state_dict(ck["model"])
    for name, e in run.emas.items():
        e.load_state_dict(ck["emas"][name])
    run.optimizer.load_state_dict(ck["optimizer"])
    if run.parts.state is not None:
        run.parts.state.load_state_dict(ck["task_state"])
    run.clock = Clock(**ck["clock"])
    run.kappa = 0.0  # re-enter the stage in force: plan values into the optimizer, EMAs and BatchNorm
    enter_stage(run, run.ctx.plan.at(schedule_time(run)).kappa)
    restore_window(run, ck.get("window"))
    if not checkpoint.restore_rng(ck):
        seed_everything(mix(ctx.seed, run.clock.samples), run.d.rank)
    run.last_ckpt = (str(checkpoint.path_in(ctx.out)), where(run))
    log.truncate_after(run.clock.samples, ck.get("log"), finished=bool(ck.get("finished")))
    run.final = ck.get("final_metrics") or {}
    run.next_ckpt = next_checkpoint(run)
    for e in run.evals:
        e[2] = evaluation.next_due(run.epoch_now, e[1])
    if run.d.is_main and not ck.get("finished"):
        print(f"resuming {ctx.out} at {where(run)}", file=sys.stderr)
    return bool(ck.get("finished"))


def window_state(run: Run) -> dict:
    """What the next train row needs from the steps before a checkpoint: the steps it averages (Window's count
    and sums) and the κ of the last step, which says whether the step after the checkpoint starts a stage."""
    return {"n": run.window.n, "sums": dict(run.window.sums), "kappa": run.kappa}


def restore_window(run: Run, state: dict | None) -> None:
    """The window and the row cadence of the run the checkpoint cut short. A checkpoint without them resumes
    with an empty window and a row at the first step after the resume."""
    if not isinstance(state, dict):
        return
    run.window.n, run.window.sums = int(state["n"]), dict(state["sums"])
    # A segment starts at an epoch's batch 0 (checkpoint after its last step) or at a stage change (the step
    # before the checkpoint ran at another κ): those log their first step whether or not the run was resumed.
    run.continues = run.clock.batch > 0 and float(state["kappa"]) == run.kappa


def where(run: Run) -> str:
    c = run.clock
    return f"{run.measure.seen(c)} seen, epoch {run.epoch_now:.4g}, step {c.step}"


def hparams(run: Run) -> dict:
    """The plan as `emarule plan --format json` prints it, plus how this run executes it."""
    import platform

    ctx, d = run.ctx, run.d
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
    }


# --- the stage in force and the next global batch ----------------------------------------------


def schedule_time(run: Run) -> float:
    """Where the clock is on the Progressive Scaling schedule's axis: epochs or base steps."""
    return run.clock.seen / run.base_batch if run.batches.axis == "base_steps" else run.epoch_now


def enter_stage(run: Run, kappa: float) -> None:
    """Progressive Scaling: every scaled value from the plan of the stage running at κ."""
    if kappa == run.kappa:
        return
    run.kappa, run.plan = kappa, run.ctx.plan.for_kappa(kappa)
    run.lay = batching.layout(run.plan["batch_size"], run.d.world_size, run.ctx.max_device_batch, run.unit)
    set_bn_momentum(run.model, run.plan, run.lay.accumulation)
    run.params = list(run.model.parameters())
    for name, rho in run.momentum_schedule.at(kappa).items():
        run.emas[name].set_momentum(rho)
    optimizers.apply_plan(run.optimizer, run.plan, run.sched.lr(run.epoch_now, run.plan))
    run.segment = None


def open_segment(run: Run) -> Segment:
    """This rank's batches from the current position to the epoch's end, and a DataLoader over them."""
    from torch.utils.data import DataLoader, default_collate

    c, lay = run.clock, run.lay
    if hasattr(run.parts.train_set, "set_epoch"):
        run.parts.train_set.set_epoch(c.epoch)
    rows, pos, lists = [], c.pos, []
    while (got := run.batcher.take(c.epoch, pos, lay.global_batch)) is not None:
        items, measure = got
        parts = run.batcher.parts(items, lay)
        mine = [p for p in parts[run.d.rank * lay.accumulation:(run.d.rank + 1) * lay.accumulation] if p]
        # a rank left without an item (a seconds batch of fewer utterances than ranks) still joins the reduction
        idle = lay.world_size > 1 and any(not any(parts[r * lay.accumulation:(r + 1) * lay.accumulation])
                                          for r in range(lay.world_size))
        rows.append((items, measure, mine, idle))
        lists.extend(mine)
        pos += len(items)
    # Its own generator: a DataLoader iterator otherwise draws its worker seed from the global RNG,
    # and a resumed run (one more iterator, made mid-epoch) would shift dropout's random stream.
    gen = torch.Generator().manual_seed(mix(run.ctx.seed, c.epoch, run.d.rank))
    loader = DataLoader(Guarded(run.parts.train_set), batch_sampler=lists,
                        collate_fn=guarded_collate(run.parts.collate or default_collate),
                        num_workers=run.workers if lists else 0, pin_memory=run.d.device.type == "cuda",
                        generator=gen)
    starts_rows, run.continues = not run.continues, False
    return Segment(c.epoch, lay.global_batch, c.batch, rows, iter(loader), starts_rows=starts_rows)


def next_batch(run: Run):
    """(micro-batches, their measures, global measure, item count, data seen after the step, whether some
    rank has no item in it), or None at an epoch's end. The time spent here, starting the loader's workers
    included, is the time the loop waited for data. On a GPU the previous step's optimizer and EMA kernels may
    still run meanwhile (the loop syncs once a step, after backward), so it can overstate the stall slightly."""
    t0 = time.monotonic()  # the clock of Progress, which gives the row's wall_s
    try:
        return _next_batch(run)
    finally:
        run.data_wait_s += time.monotonic() - t0


def _next_batch(run: Run):
    seg = run.segment
    if seg is None or seg.epoch != run.clock.epoch or seg.size != run.lay.global_batch:
        seg = run.segment = open_segment(run)
    if seg.next >= len(seg.batches):
        return None
    items, measure, mine, idle = seg.batches[seg.next]
    seg.next += 1
    micro, measures, skipped = [], [], False
    for m in mine:
        got = next(seg.loader)
        bad = {b.index for b in got.bad}
        if bad:
            count_bad_items(run, got.bad)
            skipped = True
        if got.batch is not None:
            micro.append(got.batch)
            # one process: the skipped items' share goes to the others (below); several: the step's total
            # is summed over ranks from the plan, so each micro-batch keeps its planned share of it
            measures.append(run.batcher.measure(m if run.d.world_size > 1 else [i for i in m if i not in bad]))
    if mine and not micro:
        raise UserError(f"every item of a batch failed to decode (the first: {got.bad[0].path}); the data set is "
                        f"too damaged to train on: check it")
    if len(micro) < len(mine) and run.d.world_size > 1:
        raise UserError(f"every item of a micro-batch failed to decode (the first: {got.bad[0].path}); with "
                        f"several processes a rank cannot sit a micro-batch out: check the data set")
    if skipped and run.d.world_size == 1:
        measure = sum(measures)  # the skipped items' share of the step goes to the others
    if run.parts.loss_measure is not None:
        measures, measure = loss_measures(run, micro)
    c = run.clock
    last = seg.next == len(seg.batches)
    seen_after = (c.epoch + 1) * run.epoch_measure if last else c.seen + seg.batches[seg.next - 1][1]
    return micro, measures, measure, len(items), seen_after, idle


def loss_measures(run: Run, micro: list) -> tuple[list[float], float]:
    """Each micro-batch's weight and the step's total, in what the task's loss is a mean over (a collective:
    every rank calls it each step, an idle one with no micro-batch)."""
    measures = [float(run.parts.loss_measure(b)) for b in micro]
    if run.d.world_size == 1:
        return measures, sum(measures)  # one micro-batch: its weight is exactly 1.0
    total = torch.tensor([sum(measures)], dtype=torch.float64, device=run.d.device)
    distributed.all_reduce_sum_(total)
    return measures, float(total.item())


SHOWN_BAD = 10  # skipped items named on stderr; the count goes on


def count_bad_items(run: Run, bad: list) -> None:
    """An item that failed to decode stops the run, naming the file, or is skipped and counted."""
    if not run.skip_bad:
        raise bad[0].error()
    for b in bad:
        run.new_skipped += 1
        shown = run.clock.skipped + run.new_skipped
        if shown <= SHOWN_BAD:
            print(f"warning: skipped {b.path} ({b.why}) ({SKIP_KEY}: true)"
                  + ("; further skips are counted, not named" if shown == SHOWN_BAD else ""), file=sys.stderr)


def sync_skipped(run: Run) -> None:
    """Every rank's newly skipped items into clock.skipped (a collective: all ranks call it together)."""
    if not run.skip_bad:
        return
    new = run.new_skipped
    if run.d.world_size > 1:
        new = sum(distributed.gather_objects(new))
    run.clock.skipped += new
    run.new_skipped = 0


def end_epoch(run: Run) -> None:
    c = run.clock
    c.seen = max(c.seen, (c.epoch + 1) * run.epoch_measure)
    run.measure.end_epoch(c)
    c.epoch, c.pos, c.batch = c.epoch + 1, 0, 0
    run.segment = None


# --- one optimizer step -------------------------------------------------------------------------


def agree_on_metric_names(sums: dict, device: torch.device) -> None:
    """Zeros for the metrics other ranks computed and this one did not (it had no item this step), so
    that every rank all-reduces vectors of the same layout."""
    mine = {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else None) for k, v in sums.items()}
    for theirs in distributed.gather_objects(mine):
        for k, shape in theirs.items():
            if k not in sums:
                sums[k] = 0.0 if shape is None else torch.zeros(shape, dtype=torch.float64, device=device)


def optimizer_step(run: Run, micro, measures, global_measure, seen_after, idle: bool,
                   stop_flag, time_flag: bool):
    """Forward/backward every micro-batch, reduce, check, clip, step, update the EMAs.

    Returns (loss, logged metrics, reduced tensors, flags, problem): `problem` names a non-finite
    loss or gradient norm, in which case nothing was stepped. `stop_flag` (a bool, or a function returning
    one, read after the last backward) goes into the collective that makes every rank's decision the same.
    """
    model, parts, d, opt = run.model, run.parts, run.d, run.optimizer
    teacher = run.emas[parts.teacher].module if parts.teacher in run.emas else None
    now = run.now()
    opt.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=d.device, dtype=torch.float64)
    sums: dict[str, object] = {}
    for batch, measure in zip(micro, measures, strict=True):
        weight = measure / global_measure  # gradients are summed over micro-batches and ranks
        batch = distributed.to_device(batch, d.device)
        with run.autocast():
            loss, metrics = parts.loss(model, teacher, batch, now)
        (loss if weight == 1.0 else loss * weight).backward()  # × 1.0 is exact: one graph node fewer
        loss_sum += loss.detach().double() * weight
        for k, v in (metrics or {}).items():
            v = v.detach().double() * weight if isinstance(v, torch.Tensor) else float(v) * weight
            sums[k] = sums[k] + v if k in sums else v
    if idle:
        agree_on_metric_names(sums, d.device)
    # One collective for the loss, the task's metrics and the stop flags (identical decisions on
    # every rank): [loss, scalars..., tensors flattened..., stop requested, checkpoint due by time].
    scalars = sorted(k for k, v in sums.items() if not isinstance(v, torch.Tensor))
    tensors = sorted(k for k, v in sums.items() if isinstance(v, torch.Tensor))
    flat = [sums[k].reshape(-1).to(d.device) for k in tensors]
    vec = torch.cat([torch.tensor([0.0] + [sums[k] for k in scalars], dtype=torch.float64, device=d.device), *flat,
                     torch.tensor([float(stop_flag() if callable(stop_flag) else stop_flag), float(time_flag)],
                                  dtype=torch.float64, device=d.device)])
    vec[0] = loss_sum
    distributed.all_reduce_sum_(vec)
    values = vec.tolist()
    loss_value = values[0]
    metrics = dict(zip(scalars, values[1:1 + len(scalars)], strict=True))
    reduced, i = {}, 1 + len(scalars)
    for k, f in zip(tensors, flat, strict=True):
        reduced[k] = vec[i:i + f.numel()].reshape(sums[k].shape)
        i += f.numel()
    flags = (values[-2] > 0, values[-1] > 0)
    if not math.isfinite(loss_value):
        return loss_value, metrics, reduced, flags, f"the loss became {loss_value}"
    params = [p for p in run.params if p.requires_grad]
    if d.world_size > 1:
        distributed.all_reduce_grads_(params)  # a parameter no rank gave a gradient keeps grad None
        if not run.sync_bn:  # before the EMA reads them: every rank's teacher gets rank 0's statistics
            distributed.broadcast_buffers_(model)
    metrics["grad_norm"] = clip_gradients(params, run.aux_ids, run.ctx.cfg.optimizer.grad_clip)
    if not math.isfinite(metrics["grad_norm"]):  # a finite loss can still overflow in backward
        return loss_value, metrics, reduced, flags, f"the gradient norm became {metrics['grad_norm']}"
    pre = run.ctx.cfg.ema.update_from == "pre"
    if pre:
        update_emas(run, seen_after)  # θ_t: the parameters before the step
    opt.step()
    if not pre:
        update_emas(run, seen_after)  # θ_{t+1}
    return loss_value, metrics, reduced, flags, None


def clip_gradients(params: list, aux_ids: frozenset, clip: float | None) -> float:
    """Global-norm clipping of the model's gradients; a tracking probe is neither clipped nor counted."""
    body = [p for p in params if id(p) not in aux_ids]
    if clip:
        return float(torch.nn.utils.clip_grad_norm_(body, clip))
    return total_norm([p.grad for p in body if p.grad is not None])


def total_norm(grads: list) -> float:
    """torch.nn.utils.get_total_norm's value bit for bit: on one device and dtype it is these two reductions
    (the norm of each tensor, then of their stack); its grouping per call costs a third of the time."""
    if not grads or any(g.device != grads[0].device or g.dtype != grads[0].dtype for g in grads):
        return float(torch.nn.utils.get_total_norm(grads))
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0))


def update_emas(run: Run, seen_after: float) -> None:
    """Each EMA holds the stage's ρ̂ from the momentum schedule (set_momentum) and no base batch, so ρ is raised to
    κ once, in the plan."""
    for name, e in run.emas.items():
        run.momenta[schedules.momentum_log_name(name)] = e.update(run.source, samples_seen=seen_after)


# --- log, evaluate, checkpoint -----------------------------------------------------------------


def next_checkpoint(run: Run) -> float:
    return evaluation.next_due(run.epoch_now, float(run.ctx.checkpoint_every_epochs))


def advance_clock(run: Run, count: int, seen_after: float) -> int:
    """Count the step just taken; returns its global batch index within the epoch."""
    c = run.clock
    i = c.batch
    c.step, c.pos, c.batch, c.seen = c.step + 1, c.pos + count, i + 1, seen_after
    c.samples = run.measure.items_after_step(c, seen_after, count)
    return i


def log_train(run: Run, log: MetricsLog, lr: float, window: Window, progress: Progress) -> None:
    sync_skipped(run)
    skipped = {"skipped_items": run.clock.skipped} if run.skip_bad else {}
    log.log({"kind": "train", **time_fields(run), "batch_size": run.lay.global_batch,
             "accumulation": run.lay.accumulation, "lr": lr, **(run.momenta or {"ema_momentum": None}),
             **window.mean(), **skipped, "samples_per_s": progress.rate(), "wall_s": progress.elapsed(),
             "data_wait_s": run.data_wait_s})


def evaluate_due(run: Run, log: MetricsLog, at_end: bool) -> None:
    epoch = run.epoch_now
    due = [e for e in run.evals if at_end or epoch + 1e-9 >= e[2]]
    if not due:
        return
    ev = evaluation.run([e[0] for e in due], run.model, run.source, run.emas, run.parts.teacher, run.now(),
                        run.d.device, run.autocast, run.workers)
    for e in due:
        e[2] = evaluation.next_due(epoch, e[1])
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
    sync_skipped(run)
    checkpoint.save(run.ctx.out, {
        "model": run.model.state_dict(), "emas": {k: e.checkpoint() for k, e in run.emas.items()},
        "optimizer": run.optimizer.state_dict(), "clock": asdict(run.clock), "fingerprint": fingerprint(run.ctx),
        "task_state": run.parts.state.state_dict() if run.parts.state is not None else None,
        "finished": finished, "final_metrics": run.final, "record": run.record, "window": window_state(run),
        "log": log.digest()})
    if run.d.is_main:
        (run.ctx.out / UNSAVED).unlink(missing_ok=True)
    run.last_ckpt = (str(checkpoint.path_in(run.ctx.out)), where(run))
    run.t_ckpt = time.monotonic()


def diverged(run: Run, what: str) -> TrainingDiverged:
    last = run.last_ckpt
    fix = (f"the last good checkpoint is {last[0]} ({last[1]}); lower the learning rate or κ and --resume" if last
           else "no checkpoint was written yet; lower the learning rate or κ and start again")
    return TrainingDiverged(f"{what} after {where(run)}; stopped: {fix}")


# --- the loop ----------------------------------------------------------------------------------


def train(ctx: RunContext, parts: TaskParts) -> dict:
    """Train `parts.model` as `ctx` says; returns the final metrics (see the module docstring)."""
    d = distributed.setup()
    try:
        return _train(ctx, parts, d)
    finally:
        distributed.teardown()


def _train(ctx: RunContext, parts: TaskParts, d: distributed.Dist) -> dict:
    run = setup(ctx, parts, d)
    with runlock.lock_dir(ctx.out, "run", enabled=d.is_main):  # after the checks, before the first write
        try:
            return _locked(run, ctx, parts, d)
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


def _locked(run: Run, ctx: RunContext, parts: TaskParts, d: distributed.Dist) -> dict:
    log = MetricsLog(ctx.out, enabled=d.is_main)
    if ctx.resume:
        if open_resumed(run, log):
            log.close()
            return run.final
    else:
        open_fresh(run, log)
    if d.is_main:  # after every check that could refuse the run: a refusal stays one line
        ctx.say_warnings()
    hp = run.record = hparams(run)
    if d.is_main:
        write_hparams(ctx.out, hp)
    log.attach_wandb(ctx.wandb, ctx.out, ctx.out.name, hp)
    progress = Progress(run.total, run.clock.seen, unit=run.unit, enabled=d.is_main and not ctx.quiet)
    ckpt_seconds = 60.0 * float(ctx.checkpoint_every_minutes)
    log_every = int(ctx.log_every_steps)
    try:
        with checkpoint.StopSignal() as stop, progress, contextlib.closing(log):
            while run.clock.seen < run.total - EPS:
                enter_stage(run, run.ctx.plan.at(schedule_time(run)).kappa)
                got = next_batch(run)
                if got is None:
                    end_epoch(run)
                    continue
                micro, measures, measure, count, seen_after, idle = got
                lr = run.sched.lr(run.epoch_now, run.plan, (seen_after - run.clock.seen) / run.epoch_measure)
                optimizers.set_lr(run.optimizer, lr)
                time_due = d.is_main and time.monotonic() - run.t_ckpt > ckpt_seconds
                loss, metrics, reduced, (stop_now, time_due), problem = optimizer_step(
                    run, micro, measures, measure, seen_after, idle, lambda: stop.requested, time_due)
                if d.world_size == 1:  # a signal that came later in the step: no other rank to agree with
                    stop_now = stop_now or stop.requested
                if problem:
                    raise diverged(run, f"{problem} in the batch")
                i, seg = advance_clock(run, count, seen_after), run.segment
                epoch_done = seg.next == len(seg.batches)
                if parts.on_step is not None:
                    parts.on_step(run.now(), reduced)
                run.window.add(loss, metrics)
                progress.advance(run.clock.seen, metrics.get(parts.progress_metric, loss))
                at_end = run.clock.seen >= run.total - EPS
                every = log_every or max(1, math.ceil(seg.per_epoch / 50))
                # a row every `every` batches of the epoch, at a segment's first step (the epoch's first, or
                # the first at a new stage's batch size) and at the epoch's and the run's end
                if (i + 1) % every == 0 or (i == seg.first and seg.starts_rows) or epoch_done or at_end:
                    log_train(run, log, lr, run.window, progress)
                    run.window = Window()
                if epoch_done:
                    end_epoch(run)
                evaluate_due(run, log, at_end)
                if (run.epoch_now + 1e-9 >= run.next_ckpt or time_due or stop_now) and not at_end:
                    save(run, log)
                    run.next_ckpt = next_checkpoint(run)
                if stop_now and not at_end:  # at the end, the final checkpoint follows
                    raise Interrupted(stop.signal_name)
            if run.last_eval_at != run.clock.seen:
                evaluate_due(run, log, at_end=True)
            run.final = {**run.final, "samples_seen": run.clock.samples, "epoch": run.epoch_now,
                         "steps": run.clock.step, "kappa": run.kappa}
            run.final.update(run.measure.fields(run.clock))
            if run.skip_bad:
                sync_skipped(run)
                run.final["skipped_items"] = run.clock.skipped
            save(run, log, finished=True)
    except Interrupted as e:
        log.close()
        progress.stop()
        if d.is_main:
            how = ctx.resume_hint or f"continue with the same command and --resume --out {ctx.out}"
            print(f"{e.signal}: checkpoint written at {where(run)}; {how}", file=sys.stderr)
        raise SystemExit(130 if e.signal == "SIGINT" else 143) from None
    except (TrainingDiverged, DiskFull):
        log.close()
        progress.stop()
        raise
    return run.final


class Interrupted(Exception):
    def __init__(self, signal: str):
        super().__init__(signal)
        self.signal = signal
