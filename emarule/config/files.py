"""Reading a user's file only when it is a regular file: a FIFO would block the read forever, and a device or
socket is never a spec. Pure Python; the messages are the one-line UserErrors the command line prints."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from emarule.errors import UserError

KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(path: Path) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a folder (links followed), else None: a
    folder is the caller's to refuse, with a message that says which file in it to pass."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def regular_file(path: Path | str, what: str, fix: str) -> Path:
    """`path`, refused in one line naming `what` it was given as when it exists but is not a regular file."""
    p = Path(path)
    kind = kind_of(p)
    if kind is not None:
        raise UserError(f"{what} {p} is {kind}, not a regular file; {fix}")
    return p
