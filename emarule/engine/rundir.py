"""A run directory: what a run writes, where, and how a resumed run keeps its log clean.

    <out>/hparams.json     the plan (base → scaled, per stage), resolved spec, seed, world size,
                           accumulation per stage, task info, torch version (written atomically)
    <out>/metrics.jsonl    one JSON object per logged step, and one per evaluation; every row has
                           samples_seen and epoch (the time axis), step and kappa
    <out>/checkpoint.pt    the last checkpoint (see emarule/engine/checkpoint.py)
    <out>/figures/         plots made later from metrics.jsonl
    <out>/wandb/           only with --wandb offline|online

Only rank 0 writes. Pure Python apart from the optional lazy wandb import.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import tempfile
import uuid
from pathlib import Path

from emarule.config.files import kind_of, regular_file
from emarule.errors import UserError

HPARAMS = "hparams.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
FIGURES = "figures"
# What a study (parabola, precision) leaves: its record, as checkpoint.pt, hparams.json and metrics.jsonl
# are a training run's. A new `emarule run` refuses a directory holding any of them.
STUDY_RECORD = ("results.json", "run.json")
# Present from a fresh run's first write until its first checkpoint: a run stopped in between (SIGKILL,
# a full disk) left nothing worth keeping, and a new run or `--resume` starts it again from scratch.
UNSAVED = ".no-checkpoint-yet"


def holds_a_run(out: Path) -> UserError:
    """A new run over one that can be continued: refused by the command line's checks and by the loop."""
    return UserError(f"{out} already holds a run ({CHECKPOINT}); pass --resume to continue it or "
                     f"--out NEW_DIR to start another")


def nothing_to_resume(out: Path) -> UserError:
    return UserError(f"--resume: no checkpoint in {out}; drop --resume to start the run from scratch")


_UMASK = os.umask(0)
os.umask(_UMASK)

# A full disk (ENOSPC), a file-size limit (EFBIG, RLIMIT_FSIZE) and a quota (EDQUOT): no write can succeed
# until the user frees space, so each is a one-line error, not a traceback.
NO_SPACE = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


class DiskFull(UserError):
    """A write that failed for lack of space; `path` and `size` (bytes) say what could not be written."""

    def __init__(self, path: Path, size: int | None, reason: str, kept: str | None = None):
        self.path, self.size, self.reason = Path(path), size, reason
        need = f"{size:,} bytes needed" if size is not None else "more space needed"
        kept = kept or f"{self.path.name} is as it was; free space (or raise the limit) and run the command again"
        super().__init__(f"cannot write {path}: {reason} ({need}); {kept}")

    def kept(self, kept: str) -> "DiskFull":
        """The same error, saying what the run keeps (its last good checkpoint, or nothing to lose)."""
        return DiskFull(self.path, self.size, self.reason, kept)


def no_space(e: OSError) -> bool:
    return isinstance(e, OSError) and e.errno in NO_SPACE


def _reason(e: OSError) -> str:
    return {errno.EFBIG: "file too large for the file-size limit", errno.ENOSPC: "no space left on the device",
            errno.EDQUOT: "disk quota exceeded"}.get(e.errno, e.strerror or str(e))


PNG_SOFTWARE = "emarule"  # the PNG's Software text: how a figure emarule wrote is told from a user's file


def png_bytes(fig, dpi: int, **savefig) -> bytes:
    """A matplotlib figure as PNG bytes, the figure closed even when saving fails (every figure writer's tail)."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=dpi, format="png", metadata={"Software": PNG_SOFTWARE}, **savefig)
    finally:
        plt.close(fig)
    return buf.getvalue()


def written_by_emarule(png: Path) -> bool:
    """Whether the PNG at `png` is a figure png_bytes made (its Software text chunk, which matplotlib writes
    before the image data, is emarule's)."""
    try:
        with open(png, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in head


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`.

    A reader (or a resumed run after SIGKILL) sees the old file or the new one, never half of one.
    Out of space, the temporary file is removed, `path` is as it was, and a `DiskFull` says so.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and no_space(e):
            raise DiskFull(path, len(data), _reason(e)) from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def jsonable(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, Path):
        return str(x)
    try:  # numpy and torch scalars
        return jsonable(x.item())
    except (AttributeError, ValueError, TypeError):
        return str(x)


def write_hparams(out: Path, hparams: dict) -> None:
    atomic_write_text(Path(out) / HPARAMS, json.dumps(jsonable(hparams), indent=2, ensure_ascii=False) + "\n")


def numbered_rows(path: Path, strict: bool):
    """(line number, row) for each row of a metrics.jsonl.

    A last line cut short (no newline after it: a kill or a full disk in the middle of a write) is
    dropped, or with `strict` an error. Any other line that is not a JSON object (bytes that are not
    UTF-8 included) is damage no write of ours leaves, so it is always an error naming the line:
    dropping it would silently lose a row.
    """
    p = Path(path)
    regular_file(p, "the log", "a run's metrics.jsonl is a file it wrote; move it away")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"cannot read {p} ({e.strerror or e}); the run directory is damaged") from None
    lines = data.split(b"\n")
    last = len(lines) if lines[-1] else len(lines) - 1  # the line after a final newline is not one
    for n, raw in enumerate(lines[:last], 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        try:
            row = json.loads(text) if text is not None else None
        except ValueError:
            row = None
        if isinstance(row, dict):
            yield n, row
            continue
        torn = n == last and bool(lines[-1])
        if torn and not strict:
            continue
        why = ("is cut short (the run was killed while writing it): `--resume` the run to drop it, or delete "
               "that line" if torn else
               f"is not {'UTF-8 text' if text is None else 'a JSON object'} (the file is damaged): delete that "
               "line, or start a new run with --out NEW_DIR")
        raise UserError(f"{p}, line {n} {why}")


def read_metrics(path: Path, strict: bool = False) -> list[dict]:
    """The rows of a metrics.jsonl ([] when there is none).

    Lenient (what a resumed run needs): a last line cut short by a kill is skipped. Strict (readers
    that report on a run): it is a UserError too. A damaged line anywhere else is a UserError that
    names the file and the line in both modes, so a damaged log is never shown as missing values.
    """
    return [row for _, row in numbered_rows(path, strict)]


def read_json(path: Path):
    """A JSON file's content, or None when it is missing, unreadable or not JSON (ValueError: not JSON,
    or not UTF-8): for readers that rebuild or skip what they cannot read."""
    if kind_of(Path(path)) is not None:  # a FIFO would block the read: not a file to rebuild from
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def recorded_experiment(out: Path) -> str | None:
    """The experiment a run directory's record names (hparams.json, a study's run.json or results.json);
    None where none is readable (damage there is reported by what reads the file for its content)."""
    for name in (HPARAMS, *STUDY_RECORD):
        data = read_json(Path(out) / name)
        if isinstance(data, dict) and isinstance(data.get("experiment"), str):
            return data["experiment"]
    return None


def check_study_dir(out: Path, experiment: str, resume: bool = False) -> None:
    """A study writes results.json, run.json, table.txt and figures/ over what its directory holds: that must
    be nothing of a training run's and no other experiment's results (its own it computes again)."""
    out = Path(out)
    training = [n for n in (CHECKPOINT, HPARAMS, METRICS) if (out / n).exists()]
    owner = recorded_experiment(out)
    if not training and owner in (None, experiment):
        return
    held = training or [n for n in STUDY_RECORD if (out / n).exists()]
    whose = f"a run of {owner}" if owner and owner != experiment else "a training run"
    raise UserError(f"{'--resume: ' if resume else ''}{out} holds {whose} ({', '.join(held)}), not {experiment}'s; "
                    f"the {experiment} study would write over it: pass --out NEW_DIR")


class MetricsLog:
    """Append-only metrics.jsonl, flushed per row, mirrored to wandb when asked."""

    def __init__(self, out: Path, enabled: bool = True):
        self.path = Path(out) / METRICS
        self.enabled = enabled
        self._file = None
        self._wandb = None
        self._written = hashlib.sha256()  # of the bytes the file holds: a checkpoint records it (`digest`)
        self._bytes = 0

    def digest(self) -> dict | None:
        """What the log holds so far, as a checkpoint records it: its length and SHA-256. A resumed run, and
        a reproduction reusing a finished one, check the file against it (`truncate_after`); None on a rank
        that does not write the log."""
        return {"bytes": self._bytes, "sha256": self._written.hexdigest()} if self.enabled else None

    def _holds(self, data: bytes) -> None:
        self._written, self._bytes = hashlib.sha256(data), len(data)

    def truncate_after(self, samples_seen: float, recorded: dict | None = None, finished: bool = False) -> None:
        """Drop rows past a checkpoint (and any torn last line) so a resumed log has no duplicates.

        A log that is missing, or holds no row up to the checkpoint, lost the run's record: a
        resumed run would leave a log without its first part, so it is refused. So is one whose rows up to
        the checkpoint are not the bytes the checkpoint `recorded` (`digest`: an edited value, a row deleted,
        added or reordered), and, past a finished run's last row, a whole row the run did not write. A
        checkpoint without that record (written before checkpoints held one) is checked row by row only."""
        if not self.enabled:
            return
        fix = "put back the file the run wrote, or start a new run with --out NEW_DIR"
        if not self.path.exists():
            raise UserError(f"--resume: {self.path} is missing (the run's log); {fix}")
        keep = []
        for n, r in numbered_rows(self.path, strict=False):
            t = r.get("samples_seen")
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                what = f"is {json.dumps(t)}, not a number" if "samples_seen" in r else "is missing"
                raise UserError(f"{self.path}, line {n}: samples_seen {what} (the file is damaged); {fix}")
            if t <= samples_seen:
                keep.append(r)
        if not keep:
            raise UserError(f"--resume: {self.path} holds no row up to the checkpoint (the run's log was emptied "
                            f"or cut); {fix}")
        data = self.path.read_bytes()
        text = ("".join(json.dumps(r) + "\n" for r in keep).encode() if recorded is None
                else self._recorded_part(data, recorded, finished, fix))
        # A finished run that is resumed (a reproduction reusing it) keeps every row: leave its file untouched,
        # so reuse writes nothing (a full disk, a read-only copy) and the log keeps its modification time.
        if data != text:
            atomic_write_bytes(self.path, text)
        self._holds(text)

    def _recorded_part(self, data: bytes, recorded: dict, finished: bool, fix: str) -> bytes:
        n = int(recorded["bytes"])
        if len(data) < n or hashlib.sha256(data[:n]).hexdigest() != recorded["sha256"]:
            raise UserError(f"--resume: {self.path} was edited after the run wrote it (its rows up to the "
                            f"checkpoint are not the ones the checkpoint recorded); {fix}")
        if finished and b"\n" in data[n:]:  # a finished run writes nothing after its last checkpoint
            extra = data[n:].count(b"\n")
            raise UserError(f"--resume: {self.path} holds {extra} row(s) after the finished run's last one, which the "
                            f"run did not write; {fix}")
        return data[:n]

    def start_fresh(self) -> None:
        if self.enabled:
            atomic_write_text(self.path, "")
            self._holds(b"")

    def attach_wandb(self, mode: str, out: Path, name: str, config: dict) -> None:
        if not self.enabled or mode not in ("offline", "online"):
            return
        import wandb  # lazily: only runs that mirror metrics pay for the import

        id_file = Path(out) / "wandb-id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        if run_id is None:
            run_id = uuid.uuid4().hex[:8]  # wandb's id alphabet; kept so --resume continues the run
            atomic_write_text(id_file, run_id + "\n")
        self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "emarule"), name=name, id=run_id,
                                 resume="allow", mode=mode, dir=str(out), config=jsonable(config))
        self._wandb.define_metric("samples_seen")
        self._wandb.define_metric("*", step_metric="samples_seen")

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        row = jsonable(row)
        line = json.dumps(row) + "\n"
        try:
            if self._file is None:
                self._file = open(self.path, "a", buffering=1)
            self._file.write(line)
            self._file.flush()
            self._written.update(line.encode())
            self._bytes += len(line.encode())
        except OSError as e:
            if not no_space(e):
                raise
            self._drop_file()  # a torn last line is what a resumed run drops anyway
            raise DiskFull(self.path, len(line.encode()), _reason(e), "the rows before it are kept; free space "
                           "(or raise the limit) and run the command again") from None
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def _drop_file(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:  # the buffer cannot be flushed either: what is on disk stays
                pass

    def close(self) -> None:
        if self._file is not None:
            self._drop_file()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
