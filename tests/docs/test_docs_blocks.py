"""Every ```console block of the README, docs/*.md and emarule/experiments/*.md is what its commands print.

A block is a list of `$ command` lines, each followed by the output it shows. The test runs each command
line with bash (`emarule` is `python -m emarule`) in a scratch directory that sees the repository's `tests/`,
and compares stdout and stderr with the block. A comment `<!-- setup: COMMAND -->` on
the line before a block is run first, in the same directory, for what the block assumes (a file, a run).
Only what must vary is normalised: trailing spaces, the scratch directory's path, durations (`1.6 s`) and
a checkpoint's size in a disk-full line (`699,909 bytes needed`).
A line `...` in a block stands for any number of printed lines, so a page may show the head and tail of a
long table; every line it does show must match, in order.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "emarule" / "experiments").glob("*.md"))]
BLOCK = re.compile(r"^(?:<!-- setup: (.*?) -->\n)?```console\n(.*?)^```", re.S | re.M)
DURATION = re.compile(r"\b\d+(?:\.\d+)? s\b")
BYTES_NEEDED = re.compile(r"\b\d[\d,]* bytes needed\b")
TIME_SHARE = re.compile(r"(?<=s of the loop's N s )\(\d+ %\)")  # the share of a run's time spent waiting for data


def console_blocks(page: Path) -> list[tuple[str, str, list[tuple[str, list[str]]]]]:
    """(where, setup, [(command, shown output lines)]) for each ```console block of a page."""
    text = page.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text[: match.start()].count("\n") + 1
        steps: list[tuple[str, list[str]]] = []
        for raw in match.group(2).splitlines():
            if raw.startswith("$ "):
                steps.append((raw[2:], []))
            elif steps:
                steps[-1][1].append(raw)
            else:
                raise AssertionError(f"{page.name}:{line}: a console block must start with a `$ ` command line")
        blocks.append((f"{page.relative_to(ROOT)}:{line}", match.group(1) or "", steps))
    return blocks


ALL = [block for page in PAGES for block in console_blocks(page)]


def normalise(lines: list[str], scratch: Path) -> list[str]:
    out = [TIME_SHARE.sub("(N %)", BYTES_NEEDED.sub("N bytes needed",
                                                    DURATION.sub("N s", x.replace(str(scratch), "<scratch>")))).rstrip()
           for x in lines]
    while out and not out[-1]:
        out.pop()
    while out and not out[0]:
        out.pop(0)
    return out


def matches(shown: list[str], printed: list[str]) -> bool:
    """`shown` against `printed`, line by line, where a shown line `...` takes any run of printed lines."""
    if not shown:
        return not printed
    if shown[0] == "...":
        return any(matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return bool(printed) and shown[0] == printed[0] and matches(shown[1:], printed[1:])


def run(command: str, scratch: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", NO_COLOR="1", EMARULE_PYTHON=sys.executable)
    script = 'emarule() { "$EMARULE_PYTHON" -m emarule "$@"; }\n' + command
    done = subprocess.run(["bash", "-c", script], cwd=scratch, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return done.stdout.splitlines()


def test_the_pages_hold_checked_blocks():
    """The test below must have something to check: the README's own examples at least."""
    assert sum(1 for where, _, _ in ALL if where.startswith("README.md")) >= 2
    assert all(steps for _, _, steps in ALL)


@pytest.mark.parametrize("where,setup,steps", ALL, ids=[where for where, _, _ in ALL])
def test_a_console_block_is_what_its_commands_print(where, setup, steps, tmp_path):
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    if setup:
        run(setup, tmp_path)
    for command, shown in steps:
        printed = normalise(run(command, tmp_path), tmp_path)
        expected = normalise(shown, tmp_path)
        assert matches(expected, printed), (
            f"{where}: `{command}` printed\n" + "\n".join(printed) + "\n\nbut the page shows\n" + "\n".join(expected))


@pytest.mark.parametrize("shown,printed,ok", [
    (["a", "b"], ["a", "b"], True),
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "d"], ["a", "b", "c", "e"], False),
    (["a", "b"], ["a", "c"], False),
    (["a"], ["a", "b"], False),
    (["...", "b"], ["b"], True),
])
def test_an_ellipsis_stands_for_lines_and_nothing_else(shown, printed, ok):
    assert matches(shown, printed) is ok
