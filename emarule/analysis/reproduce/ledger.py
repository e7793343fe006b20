"""The wall time a reproduction took, summed over the invocations that built it.

A reproduction resumes: finished runs are reused, so a family stopped half-way (or a `make repro`
spread over several sittings) is finished by a later invocation of the same command. That invocation's
own wall time covers only the runs it trained. Each invocation therefore appends one line to
OUT/invocations.jsonl, and the report gives the sum over the lines of the same command (the --out path
aside, so a root that was moved keeps its history). An invocation that raised before its verdict (Ctrl-C,
a failed run) writes a line with its wall time and `ended` (the exception's name) but no run counts: its
finished runs are counted as reused by the next invocation. One that was killed outright writes no line,
and its time is missing from the sum, which the report says by giving the count of runs trained against
the count run.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from emarule.engine.rundir import read_json

LEDGER = "invocations.jsonl"
KEPT = ("wall_s", "runs", "reused", "load_start", "load_end", "cpus", "ended")


def _key(command: str) -> str:
    """The command without its --out argument (its last two words, as `command.command_text` joins them)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    return shlex.join(words[:-2]) if len(words) > 2 and words[-2] == "--out" else command


def _entries(path: Path) -> list[dict]:
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
    """The families whose reproductions ROOT's ledger records (`emarule reproduce FAMILY ...`)."""
    out = set()
    for e in _entries(Path(root) / LEDGER):
        try:
            words = shlex.split(str(e.get("command", "")))
        except ValueError:
            continue
        if words[:2] == ["emarule", "reproduce"] and len(words) > 2:
            out.add(words[2])
    return out


def _earlier_verdict(root: Path, verdict_name: str) -> list[dict]:
    """An invocation recorded only in an earlier verdict.json (written before the ledger existed)."""
    old = read_json(root / verdict_name)
    t = old.get("timing") if isinstance(old, dict) else None
    if not isinstance(t, dict) or not isinstance(t.get("wall_s"), (int, float)) or not old.get("command"):
        return []
    return [{"command": old["command"], **{k: t[k] for k in KEPT if k in t}}]


def record(root: Path, command: str, timing: dict, verdict_name: str) -> dict:
    """Appends this invocation to ROOT's ledger (rewritten under a temporary name, then renamed) and
    returns the totals over the invocations of the same command: `invocations`, `wall_s_total` and
    `trained` (runs trained, not reused, summed)."""
    from emarule.engine.rundir import atomic_write_text

    path = Path(root) / LEDGER
    entries = _entries(path) or _earlier_verdict(Path(root), verdict_name)
    entries.append({"command": command, **{k: timing[k] for k in KEPT if k in timing}})
    atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries))
    same = [e for e in entries if _key(str(e.get("command", ""))) == _key(command)]
    return {"invocations": len(same), "wall_s_total": sum(float(e["wall_s"]) for e in same),
            "trained": sum(int(e.get("runs", 0)) - int(e.get("reused", 0)) for e in same)}
