"""The terminal console every command and study prints to, and its text saved beside a run. Torch-free."""

from __future__ import annotations

import io
import sys
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from pathlib import Path


def wide_console(stderr: bool = False, quiet: bool = False) -> Console:
    """A terminal console; 200 columns when piped (rich would assume 80 and fold the tables)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, quiet=quiet, width=None if stream.isatty() else 200)


def print_and_save(console: Console, tables: list, path: Path) -> None:
    """Print `tables` and write the same text, uncoloured, to `path` (atomically)."""
    from emarule.engine.rundir import atomic_write_text

    record = Console(record=True, width=200, file=io.StringIO())
    for t in tables:
        console.print(t)
        record.print(t)
    atomic_write_text(path, record.export_text())


def exact(v: float) -> str:
    """A value with every digit it needs to be told apart from its neighbours (ρ = 0.99999999999 is not
    printed as 1): the shortest text that reads back as the same float."""
    return repr(float(v))
