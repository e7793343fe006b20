"""emarule's training loop with the model in channels_last (NHWC) against the same loop in contiguous (NCHW).

For each ResNet preset that sets `memory_format: channels_last` (polyak-r50 and byol-r50-lars, `--preset cpu`),
each round builds the task's parts afresh and trains them twice, taking turns (channels_last, contiguous), at
κ = 1 on one torch thread, as `emarule reproduce` runs two runs side by side on two cores. Timing covers
`--steps` steps after `--warmup`, read at the loss call as in loop_overhead.py; evaluations and checkpoints
are set past the end. Prints the samples/s of each layout (medians) and contiguous time / channels_last
time, by wall time and by this process's CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from loop_overhead import Done, NEVER, build, clocked, rate  # noqa: E402

PRESETS = {"polyak": ("polyak-r50", "cpu"), "byol-r50-lars": ("byol-r50-lars", "cpu")}
LAYOUTS = ("channels_last", "contiguous")


def context(experiment: str, preset: str, layout: str, out: Path):
    from emarule.cli.main import resolve
    from emarule.engine.context import RunContext

    s, k, rule, pr, p = resolve(experiment, None, preset, [f"eval.every_epochs={NEVER}", f"memory_format={layout}"],
                                None, None, False, None, None)
    return RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=out, progressive=pr, preset=preset, quiet=True,
                      checkpoint_every_epochs=NEVER)


def timed_run(ctx, warmup: int, steps: int) -> tuple:
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


def measure(experiment: str, preset: str, rounds: int, warmup: int, steps: int, root: Path) -> dict:
    results: dict = {layout: [] for layout in LAYOUTS}
    for r in range(rounds + (rounds > 1)):  # round 0 warms up both; not counted
        for layout in LAYOUTS:
            value = timed_run(context(experiment, preset, layout, root / f"{experiment}-{layout}-{r}"), warmup, steps)
            if r or rounds == 1:
                results[layout].append(value)
    return results


def report(experiment: str, preset: str, results: dict, steps: int) -> None:
    print(f"{experiment} --preset {preset}: {steps} steps per run, {len(results['contiguous'])} rounds "
          f"(channels_last, contiguous in turn), 1 torch thread")
    for i, clock in enumerate(("wall", "cpu")):
        nhwc, nchw = [r[i] for r in results["channels_last"]], [r[i] for r in results["contiguous"]]
        ratios = [a / b for a, b in zip(nhwc, nchw, strict=True)]  # samples/s ratio = time ratio inverted
        print(f"  samples/s of {clock} time: channels_last {statistics.median(nhwc):.1f}, contiguous "
              f"{statistics.median(nchw):.1f} (medians); ratio contiguous/channels_last time ({clock}): "
              f"median {statistics.median(ratios):.3f}x  min {min(ratios):.3f}x  max {max(ratios):.3f}x")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=[*PRESETS, "all"], default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="steps before the timing starts")
    ap.add_argument("--quick", action="store_true", help="a smoke test: polyak's tiny preset, 1 round of 2 steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    families = list(PRESETS) if args.family == "all" else [args.family]
    if args.quick:
        args.rounds, args.steps, args.warmup, families = 1, 2, 1, ["polyak"]
    with tempfile.TemporaryDirectory(prefix="emarule-bench-") as tmp:
        for family in families:
            experiment, preset = PRESETS[family]
            preset = "tiny" if args.quick else preset
            report(experiment, preset, measure(experiment, preset, args.rounds, args.warmup, args.steps, Path(tmp)),
                   args.steps)


if __name__ == "__main__":
    main()
