"""Faults a cluster does to a run (docs/faults.md): a full disk or a file-size limit, records edited
after the run wrote them, a run killed before its first checkpoint. Each ends in one line naming
the problem and the fix, loses nothing, and leaves a directory the next command accepts."""

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from emarule.engine import checkpoint, loop as train
from emarule.request import checks
from emarule.errors import UserError
from emarule.engine.rundir import HPARAMS, METRICS, UNSAVED, DiskFull, MetricsLog
from tests.engine_util import ROOT, env, load_checkpoint, run_toy, tensors_equal, toy_spec, write_spec

SPEC = {"schedule.epochs": 3, "toy.samples": 64}
# One child process, two commands: the soft RLIMIT_FSIZE set before each (files may not grow past
# it: writes fail with EFBIG), each command's exit code printed after its stderr.
LIMITED = ("import resource, sys\n"
           "from emarule.cli.main import main\n"
           "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
           "for limit, out in zip(sys.argv[1::3], sys.argv[2::3]):\n"
           "    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), hard))\n"
           "    try:\n"
           "        main(['run', '--spec', sys.argv[3], '--out', out])\n"
           "    except SystemExit as e:\n"
           "        print(f'exit {e.code}', file=sys.stderr, flush=True)\n")


def _tmp_files(d: Path) -> list:
    return sorted(p.name for p in d.rglob("*.tmp"))


# --- disk full / file-size limit --------------------------------------------------------------


@pytest.mark.slow
def test_a_file_size_limit_is_one_line_and_the_same_command_then_works(tmp_path):
    spec = write_spec(tmp_path, toy_spec(**SPEC), "run.yaml")
    cases = {"ckpt": (8000, "checkpoint.pt"), "run": (1000, "hparams.json")}  # "run": run_toy's own --out
    argv = [a for name, (limit, _) in cases.items() for a in (str(limit), str(tmp_path / name), str(spec))]
    child = subprocess.run([sys.executable, "-c", LIMITED, *argv], cwd=ROOT, env=env(), capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 0 and "Traceback" not in child.stderr, child.stderr
    lines = [x for x in child.stderr.splitlines() if x.startswith(("error:", "exit"))]
    assert len(lines) == 4 and lines[1] == lines[3] == "exit 2", child.stderr
    for line, (name, (_, what)) in zip(lines[::2], cases.items(), strict=True):
        out = tmp_path / name
        assert line.startswith(f"error: cannot write {out / what}: file too large for the file-size limit (")
        assert "bytes needed); no checkpoint was written yet, so nothing is lost" in line
        assert not (out / "checkpoint.pt").exists() and _tmp_files(out) == [] and (out / UNSAVED).exists()
        checks.run_dir(out, resume=False)  # what `emarule run` checks first: the directory is accepted
    run_toy(tmp_path, toy_spec(**SPEC), out="run")  # the same command again, in this process
    assert (tmp_path / "run" / "checkpoint.pt").exists() and not (tmp_path / "run" / UNSAVED).exists()


def _fail_after(monkeypatch, target, attr: str, calls: int, err=errno.ENOSPC):
    """Make `target.attr` raise a real OSError(err) from its `calls`-th call on (0: every call)."""
    real = getattr(target, attr)
    seen = {"n": 0}

    def failing(*a, **kw):
        seen["n"] += 1
        if seen["n"] > calls:
            raise OSError(err, os.strerror(err))
        return real(*a, **kw)

    monkeypatch.setattr(target, attr, failing)


def test_disk_full_in_the_log_keeps_the_last_checkpoint_and_resume_is_exact(tmp_path, monkeypatch):
    reference = load_checkpoint(run_toy(tmp_path, toy_spec(**SPEC), out="ref")[1].out)
    real_open = open
    state = {"rows": 0}

    def open_full(path, mode="r", *a, **kw):  # the log's file fills the disk after 12 rows
        f = real_open(path, mode, *a, **kw)
        if str(path).endswith(METRICS) and "a" in mode:
            write = f.write

            def full(text):
                state["rows"] += 1
                if state["rows"] > 12:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return write(text)
            f.write = full
        return f

    monkeypatch.setattr("builtins.open", open_full)
    with pytest.raises(DiskFull) as e:
        run_toy(tmp_path, toy_spec(**SPEC), out="run")
    monkeypatch.undo()
    msg = str(e.value)
    assert msg.startswith(f"cannot write {tmp_path / 'run' / METRICS}: no space left on the device (")
    assert "the last good checkpoint is kept (128 samples seen, epoch 2, step 8): free space" in msg
    assert "continue with --resume" in msg
    _, ctx = run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert tensors_equal(load_checkpoint(ctx.out)["model"], reference["model"])
    steps = [json.loads(x)["step"] for x in (ctx.out / METRICS).read_text().splitlines() if '"train"' in x]
    assert steps == sorted(set(steps))


def _fsync_fails(monkeypatch, name_part: str, after: int = 0) -> None:
    """ENOSPC at the fsync of the real atomic write of a file whose name holds `name_part`, from the
    (after + 1)-th such write on: the error a full disk gives, through emarule's own handling."""
    from emarule.engine import rundir

    real_fsync, seen = os.fsync, {"n": 0}

    def fsync(fd):
        if name_part in os.readlink(f"/proc/self/fd/{fd}"):
            seen["n"] += 1
            if seen["n"] > after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(rundir.os, "fsync", fsync)


def test_disk_full_in_a_checkpoint_leaves_the_previous_one(tmp_path, monkeypatch):
    _fsync_fails(monkeypatch, ".checkpoint.pt.", after=1)
    sizes, real = [], checkpoint.atomic_write_bytes
    monkeypatch.setattr(checkpoint, "atomic_write_bytes", lambda p, data: sizes.append(len(data)) or real(p, data))
    with pytest.raises(DiskFull) as e:
        run_toy(tmp_path, toy_spec(**SPEC), out="run")
    out = tmp_path / "run"
    assert len(sizes) == 2  # the second checkpoint could not be written: its size is the space needed
    assert f"cannot write {out / 'checkpoint.pt'}: no space left on the device ({sizes[1]:,} bytes needed)" \
        in str(e.value)
    assert "the last good checkpoint is kept (64 samples seen, epoch 1, step 4)" in str(e.value)
    assert load_checkpoint(out)["clock"]["step"] == 4 and _tmp_files(out) == []


def test_a_figure_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    """The figures `run` draws after training: the CLI's one line, and no temporary file left."""
    from emarule.cli.main import main

    _fsync_fails(monkeypatch, ".png.")
    spec = write_spec(tmp_path, toy_spec(**SPEC))
    with pytest.raises(SystemExit) as e:
        main(["run", "--spec", str(spec), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: cannot write {tmp_path / 'run' / 'figures'}/") and ".png: no space left" in err[0]
    assert _tmp_files(tmp_path / "run") == []


def test_an_unforeseen_write_out_of_space_is_still_one_line(tmp_path, monkeypatch, capsys):
    from emarule.cli import main as cli

    def boom(*a, **kw):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(cli, "resolve", boom)
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "byol-r18", "--kappa", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "quota exceeded" in err[0].lower(), err


def test_a_full_log_write_keeps_the_rows_before(tmp_path, monkeypatch):
    log = MetricsLog(tmp_path)
    log.log({"kind": "train", "step": 1})
    _fail_after(monkeypatch, log._file, "write", 0, errno.EFBIG)
    with pytest.raises(DiskFull, match=r"file too large for the file-size limit \(\d+ bytes needed\); the rows"):
        log.log({"kind": "train", "step": 2})
    log.close()
    assert [json.loads(x)["step"] for x in (tmp_path / METRICS).read_text().splitlines()] == [1]


def test_resuming_a_finished_run_writes_nothing_to_its_log(tmp_path, monkeypatch):
    """A reproduction reuses a finished run by resuming it: its log keeps every row, so it is left as it is
    (no temporary copy on a full disk, the same modification time)."""
    from emarule.engine import rundir

    _, ctx = run_toy(tmp_path, toy_spec(**SPEC), out="run")
    log = ctx.out / METRICS
    before, stamp = log.read_bytes(), log.stat().st_mtime_ns
    written, real = [], rundir.atomic_write_bytes
    monkeypatch.setattr(rundir, "atomic_write_bytes", lambda path, *a, **k: (written.append(Path(path).name),
                                                                             real(path, *a, **k))[1])
    run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert METRICS not in written and log.read_bytes() == before and log.stat().st_mtime_ns == stamp


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no checkpoint, no clean-up of the run's files)."""


@pytest.fixture
def killed_after_a_checkpoint(tmp_path, monkeypatch):
    """A run killed right after its first checkpoint (epoch 1 of 3), with a row past it in its log, as a run
    killed between two checkpoints leaves."""
    real = train.save

    def save_then_die(*a, **kw):
        real(*a, **kw)
        raise Killed

    monkeypatch.setattr(train, "save", save_then_die)
    with pytest.raises(Killed):
        run_toy(tmp_path, toy_spec(**SPEC), out="run")
    monkeypatch.undo()
    out = tmp_path / "run"
    upto = (out / METRICS).read_bytes()
    with (out / METRICS).open("a") as f:
        f.write(json.dumps({"kind": "train", "samples_seen": 10**9, "step": 10**6}) + "\n")
    return out, upto


def test_resume_drops_the_rows_past_the_checkpoint_and_ends_as_the_uninterrupted_run(tmp_path,
                                                                                   killed_after_a_checkpoint):
    out, upto = killed_after_a_checkpoint
    assert load_checkpoint(out)["log"] == {"bytes": len(upto), "sha256": hashlib.sha256(upto).hexdigest()}
    _, ctx = run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    _, ref = run_toy(tmp_path, toy_spec(**SPEC), out="ref")
    # the resumed log is the uninterrupted run's but for the wall-clock fields, and the final checkpoint
    # records the file as it now is
    drop = ("samples_per_s", "wall_s", "data_wait_s")
    rows = [{k: v for k, v in json.loads(x).items() if k not in drop} for x in (out / METRICS).read_text().splitlines()]
    assert rows == [{k: v for k, v in json.loads(x).items() if k not in drop}
                    for x in (ref.out / METRICS).read_text().splitlines()]
    data = (out / METRICS).read_bytes()
    assert data.startswith(upto) and load_checkpoint(out)["log"]["sha256"] == hashlib.sha256(data).hexdigest()


LOG_EDITS = {
    "a value": lambda rows: rows[:1] + [rows[1].replace('"step": 2', '"step": 7')] + rows[2:],
    "a row deleted": lambda rows: rows[:1] + rows[2:],
    "two rows swapped": lambda rows: [rows[1], rows[0], *rows[2:]],
    "a row added in the middle": lambda rows: rows[:2] + [rows[1]] + rows[2:],
}


@pytest.mark.parametrize("edit", LOG_EDITS.values(), ids=LOG_EDITS.keys())
@pytest.mark.parametrize("which", ["finished", "killed"])
def test_resume_refuses_a_log_edited_before_the_checkpoint(tmp_path, which, edit, request):
    out = (run_toy(tmp_path, toy_spec(**SPEC), out="run")[1].out if which == "finished"
           else request.getfixturevalue("killed_after_a_checkpoint")[0])
    log = out / METRICS
    rows = log.read_text().splitlines(keepends=True)
    assert '"step": 2' in rows[1]
    log.write_text("".join(edit(rows)))
    before = log.read_bytes()
    with pytest.raises(UserError) as e:
        run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert str(e.value).startswith(f"--resume: {log} was edited after the run wrote it (its rows up to the checkpoint")
    assert "put back the file the run wrote, or start a new run with --out NEW_DIR" in str(e.value)
    assert log.read_bytes() == before


def test_resume_refuses_a_row_added_after_a_finished_runs_last_one(tmp_path, finished):
    log = finished / METRICS
    rows = log.read_text().splitlines(keepends=True)
    log.write_text("".join(rows + [rows[-1]]))
    with pytest.raises(UserError, match=r"holds 1 row\(s\) after the finished run's last one, which the run did not"):
        run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)


def test_a_checkpoint_without_the_logs_record_is_checked_row_by_row(tmp_path, finished):
    """Checkpoints written before they held the log's digest still resume; the digest is then the file's."""
    ck = load_checkpoint(finished)
    del ck["log"]
    torch.save(ck, finished / "checkpoint.pt")
    rows = (finished / METRICS).read_text().splitlines(keepends=True)
    (finished / METRICS).write_text("".join(rows[:1] + rows[2:]))  # undetectable without the digest
    run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert (finished / METRICS).read_text() == "".join(rows[:1] + rows[2:])


# --- records edited, deleted or damaged ---------------------------------------------------------


@pytest.fixture
def finished(tmp_path):
    _, ctx = run_toy(tmp_path, toy_spec(**SPEC), out="run")
    return ctx.out


@pytest.mark.parametrize("damage,needle", [
    (lambda p: p.write_text(p.read_text().replace('"seed": 0', '"seed": 5')), "was edited after the run wrote it "
                                                                             "(fingerprint.seed, seed differ"),
    (lambda p: p.write_text(p.read_text().replace('"kappa": 1.0', '"kappa": 4.0', 1)), "was edited"),
    (lambda p: p.unlink(), "is missing"),
    (lambda p: p.write_text("{not json"), "is corrupt (not valid JSON)"),
    (lambda p: p.write_text("[1, 2]"), "is corrupt (not a JSON object)"),
])
def test_resume_refuses_a_record_that_differs_from_the_checkpoints_copy(tmp_path, finished, damage, needle):
    damage(finished / HPARAMS)
    with pytest.raises(UserError) as e:
        run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert str(e.value).startswith(f"--resume: {finished / HPARAMS} ") and needle in str(e.value)
    assert "put back the file the run wrote" in str(e.value)


def test_how_a_run_executes_may_change_between_resumes(tmp_path, finished):
    p = finished / HPARAMS
    record = json.loads(p.read_text())
    record["num_workers"], record["device"] = 3, "cuda:0"
    p.write_text(json.dumps(record))
    run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)


def test_a_record_rewritten_by_a_resume_with_settings_it_tolerates_is_no_edit(tmp_path, finished):
    """A resume that turns data.skip_bad_items on, or retitles the spec, rewrites hparams.json at once; stopped
    before its next checkpoint, the run resumes again (the checkpoint's copy still holds the earlier values)."""
    p = finished / HPARAMS
    record = json.loads(p.read_text())
    for spec in (record["spec"], record["fingerprint"]["spec"]):
        spec["title"] = "retitled"
        spec.setdefault("data", {})["skip_bad_items"] = True
    p.write_text(json.dumps(record))
    run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    record["spec"]["schedule"] = {**record["spec"].get("schedule", {}), "marker": 1}  # a real edit still counts
    p.write_text(json.dumps(record))
    with pytest.raises(UserError, match="was edited after the run wrote it"):
        run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)


def test_the_checkpoint_keeps_the_record_it_was_written_with(finished):
    ck = torch.load(finished / "checkpoint.pt", weights_only=False)
    assert json.loads((finished / HPARAMS).read_text())["fingerprint"]["seed"] == ck["record"]["seed"] == 0


# --- a run that stopped before its first checkpoint ---------------------------------------------


@pytest.fixture
def killed_early(tmp_path, monkeypatch):
    def die(*a, **kw):
        raise Killed

    monkeypatch.setattr(train, "save", die)
    with pytest.raises(Killed):
        run_toy(tmp_path, toy_spec(**SPEC), out="run")
    monkeypatch.undo()
    out = tmp_path / "run"
    assert (out / UNSAVED).exists() and (out / HPARAMS).exists() and not (out / "checkpoint.pt").exists()
    return out


def test_a_new_run_accepts_a_directory_that_never_checkpointed(tmp_path, killed_early):
    checks.run_dir(killed_early, resume=False)
    run_toy(tmp_path, toy_spec(**SPEC), out="run")
    assert (killed_early / "checkpoint.pt").exists() and not (killed_early / UNSAVED).exists()


def test_resume_restarts_a_directory_that_never_checkpointed(tmp_path, killed_early, capsys):
    checks.run_dir(killed_early, resume=True)
    run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert "stopped before its first checkpoint; starting it from the beginning" in capsys.readouterr().err
    rows = [json.loads(x) for x in (killed_early / METRICS).read_text().splitlines()]
    steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert steps == sorted(set(steps))  # the killed run's rows are gone, not doubled


def test_a_record_without_the_marker_is_still_refused(tmp_path, killed_early):
    (killed_early / UNSAVED).unlink()  # a run whose checkpoint was deleted: its record is kept
    with pytest.raises(UserError, match="already holds a run"):
        checks.run_dir(killed_early, resume=False)


@pytest.mark.parametrize("edit", [lambda ck: ck["model"].pop(next(iter(ck["model"]))),
                                  lambda ck: ck.__setitem__("clock", {"foo": 1})])
def test_a_checkpoint_edited_past_its_key_check_is_one_line(tmp_path, edit):
    _, ctx = run_toy(tmp_path, toy_spec(**SPEC), out="run")
    ck = torch.load(ctx.out / "checkpoint.pt", weights_only=False)
    ck["finished"] = False
    edit(ck)
    torch.save(ck, ctx.out / "checkpoint.pt")
    with pytest.raises(UserError, match="does not fit this run .* start a new run with --out NEW_DIR") as e:
        run_toy(tmp_path, toy_spec(**SPEC), out="run", resume=True)
    assert "\n" not in str(e.value)
