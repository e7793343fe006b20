"""The training loop shared by every task: one visible loop of plain functions.

    train(ctx, parts) -> final metrics

Time is the samples-seen clock; epoch = samples_seen / len(train_set). Each epoch e:

1. κ_e = BatchSchedule.kappa_at(e) (Progressive Scaling; constant κ otherwise). When κ changes,
   every scaled value is re-derived from the BASE spec with `emarule.scaling.scale(spec, κ_e)` —
   lr peak and floor, betas, eps, weight decay, EMA momentum ρ^κ_e, BatchNorm momentum when
   norm.bn_scale — and written into the optimizer's param groups and the EMA.
2. The epoch's global permutation (seed, e) is cut into ⌊N / B̂⌋ global batches of B̂ = κ_e·B
   samples (Algorithm 1; the remainder is dropped and the clock jumps to the epoch's end with the
   last batch, so epochs end exactly at whole numbers on every κ's time axis).
3. Each step: lr from the schedule at the current fractional epoch; this rank's share of the global
   batch in micro-batches of at most --max-device-batch; each micro-batch loss weighted by its
   size / B̂ and back-propagated; gradients summed over ranks; global-norm clipping; the optimizer
   step; one EMA update per optimizer step (before the step for ema.update_from=pre, after it for
   post; a copy for the first ema.start_steps/κ steps, as `emarule plan` shows them).
4. Logging (metrics.jsonl, wandb), evaluation every probe.eval_every_epochs, checkpoints every
   epoch (and every 30 minutes, and on SIGTERM); a non-finite loss stops the run, keeping the
   last good checkpoint.

Engine settings that are not part of a recipe come from `ctx.extra` (all optional):
  checkpoint_every_epochs (1), checkpoint_every_minutes (30), log_every_steps (≈50 rows/epoch),
  num_workers (TaskParts.num_workers, else 0 on CPU and min(8, cores) on GPU).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from emarule import checkpoint, distributed, optimizers, schedules
from emarule.context import RunContext
from emarule.ema import ModelEma
from emarule.errors import UserError
from emarule.rundir import FIGURES, MetricsLog, write_hparams
from emarule.scaling import BatchSchedule, Stage, scale
from emarule.spec import get
from emarule.tasks.parts import TaskParts


class TrainingDiverged(UserError):
    """A non-finite loss: the run stops and the last good checkpoint is kept."""


@dataclass
class Clock:
    samples_seen: int = 0  # samples consumed (the dropped remainder of an epoch counts at its end)
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # index of the epoch in progress
    batch: int = 0  # global batches done within that epoch


# --- setup ------------------------------------------------------------------------------------


def seed_everything(seed: int, rank: int) -> None:
    """Dropout and other in-model randomness: one stream per rank, fixed by (seed, rank)."""
    s = distributed._mix(seed, rank, 0x5EED)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


def set_precision(precision: str) -> None:
    if torch.cuda.is_available():
        tf32 = precision in ("tf32", "bf16")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def autocast(device: torch.device, precision: str):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def set_bn_momentum(model: nn.Module, plan) -> None:
    """torch's BatchNorm momentum = 1 − ρ_BN (ρ_BN^κ when norm.bn_scale)."""
    m = plan.get("norm.bn_torch_momentum")
    if m is None:
        return
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.momentum = m


def to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def epoch_loader(parts: TaskParts, perm, lay, rank: int, first: int, last: int, workers: int, pin: bool,
                 seed: int):
    """This rank's micro-batches of global batches first..last-1 of an epoch, in order."""
    from torch.utils.data import DataLoader, default_collate

    lists = []
    for i in range(first, last):
        lists.extend(distributed.rank_micro_batches(perm, i, lay, rank))
    # Its own generator: a DataLoader iterator otherwise draws its worker seed from the global RNG,
    # and a resumed run (one more iterator, made mid-epoch) would shift dropout's random stream.
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(parts.train_set, batch_sampler=lists, collate_fn=parts.collate or default_collate,
                      num_workers=workers, pin_memory=pin, generator=gen)


class Plans:
    """scale(spec, κ) for each κ met, computed once (the run's own plan for its final κ)."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.cache = {float(ctx.kappa): ctx.plan}

    def __call__(self, kappa: float):
        k = float(kappa)
        if math.isclose(k, self.ctx.kappa, rel_tol=1e-12):
            k = float(self.ctx.kappa)  # base·κ/base can differ from κ in the last bit
        if k not in self.cache:
            self.cache[k] = scale(self.ctx.spec, k, self.ctx.ema_rule)
        return self.cache[k]


def fingerprint(ctx: RunContext) -> dict:
    """What must match for --resume to continue a run (not: world size, micro-batch, logging)."""
    spec = {k: v for k, v in ctx.spec.items() if k not in ("source",)}
    return {"spec": spec, "kappa": ctx.kappa, "ema_rule": ctx.ema_rule, "seed": ctx.seed,
            "progressive": ctx.progressive}


# --- one optimizer step -----------------------------------------------------------------------


def optimizer_step(model, parts, teacher, ema, optimizer, micro_batches, lay, ctx_step):
    """Forward/backward every micro-batch, reduce, check, clip, step, EMA.

    Returns (loss, metrics, ρ used, problem): `problem` names a non-finite loss or gradient norm,
    in which case nothing was stepped.

    `ctx_step` carries what the step needs from the loop: device, precision, grad_clip,
    update_from, samples after this step, the stop flags to share with the other ranks.
    """
    s = ctx_step
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=s.device, dtype=torch.float64)
    metric_sums: dict[str, float] = {}
    for batch in micro_batches:
        size = _batch_len(batch)
        weight = size / lay.global_batch  # gradients are summed over micro-batches and ranks
        batch = to_device(batch, s.device)
        with autocast(s.device, s.precision):
            loss, metrics = parts.loss(model, teacher, batch)
        (loss * weight).backward()
        loss_sum += loss.detach().double() * weight
        for k, v in (metrics or {}).items():
            metric_sums[k] = metric_sums.get(k, 0.0) + float(v) * weight
    # One collective for the loss, the task's metrics and the stop flags (identical decisions on
    # every rank): [loss, metrics..., sigterm, time-based checkpoint due].
    names = sorted(metric_sums)
    vec = torch.tensor([0.0] + [metric_sums[k] for k in names] + [float(s.stop_flag), float(s.time_flag)],
                       dtype=torch.float64, device=s.device)
    vec[0] = loss_sum
    distributed.all_reduce_sum_(vec)
    values = vec.tolist()
    loss_value = values[0]
    metrics = dict(zip(names, values[1:1 + len(names)], strict=True))
    s.stop_flag, s.time_flag = values[-2] > 0, values[-1] > 0
    if not math.isfinite(loss_value):
        return loss_value, metrics, float("nan"), f"the loss became {loss_value}"
    params = [p for p in model.parameters() if p.requires_grad]
    if distributed.world_size() > 1:
        for p in params:  # the all-reduce needs the same tensors on every rank
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        distributed.all_reduce_grads_(params)
        if not s.sync_bn:  # before the EMA reads them: every rank's teacher gets rank 0's statistics
            distributed.broadcast_buffers_(model)
    body = [p for p in params if id(p) not in s.aux_ids]  # a tracking probe is neither clipped nor counted
    if s.grad_clip:
        norm = torch.nn.utils.clip_grad_norm_(body, s.grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in body if p.grad is not None])
    metrics["grad_norm"] = float(norm)
    if not math.isfinite(metrics["grad_norm"]):  # a finite loss can still overflow in backward
        return loss_value, metrics, float("nan"), f"the gradient norm became {metrics['grad_norm']}"
    rho = float("nan")
    if ema is not None and s.update_from == "pre":
        rho = ema.update(parts.ema_source, s.samples_after)  # θ_t: the parameters before the step
    optimizer.step()
    if ema is not None and s.update_from == "post":
        rho = ema.update(parts.ema_source, s.samples_after)  # θ_{t+1}
    return loss_value, metrics, rho, None


def _batch_len(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)):
        return _batch_len(batch[0])
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    raise UserError(f"task error: cannot tell the size of a batch of type {type(batch).__name__}")


@dataclass
class StepContext:
    device: torch.device
    precision: str
    grad_clip: float | None
    update_from: str
    sync_bn: bool
    aux_ids: frozenset = frozenset()  # id() of TaskParts.aux_params, left out of clipping
    samples_after: int = 0
    stop_flag: bool = False
    time_flag: bool = False


# --- evaluation -------------------------------------------------------------------------------


def evaluate(model, teacher, parts, device, precision) -> dict:
    if parts.evaluate is None:
        return {}
    model.eval()
    if teacher is not None:
        teacher.eval()
    try:
        with autocast(device, precision):
            out = parts.evaluate(model, teacher) or {}
    finally:
        model.train()
        if teacher is not None:
            teacher.train()
    return {k: float(v) for k, v in out.items()}


# --- the loop ---------------------------------------------------------------------------------


def train(ctx: RunContext, parts: TaskParts) -> dict:
    """Train `parts.model` as `ctx` says; returns the final metrics (see the module docstring)."""
    d = distributed.setup()
    try:
        return _train(ctx, parts, d)
    finally:
        distributed.teardown()


def _train(ctx: RunContext, parts: TaskParts, d: distributed.Dist) -> dict:
    spec = ctx.spec
    if spec["batch"].get("unit", "samples") != "samples":
        raise UserError(f"{ctx.experiment}: batch.unit {spec['batch']['unit']!r} needs the task's own batching; "
                        f"the shared loop counts batches in samples")
    out = ctx.out
    if d.is_main:
        (out / FIGURES).mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    ck_path = checkpoint.path_in(out)
    if not ctx.resume and ck_path.exists():
        raise UserError(f"{out} already holds a run (checkpoint.pt); pass --resume to continue it or "
                        f"--out NEW_DIR to start another")

    precision = spec.get("precision", "fp32")
    set_precision(precision)
    seed_everything(ctx.seed, d.rank)
    base_batch = spec["batch"]["size"]
    n = len(parts.train_set)
    if n < 1:
        raise UserError("task error: the training set is empty")
    sched = schedules.from_spec(spec, n)
    total_samples = sched.total_epochs * n
    batches = BatchSchedule(ctx.progressive, base_batch, ctx.kappa, get(spec, "schedule.epochs"))
    plans = Plans(ctx)

    model = parts.model.to(d.device)
    model = distributed.maybe_sync_batchnorm(model, bool(get(spec, "norm.sync_bn", False)))
    sync_bn = distributed.sync_batchnorm_possible(bool(get(spec, "norm.sync_bn", False)))
    parts.model = model
    distributed.broadcast_module_(model)
    model.train()

    kappa = batches.kappa_at(0)
    plan = plans(kappa)
    set_bn_momentum(model, plan)
    ema = None
    if get(spec, "ema.momentum") is not None:
        ema = ModelEma(parts.ema_source, plan["ema.momentum"], buffers=get(spec, "ema.buffers", "copy"),
                       # the plan's start_steps/κ steps of the first stage's batch (what `plan` shows)
                       start_samples=(plan.get("ema.start_steps", 0) or 0) * plan["batch_size"],
                       dtype=get(spec, "ema.dtype", "float32"))
        ema.module.train()
    teacher = ema.module if ema is not None else None
    optimizer = optimizers.build(spec, model, parts.no_decay, plan, frozenset(parts.aux_params), parts.aux_lr_ratio)

    clock = Clock()
    log = MetricsLog(out, enabled=d.is_main)
    last_ckpt: tuple[str, int] | None = None
    final: dict = {}
    if ctx.resume:
        ck = checkpoint.load(out, d.device)
        if ck.get("fingerprint") != fingerprint(ctx):
            raise UserError(f"--resume: {out} was made with other settings (spec, κ, rule, seed or progressive "
                            f"schedule differ); use the original command or a new --out")
        model.load_state_dict(ck["model"])
        if ema is not None:
            ema.load_state_dict(ck["ema"])
        optimizer.load_state_dict(ck["optimizer"])
        clock = Clock(**ck["clock"])
        kappa = ck["kappa"]
        plan = plans(kappa)
        set_bn_momentum(model, plan)
        if ema is not None:
            ema.set_momentum(plan["ema.momentum"])
        optimizers.apply_plan(optimizer, plan, sched.lr(clock.samples_seen / n, plan))
        if not checkpoint.restore_rng(ck):
            seed_everything(distributed._mix(ctx.seed, clock.samples_seen), d.rank)
        log.truncate_after(clock.samples_seen)
        last_ckpt = (str(ck_path), clock.samples_seen)
        final = ck.get("final_metrics") or {}
        if ck.get("finished"):
            log.close()
            return final
    else:
        log.start_fresh()

    workers = parts_workers(parts, ctx, d)
    stage_rows = stage_layouts(batches, base_batch, n, sched, d.world_size, ctx.max_device_batch)
    hp = hparams(ctx, parts, d, sched, n, total_samples, stage_rows, workers)
    hp["sync_bn_effective"] = sync_bn
    if d.is_main:
        write_hparams(out, hp)
    log.attach_wandb(ctx.wandb, out, out.name, hp)

    every_eval = float(get(spec, "probe.eval_every_epochs", 1.0) or 1.0)
    every_ckpt = float(ctx.extra.get("checkpoint_every_epochs", 1.0))
    ckpt_seconds = 60.0 * float(ctx.extra.get("checkpoint_every_minutes", 30.0))
    next_eval = _next_multiple(clock.samples_seen / n, every_eval)
    next_ckpt = _next_multiple(clock.samples_seen / n, every_ckpt)
    last_eval_at = -1
    named = dict(model.named_parameters())
    step_ctx = StepContext(d.device, precision, get(spec, "optimizer.grad_clip"), get(spec, "ema.update_from", "post"),
                           sync_bn, frozenset(id(named[n]) for n in parts.aux_params if n in named))
    progress = Progress(total_samples, clock.samples_seen, enabled=d.is_main and not ctx.quiet)
    t_ckpt = time.monotonic()
    window = Window()

    def diverged(what: str, epoch_now: float) -> TrainingDiverged:
        log.close()
        progress.stop()
        where = (f"the last good checkpoint is {last_ckpt[0]} ({last_ckpt[1]} samples seen); "
                 f"lower the learning rate or κ and --resume") if last_ckpt else \
            "no checkpoint was written yet; lower the learning rate or κ and start again"
        return TrainingDiverged(f"{what} after {clock.samples_seen} samples seen (epoch {epoch_now:.4g}, "
                                f"step {clock.step}); stopped: {where}")

    def save(finished: bool = False) -> None:
        nonlocal last_ckpt, t_ckpt
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            # never overwrite the last good checkpoint with a diverged model
            raise diverged("the weights became non-finite", clock.samples_seen / n)
        payload = {"model": model.state_dict(), "ema": ema.state_dict() if ema is not None else None,
                   "optimizer": optimizer.state_dict(), "clock": vars(clock).copy(), "kappa": kappa,
                   "stage": _stage_index(stage_rows, clock.epoch), "fingerprint": fingerprint(ctx),
                   "world_size": d.world_size, "finished": finished, "final_metrics": final}
        checkpoint.save(out, payload)
        last_ckpt = (str(ck_path), clock.samples_seen)
        t_ckpt = time.monotonic()

    with checkpoint.StopSignal() as stop, progress, contextlib.closing(log):
        while clock.samples_seen < total_samples - 1e-6:
            e = clock.epoch
            new_kappa = batches.kappa_at(e)
            if new_kappa != kappa or clock.step == 0:
                # Progressive Scaling: every scaled value re-derived from the base spec for κ_e.
                kappa, plan = new_kappa, plans(new_kappa)
                set_bn_momentum(model, plan)
                if ema is not None:
                    ema.set_momentum(plan["ema.momentum"])
                optimizers.apply_plan(optimizer, plan, sched.lr(clock.samples_seen / n, plan))
            lay = distributed.layout(batches.batch_at(e), d.world_size, ctx.max_device_batch)
            per_epoch = n // lay.global_batch
            if per_epoch < 1:
                raise UserError(f"the batch κB = {lay.global_batch} is larger than the training set ({n} samples); "
                                f"use a smaller κ or more data")
            epoch_start = e * n
            remaining = math.ceil((total_samples - epoch_start) / lay.global_batch - 1e-9)
            last = min(per_epoch, remaining)
            if hasattr(parts.train_set, "set_epoch"):
                parts.train_set.set_epoch(e)
            perm = distributed.epoch_permutation(n, ctx.seed, e)
            loader = iter(epoch_loader(parts, perm, lay, d.rank, clock.batch, last, workers,
                                       pin=d.device.type == "cuda", seed=distributed._mix(ctx.seed, e, d.rank)))
            log_every = int(ctx.extra.get("log_every_steps") or max(1, math.ceil(per_epoch / 50)))
            first = clock.batch  # 0, or where a resumed run re-enters the epoch
            for i in range(first, last):
                micro = [next(loader) for _ in range(lay.accumulation)]
                epoch_now = clock.samples_seen / n
                lr = sched.lr(epoch_now, plan)
                optimizers.set_lr(optimizer, lr)
                done_epoch = i + 1 == per_epoch
                step_ctx.samples_after = (e + 1) * n if done_epoch else epoch_start + (i + 1) * lay.global_batch
                step_ctx.stop_flag = stop.requested
                step_ctx.time_flag = d.is_main and time.monotonic() - t_ckpt > ckpt_seconds
                loss, metrics, rho, problem = optimizer_step(model, parts, teacher, ema, optimizer, micro, lay,
                                                             step_ctx)
                if problem:
                    raise diverged(f"{problem} in the batch", epoch_now)
                clock.step += 1
                clock.batch = i + 1
                clock.samples_seen = step_ctx.samples_after
                window.add(loss, metrics)
                progress.advance(clock.samples_seen, loss)
                if (i + 1) % log_every == 0 or i == first or done_epoch or i + 1 == last:
                    log.log({"kind": "train", "samples_seen": clock.samples_seen, "epoch": clock.samples_seen / n,
                             "step": clock.step, "kappa": kappa, "batch_size": lay.global_batch,
                             "accumulation": lay.accumulation, "lr": lr,
                             "ema_momentum": rho if ema is not None else None,
                             **window.mean(), "samples_per_s": progress.rate(), "wall_s": progress.elapsed()})
                    window = Window()
                if done_epoch:
                    clock.epoch, clock.batch = e + 1, 0
                at_end = clock.samples_seen >= total_samples - 1e-6
                if clock.samples_seen / n + 1e-9 >= next_eval or at_end:
                    ev = evaluate(model, teacher, parts, d.device, precision)
                    final, last_eval_at = {**final, **ev}, clock.samples_seen
                    if ev:
                        log.log({"kind": "eval", "samples_seen": clock.samples_seen, "epoch": clock.samples_seen / n,
                                 "step": clock.step, "kappa": kappa, **ev})
                    next_eval = _next_multiple(clock.samples_seen / n, every_eval)
                due = clock.samples_seen / n + 1e-9 >= next_ckpt
                if (due or step_ctx.time_flag or step_ctx.stop_flag) and not at_end:
                    save()
                    next_ckpt = _next_multiple(clock.samples_seen / n, every_ckpt)
                if step_ctx.stop_flag and not at_end:  # at the end, the final checkpoint follows
                    log.close()
                    progress.stop()
                    print(f"SIGTERM: checkpoint written at {clock.samples_seen} samples seen; "
                          f"continue with --resume", file=sys.stderr)
                    raise SystemExit(143)
                if at_end:
                    break
            del loader
        if last_eval_at != clock.samples_seen:
            final = {**final, **evaluate(model, teacher, parts, d.device, precision)}
        result = {**final, "samples_seen": clock.samples_seen, "epoch": clock.samples_seen / n,
                  "steps": clock.step, "kappa": kappa}
        final = result
        save(finished=True)
    log.close()
    return result


def _next_multiple(epoch: float, every: float) -> float:
    return (math.floor(epoch / every + 1e-9) + 1) * every


def _stage_index(rows: list[dict], epoch: int) -> int:
    for i, r in enumerate(rows):
        if r["start_epoch"] <= epoch < r["end_epoch"]:
            return i
    return len(rows) - 1


def parts_workers(parts: TaskParts, ctx: RunContext, d: distributed.Dist) -> int:
    w = ctx.extra.get("num_workers", getattr(parts, "num_workers", None))
    if w is not None:
        return int(w)
    if d.device.type == "cpu":
        return 0  # CPU training shares the same cores; workers would only compete
    import os

    return min(8, max(1, (os.cpu_count() or 2) // max(1, d.world_size) - 1))


def stage_layouts(batches: BatchSchedule, base_batch, n, sched, world, max_device_batch) -> list[dict]:
    """Batch, κ, micro-batch and accumulation of every stage (hparams.json "layout")."""
    rows = []
    stage_list = batches.stages() if batches.epochs is not None else None
    if not stage_list or math.isinf(stage_list[0].end_epoch):
        stage_list = [Stage(0.0, sched.total_epochs, batches.batch_at(0), batches.kappa_at(0))]
    for s in stage_list:
        lay = distributed.layout(s.batch_size, world, max_device_batch)
        rows.append({"start_epoch": s.start_epoch, "end_epoch": s.end_epoch, "batch_size": lay.global_batch,
                     "kappa": s.kappa, "world_size": world, "accumulation": lay.accumulation,
                     "micro_batch": lay.max_micro, "steps_per_epoch": n // lay.global_batch})
    return rows


def hparams(ctx, parts, d, sched, n, total_samples, stage_rows, workers) -> dict:
    """The plan as `emarule plan --format json` prints it, plus how this run executes it."""
    import platform

    return {
        **ctx.plan.as_dict(), "seed": ctx.seed, "preset": ctx.preset, "progressive": ctx.progressive,
        "spec": ctx.spec, "layout": stage_rows, "world_size": d.world_size, "max_device_batch": ctx.max_device_batch,
        "device": str(d.device), "dataset_size": n, "total_epochs": sched.total_epochs,
        "warmup_epochs": sched.warmup_epochs, "total_samples": total_samples, "num_workers": workers,
        "task": parts.info, "torch": torch.__version__, "python": platform.python_version(),
        "data": str(ctx.data) if ctx.data else None,
    }


# --- progress and logging windows --------------------------------------------------------------


class Window:
    """Mean loss and task metrics over the steps since the last logged row."""

    def __init__(self):
        self.n = 0
        self.sums: dict[str, float] = {}

    def add(self, loss: float, metrics: dict) -> None:
        self.n += 1
        for k, v in {"loss": loss, **metrics}.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def mean(self) -> dict:
        return {k: v / max(1, self.n) for k, v in self.sums.items()}


class Progress:
    """A rich progress bar on rank 0 (samples, samples/s, loss, ETA); silent when disabled."""

    def __init__(self, total: float, start: float, enabled: bool):
        self.total, self.start_samples, self.enabled = total, start, enabled
        self.t0 = time.monotonic()
        self.samples = start
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(TextColumn("[bold]train"), BarColumn(),
                                     TextColumn("{task.completed:,.0f}/{task.total:,.0f} samples"),
                                     TextColumn("{task.fields[rate]:,.0f} samples/s"),
                                     TextColumn("loss {task.fields[loss]:.4g}"), TimeRemainingColumn(),
                                     console=Console(stderr=True), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start_samples, rate=0.0,
                                            loss=float("nan"))
        return self

    def advance(self, samples: float, loss: float) -> None:
        self.samples = samples
        if self._bar is not None:
            self._bar.update(self._task, completed=samples, rate=self.rate(), loss=loss)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def rate(self) -> float:
        dt = self.elapsed()
        return (self.samples - self.start_samples) / dt if dt > 0 else 0.0

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __exit__(self, *exc):
        self.stop()
        return False
