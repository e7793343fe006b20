"""What the noisy parabola's figures cost: `emarule run parabola` with its figures against the same study
with the figures left out, taking turns in one process.

Both run the task's `run` on the preset's spec (default `quick`; `--preset paper` for the full study)
with `parabola.workers=1`, so that every figure is drawn in this process and can be timed. Prints the
wall time of each (median over rounds), the ratio with/without figures (1.00 would be figures for
free), and the figures' share of the full run's wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIGURES = ("trajectories", "momenta_and_errors", "summary")


def context(preset: str, out: Path):
    from emarule.request.resolve import resolve
    from emarule.engine.context import RunContext

    s, k, rule, pr, p = resolve("parabola", None, preset, ["parabola.workers=1"], None, None, False, None, None)
    return RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=out, preset=preset, quiet=True)


def one_run(preset: str, out: Path, draw: bool) -> tuple[float, float]:
    """(wall seconds of the run, seconds spent drawing figures)."""
    from emarule.studies.parabola import figures
    from emarule.studies.parabola import run as task

    originals = {name: getattr(figures, name) for name in FIGURES}
    spent = [0.0]

    def timed(fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs) if draw else b""
            finally:
                spent[0] += time.perf_counter() - t0

        return call

    try:
        for name, fn in originals.items():
            setattr(figures, name, timed(fn))
        t0 = time.perf_counter()
        task.run(context(preset, out))
        return time.perf_counter() - t0, spent[0]
    finally:
        for name, fn in originals.items():
            setattr(figures, name, fn)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a smoke test: the tiny preset, one round, no warm-up")
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.rounds = "tiny", 1
    walls: dict = {"with figures": [], "without": []}
    drawing = []
    with tempfile.TemporaryDirectory(prefix="emarule-bench-") as tmp:
        if not args.quick:
            one_run(args.preset, Path(tmp) / "warm", True)  # imports, font cache
        for r in range(args.rounds):
            for name, draw in (("with figures", True), ("without", False)):
                wall, drew = one_run(args.preset, Path(tmp) / f"{r}-{draw}", draw)
                walls[name].append(wall)
                if draw:
                    drawing.append(drew / wall)
    full, bare = walls["with figures"], walls["without"]
    ratios = [a / b for a, b in zip(full, bare, strict=True)]
    print(f"emarule run parabola --preset {args.preset} (parabola.workers=1), {args.rounds} rounds in turn:")
    print(f"  with figures {statistics.median(full):6.2f} s   without {statistics.median(bare):6.2f} s (medians); "
          f"figures {statistics.median(drawing):.0%} of the full run's wall time")
    print(f"  ratio with/without figures: median {statistics.median(ratios):.3f}x  min {min(ratios):.3f}x")


if __name__ == "__main__":
    main()
