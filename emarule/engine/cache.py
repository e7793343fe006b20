"""A folder built once in a shared cache: built whole in a temporary folder beside it, then renamed into place.

The generated data sets (the shapes, the speech corpus) are cached this way, so that a reader sees a complete
folder or none, and two processes building the same folder at once both end with the one that finished first.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from emarule.errors import UserError


# A build that ran out of room: the cache is writable, so the fix is room, not another folder alone.
NO_ROOM = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "file too large for the file-size limit",
           errno.EDQUOT: "disk quota exceeded"}


def build_once(root: Path, build: Callable[[Path], object], complete: Callable[[Path], bool],
               unwritable: str, no_room: str | None = None) -> Path:
    """`root`, built by `build(tmp)` unless `complete(root)` already holds.

    A folder at `root` that is not complete (damaged, or stale) is moved aside and removed before the new one
    takes its place. A complete one that another builder put there while this one was building is kept, and
    this build is discarded: processes may already be reading it. `unwritable` is the one-line error when
    the cache cannot be written, formatted with {cache} and the system's {reason}, and ends with the fix;
    `no_room` (default `unwritable`) the one when a write of the build fails for room (disk full, file-size
    limit, quota). Any OSError of `build` is one of the two, the temporary folder removed.
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
        try:
            build(tmp)
        except OSError as e:
            room = NO_ROOM.get(e.errno)
            reason = room or e.strerror or " ".join(str(e).split())
            raise UserError(((no_room or unwritable) if room else unwritable).format(cache=cache, reason=reason)) \
                from None
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


def sha256(path: Path) -> str:
    """A file's SHA-256, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_holds(root: Path, request: dict, version) -> bool:
    """Whether ROOT/manifest.json records this request and version, and every file it lists is there, byte
    for byte (its SHA-256): a damaged, truncated or stale folder is not complete, and is built again."""
    try:
        manifest = json.loads((Path(root) / "manifest.json").read_text())
        return (manifest.get("request") == request and manifest.get("version") == version
                and all(sha256(Path(root) / name) == digest for name, digest in manifest["files"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
