"""A folder built once in a shared cache: built whole in a temporary folder beside it, then renamed into place.

The generated data sets (the shapes, the speech corpus) are cached this way, so that a reader sees a complete
folder or none, and two processes building the same folder at once both end with the one that finished first.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from emarule.errors import UserError


def build_once(root: Path, build: Callable[[Path], object], complete: Callable[[Path], bool],
               unwritable: str) -> Path:
    """`root`, built by `build(tmp)` unless `complete(root)` already holds.

    A folder at `root` that is not complete (damaged, or stale) is moved aside and removed before the new one
    takes its place. A complete one that another builder put there while this one was building is kept, and
    this build is discarded: processes may already be reading it. `unwritable` starts the one-line error when
    the cache cannot be written; it is followed by the system's reason and must end with the fix.
    """
    if complete(root):
        return root
    cache = root.parent
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    except OSError as e:
        raise UserError(unwritable.format(cache=cache, reason=e.strerror)) from None
    try:
        build(tmp)
        if complete(root):  # another builder finished first
            return root
        if root.exists():
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=cache))
            try:
                root.rename(stale / "old")
            except OSError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(root)
        except OSError:
            if not complete(root):  # not another builder's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
