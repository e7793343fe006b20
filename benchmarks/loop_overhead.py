"""emarule's training loop against a bare PyTorch loop on the same model, data, optimizer and EMA.

For an experiment's preset (default polyak-r50 --preset cpu, and byol-r18 --preset cpu), each round
builds the task's parts afresh and trains them twice, taking turns (emarule, bare, emarule, bare...):

  emarule  emarule.engine.loop.train(ctx, parts): the whole loop (schedules, clock, logging, EMA, checks)
  bare     a plain for-loop over a DataLoader of the same training set: forward, loss, backward,
           optimizer.step and the EMA as one torch._foreach_lerp_ (buffers copied), nothing else

Both use the optimizer emarule builds for the spec (torch's SGD with the same parameter groups) and
the EMA's momentum and placement from the plan. Timing starts at the loss call of step `warmup` and
ends at the loss call of step `warmup + steps` (the task's loss is wrapped to read the clock), so
set-up, evaluations and the final checkpoint are outside it. The emarule run is stopped there.
polyak's bare loss is the label-smoothed cross-entropy alone; byol's is the task's loss (the BYOL
objective with its tracking probe, stepped after the optimizer as the task's on_step does).

Prints samples/s of each (median over rounds) and emarule/bare as the median and the minimum of the
per-round ratios, twice: by wall time (what a user waits for) and by this process's CPU time, which
other processes on a shared machine disturb far less (both loops run on one thread: no workers).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FAMILIES = {"polyak": ("polyak-r50", "cpu"), "byol": ("byol-r18", "cpu")}
PRESET = {}  # family -> another preset (--quick: tiny)


NEVER = 10**6  # epochs: an evaluation or checkpoint cadence that no timed run reaches


class Done(Exception):
    """Raised by the timed loss once the measured steps are over."""


def context(experiment: str, preset: str | None, out: Path, sets: tuple = (), kappa: float | None = None, **engine):
    """The RunContext `emarule run EXPERIMENT --preset PRESET [--set ...] [--kappa K]` builds (κ = 1 unless
    given, with the EMA rule), with the evaluations and checkpoints put past the run's end: the bare loop
    has neither, and an epoch of byol-r18's cpu preset is 156 steps. `engine`: more RunContext fields
    (data, max_device_batch, num_workers)."""
    from emarule.request.resolve import resolve
    from emarule.engine.context import RunContext

    s, k, rule, pr, p = resolve(experiment, None, preset, [f"eval.every_epochs={NEVER}", *sets],
                                None if kappa is None else str(kappa), None, False, None, None)
    return RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=out, progressive=pr, preset=preset, quiet=True,
                      checkpoint_every_epochs=NEVER, **engine)


def build(ctx):
    from emarule.tasks import build_parts

    return build_parts(ctx)


def clocked(loss, stamps: list, last: int):
    """The loss, reading the clock at each call; raises Done at call `last`."""

    def timed(*args, **kwargs):
        stamps.append((time.perf_counter(), time.process_time()))
        if len(stamps) > last:
            raise Done
        return loss(*args, **kwargs)

    return timed


def rate(stamps: list, warmup: int, steps: int, batch: int) -> tuple:
    """(samples per second of wall time, samples per second of this process's CPU time)."""
    (w0, c0), (w1, c1) = stamps[warmup], stamps[warmup + steps]
    return steps * batch / (w1 - w0), steps * batch / (c1 - c0)


def run_emarule(ctx, warmup: int, steps: int) -> tuple:
    from emarule.engine.loop import train

    parts = build(ctx)
    stamps: list = []
    parts.loss = clocked(parts.loss, stamps, warmup + steps)
    try:
        train(ctx, parts)
    except Done:
        pass
    else:
        raise SystemExit(f"{ctx.experiment}: the run ended before {warmup + steps} steps; use fewer --steps")
    return rate(stamps, warmup, steps, int(ctx.spec["batch"]["size"]))


def run_bare(ctx, warmup: int, steps: int) -> tuple:
    from torch.utils.data import DataLoader, default_collate

    from emarule.engine import optimizers
    from emarule.engine.interface import Now

    from emarule.engine.loop import memory_format

    spec, plan = ctx.spec, ctx.plan
    parts = build(ctx)
    model = parts.model.to(memory_format=memory_format(ctx.cfg)).train()  # the layout emarule's loop trains in
    source = parts.ema_source if parts.ema_source is not None else model
    opt = optimizers.build(spec, model, parts.no_decay, plan, frozenset(parts.aux_params), parts.aux_lr_ratio)
    ema = copy.deepcopy(source)
    for p in ema.parameters():
        p.requires_grad_(False)
    ema_p, src_p = list(ema.parameters()), list(source.parameters())
    ema_b, src_b = list(ema.buffers()), list(source.buffers())
    weight = 1.0 - plan["ema.momentum"]
    pre = spec["ema"].get("update_from", "post") == "pre"
    batch = int(spec["batch"]["size"])
    if hasattr(parts.train_set, "set_epoch"):
        parts.train_set.set_epoch(0)
    loader = DataLoader(parts.train_set, batch_size=batch, shuffle=True, drop_last=True,
                        collate_fn=parts.collate or default_collate, generator=torch.Generator().manual_seed(0))
    stamps: list = []
    if spec["task"] == "polyak":
        smoothing = float(spec["data"].get("label_smoothing", 0.0))

        def loss_fn(model, teacher, b, now):
            x, y = b
            return F.cross_entropy(model(x), y, label_smoothing=smoothing), {}
    else:
        loss_fn = parts.loss
    loss_fn = clocked(loss_fn, stamps, warmup + steps)
    now = Now(seen=0.0, samples=0, epoch=0.0, base_step=0.0, step=0, kappa=ctx.kappa, plan=plan, emas={})
    teacher = ema if parts.teacher is not None else None

    @torch.no_grad()
    def update_ema():
        torch._foreach_lerp_(ema_p, src_p, weight)
        if ema_b:
            torch._foreach_copy_(ema_b, src_b)

    try:
        while True:
            for b in loader:
                loss, metrics = loss_fn(model, teacher, b, now)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if pre:
                    update_ema()
                opt.step()
                if not pre:
                    update_ema()
                if parts.on_step is not None:
                    parts.on_step(now, {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)})
    except Done:
        pass
    return rate(stamps, warmup, steps, batch)


def measure(family: str, rounds: int, warmup: int, steps: int, root: Path) -> dict:
    experiment, preset = FAMILIES[family]
    preset = PRESET.get(family, preset)
    results: dict = {"emarule": [], "bare": []}
    for r in range(rounds + (rounds > 1)):  # round 0 warms up both (imports, allocator, caches); not counted
        for name, fn in (("emarule", run_emarule), ("bare", run_bare)):
            ctx = context(experiment, preset, root / f"{family}-{name}-{r}")
            value = fn(ctx, warmup, steps)
            if r or rounds == 1:
                results[name].append(value)
    return results


def report(family: str, results: dict, threads: int, steps: int) -> None:
    experiment, preset = FAMILIES[family]
    preset = PRESET.get(family, preset)
    print(f"{experiment} --preset {preset}: {steps} steps per run, {len(results['emarule'])} rounds (emarule, bare "
          f"in turn), {threads} torch thread(s)")
    print_ratios(results, "emarule", "bare", "emarule/bare")


def print_ratios(results: dict, a: str, b: str, ratio: str) -> None:
    """Two lines, by wall time and by this process's CPU time: the median samples/s of `a` and of `b`, and
    the per-round ratios of a's samples/s to b's (named `ratio`) as median, min and max."""
    for i, clock in enumerate(("wall", "cpu")):
        xs, ys = [r[i] for r in results[a]], [r[i] for r in results[b]]
        ratios = [x / y for x, y in zip(xs, ys, strict=True)]
        print(f"  samples/s of {clock} time: {a} {statistics.median(xs):.1f}, {b} {statistics.median(ys):.1f} "
              f"(medians); ratio {ratio} ({clock}): median {statistics.median(ratios):.3f}x  "
              f"min {min(ratios):.3f}x  max {max(ratios):.3f}x")


def costs(family: str, root: Path, reps: int = 500) -> None:
    """What emarule's loop does on every step that the bare loop does not, each timed alone in CPU µs on the
    family's model after one step: the logged gradient norm, ModelEma's update against the bare loop's two foreach
    calls, and within it the check that the model still holds the tensors it paired."""
    from torch.utils.data import default_collate

    from emarule.engine.ema import ModelEma
    from emarule.engine.interface import Now
    from emarule.engine.step import total_norm

    experiment, preset = FAMILIES[family]
    ctx = context(experiment, PRESET.get(family, preset), root / f"{family}-costs")
    parts = build(ctx)
    model, batch = parts.model.train(), int(ctx.spec["batch"]["size"])
    items = (parts.collate or default_collate)([parts.train_set[i] for i in range(batch)])
    now = Now(seen=0.0, samples=0, epoch=0.0, base_step=0.0, step=0, kappa=1.0, plan=ctx.plan, emas={})
    ema = ModelEma(parts.ema_source if parts.ema_source is not None else model, 0.99)
    teacher = ema.module if parts.teacher is not None else None

    def step():
        model.zero_grad(set_to_none=True)
        parts.loss(model, teacher, items, now)[0].backward()

    shadow, source = list(ema.module.parameters()), list(model.parameters())
    shadow_b, source_b = list(ema.module.buffers()), list(model.buffers())

    @torch.no_grad()
    def bare_ema():
        torch._foreach_lerp_(shadow, source, 0.01)
        torch._foreach_copy_(shadow_b, source_b)

    def cpu_us(fn, n=reps) -> float:
        fn()
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n * 1e6

    step_us = cpu_us(step, 20)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    rows = [("forward + backward (scale)", step_us),
            ("gradient norm (logged, checked finite)", cpu_us(lambda: total_norm(grads))),
            ("ModelEma.update", cpu_us(lambda: ema.update(model, batch_size=batch))),
            ("  bare EMA: _foreach_lerp_ + _foreach_copy_", cpu_us(bare_ema)),
            ("  ModelEma's check of the paired tensors", cpu_us(lambda: ema._pair(model)))]
    print(f"{experiment} --preset {PRESET.get(family, preset)}: per-step costs, CPU µs (the mean of {reps} calls)")
    for name, us in rows:
        print(f"  {name:<46} {us:9.1f} µs  {100 * us / step_us:5.1f} % of forward + backward")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=10, help="steps before the timing starts")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same for both loops")
    ap.add_argument("--quick", action="store_true", help="a smoke test: polyak's tiny preset, 1 round of 4 steps")
    ap.add_argument("--costs", action="store_true", help="instead: time what the loop adds per step, each alone")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 4, 1
        args.family = "polyak" if args.family == "all" else args.family
        PRESET[args.family] = "tiny"
    torch.set_num_threads(args.threads)
    families = list(FAMILIES) if args.family == "all" else [args.family]
    with tempfile.TemporaryDirectory(prefix="emarule-bench-") as tmp:
        for family in families:
            if args.costs:
                costs(family, Path(tmp))
                continue
            results = measure(family, args.rounds, args.warmup, args.steps, Path(tmp))
            report(family, results, args.threads, args.steps)


if __name__ == "__main__":
    main()
