"""`--jobs 2` killed outright: the workers notice that their parent is gone and exit, freeing their runs'
locks, and the same command then resumes and finishes.

A real `python -m emarule reproduce` in a subprocess (the workers are spawned processes, and the defect
is in how they outlive a parent that SIGKILL took without a chance to tell them).
"""

import os
import signal
import subprocess
import sys
import time

import psutil

COMMAND = ["reproduce", "byol", "--preset", "tiny", "--seeds", "2", "--jobs", "2"]
WORKERS_GONE_S = 90  # an orphan notices within a second, then stops its run at a step's checkpoint


def _gone(proc: psutil.Process) -> bool:
    try:
        # A zombie has exited: only an init that does not reap (some containers) leaves it listed.
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cmdline(proc: psutil.Process) -> str:
    """A child's command line, or "" for one that ended (or became a zombie) since it was listed."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _training(out) -> bool:
    """True once some run has logged a row: the kill then falls mid-run, where a run holds its lock."""
    return any(out.glob("**/metrics.jsonl"))


def test_workers_of_a_killed_reproduction_exit_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "r"
    env = {**os.environ, "EMARULE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("EMARULE_JOBS", None)
    cmd = [sys.executable, "-m", "emarule", *COMMAND, "--out", str(out)]
    # Output to a file, not a pipe: orphans would hold a pipe's write end, and reading it would wait on them.
    with open(tmp_path / "first.log", "wb") as log:
        parent = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    children: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and parent.poll() is None:
            try:
                children = psutil.Process(parent.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            workers = [c for c in children if "spawn_main" in _cmdline(c)]
            if len(workers) >= 2 and _training(out):
                break
            time.sleep(0.1)
        assert parent.poll() is None, "the reproduction ended before its workers trained: " + \
            (tmp_path / "first.log").read_text(errors="replace")[-2000:]
        assert len(workers) >= 2, f"no two workers within 120 s: {[_cmdline(c) for c in children]}"
        children = psutil.Process(parent.pid).children(recursive=True)  # the resource tracker too

        parent.send_signal(signal.SIGKILL)
        parent.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < WORKERS_GONE_S and not all(_gone(c) for c in children):
            time.sleep(0.2)
        left = [c.pid for c in children if not _gone(c)]
        assert not left, f"orphaned workers still alive {WORKERS_GONE_S} s after their parent was killed: {left}"
        print(f"orphans gone {time.monotonic() - t0:.1f} s after the kill")
    finally:
        for c in children:  # never leave orphans behind, whatever failed
            try:
                c.kill()
            except psutil.Error:
                pass
        if parent.poll() is None:
            parent.kill()
            parent.wait()

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "in use by another emarule" not in again.stdout + again.stderr
    assert (out / "verdict.json").is_file()


POOL = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from emarule.analysis.parallel import exit_with_parent

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=exit_with_parent,
                               initargs=(os.getpid(),))
    pool.submit(time.sleep, 0).result()  # the worker is up
    print("ready", flush=True)
    pool.submit(time.sleep, 600)
    time.sleep(600)
"""


def test_a_fit_pools_worker_exits_with_its_killed_parent(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers: list = []
    try:
        assert parent.stdout.readline().strip() == "ready"
        workers = psutil.Process(parent.pid).children(recursive=True)
        assert workers
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while not all(map(_gone, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(map(_gone, workers)), [w.pid for w in workers if not _gone(w)]
    finally:
        parent.kill()
        for w in workers:
            if not _gone(w):
                w.kill()
