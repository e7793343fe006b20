"""Start-up: `emarule table momenta` against `python -c "import typer, rich, yaml"`.

Both are fresh interpreters of this checkout's Python (subprocesses), taking turns: the floor is what
any typer/rich/yaml CLI pays to start, and the ratio is what emarule adds on top (its imports, the
spec and table code). Prints the median and the minimum of each and the ratio of the medians and of
the minimums.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "emarule"  # the console script `make` installs beside this Python
COMMANDS = {
    "emarule table momenta": [*([str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "emarule"]),
                              "table", "momenta"],
    "python -c 'import typer, rich, yaml'": [sys.executable, "-c", "import typer, rich, yaml"],
}


def once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15, help="runs of each (after one untimed run of each)")
    ap.add_argument("--quick", action="store_true", help="one run of each, no warm-up")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    times: dict = {name: [] for name in COMMANDS}
    for cmd in COMMANDS.values() if not args.quick else ():  # the first start after an install reads from disk
        once(cmd)
    for _ in range(repeats):
        for name, cmd in COMMANDS.items():
            times[name].append(once(cmd))
    print(f"start-up, {repeats} runs of each in turn:")
    for name, ts in times.items():
        print(f"  {name:<38} median {statistics.median(ts) * 1e3:7.0f} ms   min {min(ts) * 1e3:7.0f} ms")
    ours, floor = times["emarule table momenta"], times["python -c 'import typer, rich, yaml'"]
    print(f"  ratio emarule/floor: median {statistics.median(ours) / statistics.median(floor):.2f}x  "
          f"min {min(ours) / min(floor):.2f}x")


if __name__ == "__main__":
    main()
