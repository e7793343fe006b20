"""The wall time a reproduction took, summed over the invocations that built it.

A reproduction resumes: finished runs are reused, so a family stopped half-way (or a `make repro`
spread over several sittings) is finished by a later invocation of the same command. That invocation's
own wall time covers only the runs it trained. Each invocation therefore appends one line to
OUT/invocations.jsonl, and the report gives the sum over the lines of the same command. "The same
command" is the same resolved arguments (`resolved`: the family, the preset, the seeds and κ as sets,
--headline and --data; the --out path aside, so a root that was moved keeps its history): `--kappas 2,1`
is `--kappas 1,2`, and `--preset cpu` is polyak's default. Each line keeps them as `args`.

An invocation that raised before its verdict (Ctrl-C, a failed run) writes a line with its wall time,
`ended` (the exception's name) and the runs it trained, found by their logs' changes (`runs`, with
`reused` 0): the next invocation counts the ones it finds finished as reused, and the sum over the lines
still counts them as trained here. (An interrupted line without run counts leaves its runs counted as
reused.) One that is killed outright (SIGKILL, a lost machine) cannot write a line as it dies, so a
running invocation keeps one written for it (`Heartbeat`): every `HEARTBEAT_S` seconds it rewrites a
line with `ended` "killed", its wall time so far and the runs it has trained so far, which its own last
line replaces when it ends. A kill leaves that line, short of the true time by less than `HEARTBEAT_S`.

An invocation that trained nothing and ended (every run reused: a finished root judged again) replaces the
line of the command's previous one of that kind, so judging a root again and again adds one invocation to
its history, not one each time.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from emarule.engine.rundir import atomic_write_text
from emarule.errors import UserError


LEDGER = "invocations.jsonl"
KEPT = ("wall_s", "runs", "reused", "load_start", "load_end", "cpus", "ended")
HEARTBEAT_S = 30.0  # how stale a killed invocation's line may be; a rewrite costs a few ms
KILLED = "killed"  # `ended` of the line a running invocation keeps, as a kill would leave it


def resolved(name: str, *, preset: str | None = None, seeds=None, kappas=None, headline: bool = False,
             data=None) -> dict | None:
    """The arguments an `emarule reproduce NAME ...` ran with, defaults filled in: what makes two invocations
    the same command. None for a family this version does not know."""
    from emarule.analysis.reproduce.claims import FAMILIES, FULL, headline_only

    family = FAMILIES.get(name)
    if family is None:
        return None
    if headline:
        family = headline_only(family)
    chosen = family.preset if preset is None else preset
    sweep = family.kind == "sweep"
    return {"family": name, "preset": FULL if chosen is None else chosen,  # no preset is the base spec: full
            "seeds": sorted(int(s) for s in (family.seeds if seeds is None else seeds)) if sweep else None,
            "kappas": sorted(float(k) for k in (family.kappas if kappas is None else kappas)),
            "headline": bool(headline), "data": None if data is None else str(data)}


def of_verdict(name: str, verdict: dict, headline: bool) -> dict | None:
    """`resolved` for the arguments a verdict.json records (its preset, seeds and κ; `headline` from where it is);
    None where they are not numbers (a damaged file)."""
    try:
        return resolved(name, preset=verdict.get("preset"), seeds=verdict.get("seeds") or None,
                        kappas=verdict.get("kappas") or None, headline=headline)
    except (TypeError, ValueError):
        return None


def key(entry: dict) -> str:
    """What identifies an entry's command: its `args`, else its command text."""
    args = entry.get("args")
    return json.dumps(args, sort_keys=True) if isinstance(args, dict) else "text:" + str(entry.get("command", ""))


def entries(path: Path) -> list[dict]:
    """The readable lines of a ledger, in order."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            e = json.loads(line.decode())
        except ValueError:  # a line cut short by a full disk, or damaged: the invocation is not counted
            continue
        if isinstance(e, dict) and isinstance(e.get("wall_s"), (int, float)):
            out.append(e)
    return out


def families(root: Path) -> set[str]:
    """The families whose reproductions ROOT's ledger records."""
    return {e["args"]["family"] for e in entries(Path(root) / LEDGER)
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("family"), str)}


def record(root: Path, command: str, timing: dict, args: dict | None = None, replaces: str | None = None,
           token: str | None = None) -> dict:
    """Appends this invocation to ROOT's ledger (rewritten under a temporary name, then renamed) and
    returns the totals over the invocations of the same command (`key`): `invocations`, `wall_s_total`
    and `trained` (runs trained, not reused, summed). `args`: the invocation's `resolved` arguments.
    `replaces`: the token of this invocation's `Heartbeat` line, dropped first; `token`: the new line's."""
    path = Path(root) / LEDGER
    old = _without(entries(path), replaces)
    line = {"command": command, **({"args": args} if args is not None else {}),
            **{k: timing[k] for k in KEPT if k in timing}, **({"token": token} if token is not None else {})}
    mine = key(line)
    if _judged_only(line):
        old = [e for e in old if not (_judged_only(e) and key(e) == mine)]
    _write(path, [*old, line])
    same = [e for e in [*old, line] if key(e) == mine]
    return {"invocations": len(same), "wall_s_total": sum(float(e["wall_s"]) for e in same),
            "trained": sum(int(e.get("runs", 0)) - int(e.get("reused", 0)) for e in same)}


def _judged_only(e: dict) -> bool:
    """A line of an invocation that ended having trained nothing: every run it read was there before."""
    return "ended" not in e and "token" not in e and int(e.get("runs", 0)) == int(e.get("reused", -1))


def drop(root: Path, token: str) -> None:
    """Removes the line with TOKEN (a `Heartbeat`'s) from ROOT's ledger, if it is there."""
    path = Path(root) / LEDGER
    old = entries(path)
    kept = _without(old, token)
    if len(kept) == len(old):
        return
    if kept:
        _write(path, kept)
    else:  # the ledger was this line alone: as if the invocation had written nothing
        path.unlink()


def _without(lines: list[dict], token: str | None) -> list[dict]:
    """LINES but the one a `Heartbeat` with TOKEN wrote (all of them for None)."""
    return lines if token is None else [e for e in lines if e.get("token") != token]


def _write(path: Path, lines: list[dict]) -> None:
    """The ledger as LINES, one JSON object each, written under a temporary name, then renamed."""
    atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines))


class Heartbeat:
    """The ledger line a kill would leave, kept by a running invocation (see the module's docstring).

    `trained()` counts the runs trained so far. The line is written every `interval` seconds, and whenever
    `poke()` says a run ended, so that a kill loses none of the runs that finished (not at the start: bad
    input, refused before any run trains, writes nothing). `stop()` ends the rewrites; the invocation's
    own last line then replaces this one (`record(..., replaces=beat.token)`, or `fail`). A rewrite that
    fails (a full disk) is skipped: the next one tries again."""

    def __init__(self, root: Path, command: str, args: dict | None, start: float, trained: Callable[[], int],
                 interval: float | None = None):
        self.root, self.command, self.args, self.start, self.trained = Path(root), command, args, start, trained
        self.interval = HEARTBEAT_S if interval is None else interval
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread's rewrites and poke()'s read and replace one line
        self._thread = threading.Thread(target=self._beat, name="emarule-ledger-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> None:
        """Rewrites the line now."""
        with self._lock:
            if self._stop.is_set():  # the invocation's own line has replaced it, or is about to
                return
            self._write(KILLED, time.monotonic() - self.start, self.trained(), token=self.token)

    def fail(self, error: BaseException) -> None:
        """The invocation raised before its verdict: its line as the module's docstring says. Bad input, refused
        before anything trains, leaves none; a run's own error (a file it cannot decode) comes after others trained."""
        trained = int(self.trained())
        try:
            if isinstance(error, UserError) and not trained:
                drop(self.root, self.token)
            else:
                self._write(type(error).__name__, time.monotonic() - self.start, trained)
        except OSError:  # a full disk, say: the error being raised is the one to report
            pass

    def _write(self, ended: str, wall_s: float, trained: int, token: str | None = None) -> None:
        timing = {"wall_s": wall_s, "runs": int(trained), "reused": 0, "cpus": os.cpu_count(), "ended": ended}
        record(self.root, self.command, timing, self.args, replaces=self.token, token=token)

    def poke(self) -> None:
        """A run ended: the line now, unless the disk refuses it."""
        try:
            self.beat()
        except OSError:
            pass

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.poke()
