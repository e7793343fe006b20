"""emarule's training loop with the model in channels_last (NHWC) against the same loop in contiguous (NCHW).

For each ResNet preset that sets `memory_format: channels_last` (polyak-r50 and byol-r50-lars, `--preset cpu`),
each round builds the task's parts afresh and trains them twice, one layout after the other (which goes first
alternates from round to round, so that neither is always the one run in a process that has already trained), at
κ = 1 (`--kappa`) on one torch thread, as `emarule reproduce` runs two runs side by side on two cores. Timing covers
`--steps` steps after `--warmup`, read at the loss call (loop_overhead.py's `run_emarule`); evaluations and checkpoints
are set past the end. Prints the samples/s of each layout (medians) and contiguous time / channels_last
time, by wall time and by this process's CPU time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from loop_overhead import context, print_ratios, run_emarule  # noqa: E402

PRESETS = {"polyak": ("polyak-r50", "cpu"), "byol-r50-lars": ("byol-r50-lars", "cpu")}
LAYOUTS = ("channels_last", "contiguous")


def measure(experiment: str, preset: str, rounds: int, warmup: int, steps: int, root: Path, kappa: float) -> dict:
    results: dict = {layout: [] for layout in LAYOUTS}
    for r in range(rounds + (rounds > 1)):  # round 0 warms up both; not counted
        for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):  # each layout goes first in turn
            ctx = context(experiment, preset, root / f"{experiment}-{layout}-{r}", (f"memory_format={layout}",), kappa)
            value = run_emarule(ctx, warmup, steps)
            if r or rounds == 1:
                results[layout].append(value)
    return results


def report(experiment: str, preset: str, results: dict, steps: int, kappa: float) -> None:
    print(f"{experiment} --preset {preset} --kappa {kappa:g}: {steps} steps per run, "
          f"{len(results['contiguous'])} rounds (each layout first in every other round), 1 torch thread")
    # channels_last's samples/s over contiguous's is contiguous's time over channels_last's
    print_ratios(results, "channels_last", "contiguous", "contiguous/channels_last time")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=[*PRESETS, "all"], default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="steps before the timing starts")
    ap.add_argument("--kappa", type=float, default=1.0, help="the runs' κ (the batch grows with it)")
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
            results = measure(experiment, preset, args.rounds, args.warmup, args.steps, Path(tmp), args.kappa)
            report(experiment, preset, results, args.steps, args.kappa)


if __name__ == "__main__":
    main()
