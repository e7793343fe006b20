"""One process at a time in a directory: an exclusive lock for a run, a sweep and a reproduction.

    <dir>/.emarule.lock    {"host", "pid", "started", "command"} of the holder, while it holds it

The lock is `fcntl.flock` on that file: the kernel drops it when the holder exits, however it exits
(SIGKILL included), so a lock file left behind by a dead process is taken over at once, and that is
said. Where the file system has no flock (some network mounts) the file's host and pid decide: a
live pid on this host holds it, anything else is stale. Pure Python.

Under torchrun only rank 0 locks: the other ranks are the same run.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from emarule.errors import UserError

LOCK = ".emarule.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the pid check alone
    fcntl = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _holder(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _unusable(path: Path, e: OSError | None = None) -> UserError:
    """The one-line error for a lock path that cannot be opened as a file (a directory made there by hand)."""
    if e is None or e.errno == errno.EISDIR:
        return UserError(f"{path} is a directory, not emarule's lock file; remove it and run the command again")
    fix = "remove it, or pass another --out" if os.path.lexists(path) else "pass another --out"
    return UserError(f"cannot open the lock file {path} ({e.strerror or e}); {fix}")


# Lock files this process holds (real path → pid): a lock taken again in the same process, as the
# runner's around the loop's, is the same hold. A flock taken twice by one process through two
# descriptors would refuse itself.
_HELD: dict[str, int] = {}


def _describe(h: dict) -> str:
    started = h.get("started")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) \
        else ""
    return f"host {h.get('host', '?')}, pid {h.get('pid', '?')}{when}"


class DirLock:
    """`with DirLock(path, "run"):` — a UserError (one line) when another live process holds `path`.

    The directory is created if needed; on release the lock file is removed, and so are the
    directories this lock created if nothing else was written in them.
    """

    def __init__(self, directory: Path, what: str = "run", enabled: bool = True, echo=None):
        self.dir = Path(directory)
        self.path = self.dir / LOCK
        self.what = what
        self.enabled = enabled
        self.echo = echo or (lambda msg: print(msg, file=sys.stderr))
        self._fd: int | None = None
        self._created: list[Path] = []
        self._nested = False

    def __enter__(self) -> "DirLock":
        if self.enabled:
            self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def _mkdirs(self) -> None:
        missing = []
        p = Path(os.path.abspath(self.dir))
        while not p.exists():
            missing.append(p)
            p = p.parent
        self.dir.mkdir(parents=True, exist_ok=True)
        self._created = missing  # deepest first

    def acquire(self) -> None:
        self._mkdirs()
        if _HELD.get(os.path.realpath(self.path)) == os.getpid():
            self._nested = True
            return
        for _ in range(20):  # the holder may remove the file between our open and our lock: open it again
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                self.release()
                raise _unusable(self.path, e) from None
            try:
                previous = _holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
                if not self._lock(fd, previous):
                    continue
                self._fd = fd
                fd = None
                _HELD[os.path.realpath(self.path)] = os.getpid()
                self._announce(previous)
                self._write_holder()
                return
            finally:
                if fd is not None:
                    os.close(fd)
        raise UserError(f"cannot lock {self.path}: it keeps being replaced; check what else writes to {self.dir}")

    def _lock(self, fd: int, previous: dict) -> bool:
        """True when `fd` is locked by us and is still the file at `self.path`."""
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._busy(previous)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                    raise
                self._check_pid(previous)  # no flock here: the recorded holder decides
        else:  # pragma: no cover
            self._check_pid(previous)
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _check_pid(self, h: dict) -> None:
        pid = h.get("pid")
        if h.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid() and _alive(pid):
            self._busy(h)

    def _busy(self, h: dict) -> None:
        who = _describe(h) if h else "a process that has not written its name yet"
        self.release()
        raise UserError(f"{self.dir} is in use by another emarule {h.get('what') or 'process'} ({who}); "
                        f"wait for it to finish, stop it, or pass another --out")

    def _announce(self, previous: dict) -> None:
        if previous.get("pid") is None:
            return
        here = previous.get("host") == socket.gethostname()
        why = "no longer running" if here else "on another host; its lock was released"
        self.echo(f"note: {self.dir} was locked by {_describe(previous)}, {why}; taking it over")

    def _write_holder(self) -> None:
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": round(time.time(), 3),
                "what": self.what, "command": " ".join(sys.argv)}
        data = (json.dumps(info) + "\n").encode()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError:
            pass  # a full disk: the flock still holds; only the holder's name is missing

    def release(self) -> None:
        if self._nested:  # the outer hold releases
            self._nested = False
            return
        if self._fd is not None:
            _HELD.pop(os.path.realpath(self.path), None)
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    os.unlink(self.path)
            except OSError:
                pass
            os.close(self._fd)  # unlinked first, so a waiting process cannot lock a file no longer there
            self._fd = None
        for d in self._created:  # what the lock created, if nothing else was put in it
            try:
                d.rmdir()
            except OSError:
                break
        self._created = []


def _main_rank() -> bool:
    from emarule.engine import distributed  # the launcher's environment, read without torch

    return distributed.is_main()


def lock_dir(directory: Path, what: str, enabled: bool | None = None, echo=None) -> DirLock:
    """The lock for rank 0 of a launch (other ranks get a no-op)."""
    if enabled is None:
        enabled = _main_rank()
    return DirLock(directory, what, enabled=enabled, echo=echo)


def check_free(directory: Path, what: str = "run") -> None:
    """The one-line error `DirLock` would give, found without creating or changing anything (a check
    made before the real lock is taken, so that a busy directory is named before other complaints).
    Rank 0 alone holds and checks the lock: another rank of the same launch would find rank 0's."""
    if not _main_rank():
        return
    path = Path(directory) / LOCK
    if path.is_dir():  # opened read-only, a directory would only fail at the read
        raise _unusable(path)
    if _HELD.get(os.path.realpath(path)) == os.getpid():
        return  # this process holds it
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        h = _holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        probe = DirLock(directory, what)
        if fcntl is None:  # pragma: no cover
            probe._check_pid(h)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{directory} is in use by another emarule {h.get('what') or what} ({_describe(h)}); "
                            f"wait for it to finish, stop it, or pass another --out") from None
        except OSError:
            probe._check_pid(h)
    finally:
        os.close(fd)
