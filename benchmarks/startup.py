"""Start-up time of `emarule table momenta` against `python -c "import typer, rich, yaml"`.

The floor is what any typer + rich + YAML command line pays before it does anything; the ratio says
what emarule adds on top. The two commands take turns (A, B, A, B, ...), each a fresh process, so that
load from other processes hits both alike; the median of each is reported, and their ratio.

Both run with compiled bytecode, as after `pip install` (which compiles every module): the caches go to a
temporary PYTHONPYCACHEPREFIX, written by an uncounted first run, so the checkout gets no __pycache__.
`--as-is` keeps the caller's environment instead (with PYTHONDONTWRITEBYTECODE=1, emarule's modules
are compiled from source on every start, and typer's, rich's and yaml's are not: the ratio is higher).

    .venv/bin/python benchmarks/startup.py --runs 31
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = [sys.executable, "-c", "import typer, rich, yaml"]


def emarule_command(script: Path | None, args: list[str]) -> list[str]:
    """The console script (what a user types; by default the one beside this interpreter), else `python -m emarule`."""
    script = script or Path(sys.executable).parent / "emarule"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "emarule", *args]


def once(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=31, help="runs of each command (at least 21 for a stable median)")
    ap.add_argument("--as-is", action="store_true", help="the caller's environment, bytecode settings included")
    ap.add_argument("--emarule", type=Path, metavar="PATH",
                    help="the emarule script to time, e.g. another checkout's .venv/bin/emarule")
    ap.add_argument("args", nargs="*", default=["table", "momenta"], help="emarule's arguments")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be ≥ 1")
    if a.emarule is not None and not a.emarule.is_file():
        ap.error(f"--emarule {a.emarule}: no such file")
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="emarule-startup-") as cache:
        if not a.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
        measure(a, env)


def measure(a: argparse.Namespace, env: dict) -> None:
    cmd = emarule_command(a.emarule, a.args)
    for c in (FLOOR, cmd):  # warm the file cache and the .pyc files; not counted
        once(c, env)
    floor, ours = [], []
    for _ in range(a.runs):
        floor.append(once(FLOOR, env))
        ours.append(once(cmd, env))
    f, o = statistics.median(floor), statistics.median(ours)
    print(f"import typer, rich, yaml: median {f * 1e3:.0f} ms (min {min(floor) * 1e3:.0f}) over {a.runs} runs")
    print(f"{' '.join(cmd)}: median {o * 1e3:.0f} ms (min {min(ours) * 1e3:.0f}) over {a.runs} runs")
    print(f"ratio (medians): {o / f:.2f}x ({'as-is environment' if a.as_is else 'with bytecode caches'})")


if __name__ == "__main__":
    main()
