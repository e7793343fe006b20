"""One process at a time in a run directory (emarule/engine/runlock.py): a second process is refused with
one line naming the holder, a lock left by a dead process is taken over and said."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emarule.errors import UserError
from emarule.engine.runlock import LOCK, DirLock, check_free
from tests.engine_util import ROOT, env, toy_spec, write_spec

HOLD = ("import sys, time; from emarule.engine.runlock import DirLock\n"
        "with DirLock(sys.argv[1], 'run'):\n"
        "    print('locked', flush=True); time.sleep(120)\n")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid  # reaped: no process has it (pids are not reused this quickly)


@pytest.fixture
def holder(tmp_path):
    """A separate process holding the lock of tmp_path/run."""
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        yield run, p
    finally:
        p.kill()
        p.wait()


def test_a_second_process_is_refused_with_the_holders_host_and_pid(holder):
    run, p = holder
    with pytest.raises(UserError, match=rf"in use by another emarule run \(host {socket.gethostname()}, "
                                        rf"pid {p.pid} since .*UTC\); wait for it to finish"):
        DirLock(run).acquire()
    with pytest.raises(UserError, match=f"pid {p.pid}"):
        check_free(run)
    assert json.loads((run / LOCK).read_text())["pid"] == p.pid  # the holder's record is untouched


def test_a_lock_left_by_a_killed_process_is_taken_over_and_said(holder):
    run, p = holder
    p.kill()
    p.wait()
    assert (run / LOCK).exists()  # SIGKILL leaves the file; the kernel dropped the flock
    said = []
    with DirLock(run, echo=said.append):
        assert json.loads((run / LOCK).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and f"pid {p.pid}" in said[0] and "no longer running; taking it over" in said[0]
    assert not (run / LOCK).exists()


def test_without_flock_a_live_pid_holds_and_a_dead_one_is_stale(tmp_path, monkeypatch):
    import emarule.engine.runlock as rl

    monkeypatch.setattr(rl, "fcntl", None)  # a file system without flock: the recorded holder decides
    run = tmp_path / "run"
    run.mkdir()
    host = socket.gethostname()
    (run / LOCK).write_text(json.dumps({"host": host, "pid": os.getppid(), "started": time.time()}))
    with pytest.raises(UserError, match=f"pid {os.getppid()}"):
        DirLock(run).acquire()
    (run / LOCK).write_text(json.dumps({"host": host, "pid": _dead_pid(), "started": time.time()}))
    said = []
    with DirLock(run, echo=said.append):
        pass
    assert "taking it over" in said[0]


def test_the_lock_creates_nothing_it_does_not_remove(tmp_path):
    with DirLock(tmp_path / "a" / "b" / "run"):
        assert (tmp_path / "a" / "b" / "run" / LOCK).exists()
    assert list(tmp_path.iterdir()) == []  # the folders it made are gone, being empty
    check_free(tmp_path / "never")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_two_real_runs_into_one_out(tmp_path):
    """The issue's case: two `emarule run` into the same --out at once; the second is refused while
    the first runs, with one line naming the first's host and pid, and the first's files untouched."""
    spec = write_spec(tmp_path, toy_spec(**{"schedule.epochs": 5000, "toy.samples": 64}))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "emarule", "run", "--spec", str(spec), "--out", str(out)]
    first = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (out / LOCK).exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=90)
        assert first.poll() is None, "the first run ended before the second was refused: make it longer"
    finally:
        first.kill()
        first.wait()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"is in use by another emarule run (host {socket.gethostname()}, pid {first.pid}" in lines[0]
    assert json.loads((out / LOCK).read_text())["pid"] == first.pid  # left by the SIGKILL, stale now
    check_free(out)


def test_check_free_is_silent_on_a_free_directory(tmp_path):
    (tmp_path / LOCK).write_text("{}")  # left behind, nobody holds it
    check_free(tmp_path)
    assert Path(tmp_path / LOCK).read_text() == "{}"


def _hold(path: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


SWEEP = ["sweep", "byol-r18", "--preset", "tiny", "--kappas", "2", "--out", "{root}"]


RUN_IN_SWEEP = ["run", "byol-r18", "--preset", "tiny", "--out", "{root}/byol-r18/k1"]


@pytest.mark.parametrize("argv,locked", [(SWEEP, "byol-r18"), (SWEEP, "byol-r18/tiny-k1-rule-s0"),
                                         (["reproduce", "parabola", "--preset", "tiny", "--out", "{root}"], ""),
                                         (RUN_IN_SWEEP, "byol-r18")],
                         ids=["sweep-folder", "sweep-run", "reproduce-out", "run-in-a-sweeps-folder"])
def test_sweeps_reproductions_and_runs_refuse_a_locked_folder(tmp_path, capsys, argv, locked):
    """The sweep's experiment folder, one of its runs, a reproduction's --out, and a run given a directory in a
    folder a sweep holds (it would take one of the sweep's runs from under it): each held by another process,
    named in one line, and nothing written."""
    from cli_util import snapshot
    from emarule.cli.main import main

    holder = _hold(tmp_path / "root" / locked)
    before = snapshot(tmp_path / "root")
    try:
        with pytest.raises(SystemExit) as e:
            main([a.format(root=tmp_path / "root") for a in argv])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert (f"{tmp_path / 'root' / locked} is in use by another emarule run (host {socket.gethostname()}, "
            f"pid {holder.pid}") in err[0]
    assert snapshot(tmp_path / "root") == before


def test_another_rank_of_the_same_launch_does_not_trip_over_rank_0s_lock(holder, monkeypatch):
    """Under torchrun rank 0 holds the lock; rank 1's pre-checks must not read it as another run's (a sweep
    under torchrun failed at random: rank 1 checked after rank 0 had locked)."""
    run, _ = holder
    monkeypatch.setenv("RANK", "1")
    check_free(run, "run")  # no error on rank 1
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="in use by another emarule run"):
        check_free(run, "run")
