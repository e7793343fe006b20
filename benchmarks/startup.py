"""Start-up time of `emarule table momenta` against `python -c "import typer, rich, yaml"`.

The floor is what any typer + rich + YAML command line pays before it does anything; the ratio says
what emarule adds on top. The two commands take turns (A, B, A, B, ...), each a fresh process, so that
load from other processes hits both alike; the median of each is reported, and their ratio, for wall time and
for CPU time (user + system, steadier on a shared machine).

Both run with compiled bytecode, as after `pip install` (which compiles every module): the caches go to a
temporary PYTHONPYCACHEPREFIX, written by an uncounted first run, so the checkout gets no __pycache__.
`--as-is` keeps the caller's environment instead (with PYTHONDONTWRITEBYTECODE=1, emarule's modules
are compiled from source on every start, and typer's, rich's and yaml's are not: the ratio is higher).

`--parts` times, in the same rotation, the floor plus the modules any typer 0.29 table command imports.

    .venv/bin/python benchmarks/startup.py --runs 31 --parts
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = [sys.executable, "-c", "import typer, rich, yaml"]
# --parts: what any typer 0.29 command pays on top of the floor before emarule does anything. typer coerces
# every non-flag option's value through pydantic (typer._adapters, imported on first use), and a rich table
# needs rich.console and rich.table.
PARTS = {"floor + typer's pydantic coercion": "import typer, rich, yaml, typer._adapters",
         "floor + typer's pydantic + rich.console, rich.table":
             "import typer, rich, yaml, typer._adapters, rich.console, rich.table"}


def emarule_command(script: Path | None, args: list[str]) -> list[str]:
    """The console script (what a user types; by default the one beside this interpreter), else `python -m emarule`."""
    script = script or Path(sys.executable).parent / "emarule"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "emarule", *args]


def once(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run. CPU time moves less than wall time when other
    processes share the cores; where os.wait4 is missing (Windows) it is reported as NaN."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    if hasattr(os, "wait4"):
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
    else:  # pragma: no cover
        p.wait()
        cpu = math.nan
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {p.returncode}; run it alone to see why")
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 runs of each: a smoke test, not a measurement")
    ap.add_argument("--runs", type=int, default=31, help="runs of each command (at least 21 for a stable median)")
    ap.add_argument("--parts", action="store_true", help="also time the floor plus typer's pydantic and rich's table")
    ap.add_argument("--as-is", action="store_true", help="the caller's environment, bytecode settings included")
    ap.add_argument("--emarule", type=Path, metavar="PATH",
                    help="the emarule script to time, e.g. another checkout's .venv/bin/emarule")
    ap.add_argument("args", nargs="*", default=["table", "momenta"], help="emarule's arguments")
    a = ap.parse_args(argv)
    if a.quick:
        a.runs = 5
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
    cmds = {"import typer, rich, yaml": FLOOR}
    if a.parts and importlib.util.find_spec("typer._adapters") is None:
        print("--parts: this typer has no pydantic coercion (no typer._adapters, as before 0.29); only the two "
              "commands are timed")
    elif a.parts:
        cmds.update({name: [sys.executable, "-c", code] for name, code in PARTS.items()})
    cmds[" ".join(cmd)] = cmd
    for c in cmds.values():  # warm the file cache and the .pyc files; not counted
        once(c, env)
    times = {name: [] for name in cmds}
    for _ in range(a.runs):
        for name, c in cmds.items():
            times[name].append(once(c, env))
    def med(name: str, i: int) -> float:
        return statistics.median(t[i] for t in times[name])

    floor = "import typer, rich, yaml"
    for name in times:
        w, c = med(name, 0), med(name, 1)
        print(f"{name}: wall median {w * 1e3:.0f} ms ({w / med(floor, 0):.2f}x the floor), "
              f"CPU median {c * 1e3:.0f} ms ({c / med(floor, 1):.2f}x)")
    ours = " ".join(cmd)
    print(f"ratio of medians over {a.runs} runs each: wall {med(ours, 0) / med(floor, 0):.2f}x, "
          f"CPU {med(ours, 1) / med(floor, 1):.2f}x ({'as-is environment' if a.as_is else 'with bytecode caches'})")
    least = {name: (min(t[0] for t in ts), min(t[1] for t in ts)) for name, ts in times.items()}
    for i, what in ((0, "wall"), (1, "CPU")):
        print(f"ratio emarule / floor ({what}): median {med(ours, i) / med(floor, i):.2f}x  "
              f"min {least[ours][i] / least[floor][i]:.2f}x")


if __name__ == "__main__":
    main()
