"""A sweep's runs side by side, one process each, when the machine has cores to spare (`--jobs`).

The CPU presets train models of a few hundred thousand parameters, whose steps a second torch thread
barely speeds up; two single-threaded runs side by side on two cores finish in about half the wall time
of the same runs one after another. Each run is the same `run_task(ctx)` as in the sequential sweep,
in a spawned worker with `cores // jobs` torch threads; its own output is held and printed when it
ends, so that the console reads run by run. While runs train, a line every `every_s` seconds says how
far each training run has come (the epoch of its last logged row) and how many are still to go.

Runs that others wait for (each seed's baseline) start first, so that a worker never idles while the only
runs left wait on one baseline. A finished run may bring follow-up work (a reproduction's offline probes
of its teacher); the workers take it whenever no run is ready to train, so it fills the last run's tail.

A worker whose parent dies without a word (SIGKILL, the OOM killer) stops its run at a checkpoint as
SIGTERM would and exits, so that it frees the run's lock and the same command resumes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

from emarule.errors import UserError

DIVERGED_KEY = "diverged"  # a run's result when it raised TrainingDiverged: its message


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


JOBS_ENV = "EMARULE_JOBS"  # the default of --jobs, as the option takes it


def parse_jobs(text: str | None) -> int | None:
    """--jobs (or $EMARULE_JOBS when it is not given): a count ≥ 1, or "auto" (None here: `jobs_for`
    decides)."""
    if text is None:
        text = os.environ.get(JOBS_ENV) or None
    if text is None or text.strip().lower() == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        where = f" (from ${JOBS_ENV})" if os.environ.get(JOBS_ENV) == text else ""
        raise UserError(f"--jobs {text}{where}: expected a number of runs at a time (1, 2, ...) or auto; "
                        f"auto runs one per CPU core when no GPU is visible")
    return n


def jobs_for(asked: int | None, n_runs: int, world_size: int) -> int:
    """How many runs train at once: one under torchrun (the launch's processes share every run) and on a
    machine with a GPU (runs would share the device); else `asked`, or one per core, never more than
    there are runs."""
    if world_size > 1:
        if asked is not None and asked > 1:
            raise UserError(f"--jobs {asked}: under torchrun every run uses all the launch's processes; "
                            f"leave --jobs out")
        return 1
    if asked is None:
        from emarule.engine.distributed import device_type

        asked = 1 if device_type() == "cuda" else cores()
    return max(1, min(asked, n_runs))


# In a worker: set once a stop signal has reached it, so that it starts no further run.
_stopping = False
# In a worker: set while it trains a run or does follow-up work, so that an orphaned worker waits for
# that work to stop (its checkpoint written, its lock released) before it exits.
_busy = False

# How often a worker looks for its parent, and how long an orphaned worker's work may take to stop
# before the worker exits regardless: a run that has not reached its checkpoint by then resumes from
# its last one.
PARENT_POLL_S = 1.0
ORPHAN_GRACE_S = 45.0


def _worker_start(parent: int | None = None) -> None:
    """A worker in its own process group: a Ctrl-C at the terminal reaches the parent alone, which sends
    each worker exactly one signal (two would stop a run without its checkpoint). Given the parent's pid,
    it also watches for the parent's death (`_watch_parent`)."""
    os.setpgrp()

    def note(signum, frame):
        global _stopping
        _stopping = True

    signal.signal(signal.SIGINT, note)
    signal.signal(signal.SIGTERM, note)
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(parent,), name="emarule-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    """In a worker, on a thread of its own: once the parent is gone (killed outright, so that it could not
    pass a signal on), stop as its SIGTERM would have, then exit. Nothing else ends an orphaned worker:
    it holds both ends of the executor's pipes, so it never sees them close; it would train on, holding
    the run's lock, then wait for work (or to hand back its result) for ever."""
    while os.getppid() == parent:  # an orphan's parent becomes init or a subreaper, never `parent` again
        time.sleep(PARENT_POLL_S)
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while True:
        # Sent again while work goes on: a signal that came as a run began, before its loop took SIGTERM
        # over, only marked this worker stopping. More SIGTERMs change nothing (only a second SIGINT
        # stops a run without its checkpoint).
        os.kill(os.getpid(), signal.SIGTERM)
        if not _busy or time.monotonic() >= deadline:
            break
        time.sleep(PARENT_POLL_S)
    os._exit(143)  # not sys.exit: the main thread may be blocked on the dead parent's pipe


def exit_with_parent(parent: int) -> None:
    """A pool worker's initializer for work that holds no lock and writes atomically (the probes' fits):
    once the parent is gone the worker exits at once, rather than wait on the dead parent's pipe for ever."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(143)

    threading.Thread(target=watch, name="emarule-parent-watch", daemon=True).start()


def _train(ctx, task_spec, threads: int) -> tuple[str, dict, float, str]:
    """In a worker: one run, single- or few-threaded, its console output held. ("done", result, wall, output),
    ("stopped", {}, wall, output) when a signal stopped it at a checkpoint, ("skipped", ...) when a signal
    came before it started. A run that diverged is done: its result is the message (`DIVERGED_KEY`), and
    the other runs go on, as they do one at a time."""
    global _busy
    _busy = True
    try:
        return _train_one(ctx, task_spec, threads)
    finally:
        _busy = False


def _train_one(ctx, task_spec, threads: int) -> tuple[str, dict, float, str]:
    global _stopping
    if _stopping:
        return "skipped", {}, 0.0, ""
    import torch

    torch.set_num_threads(threads)
    from emarule import tasks
    from emarule import registry

    if task_spec is not None and registry.lookup(task_spec.name) is None:  # registered in the parent only
        registry.register(task_spec)
    from emarule.errors import TrainingDiverged

    buf = io.StringIO()
    t0 = time.monotonic()
    try:
        with redirect_stdout(buf), redirect_stderr(buf):
            result = tasks.run_task(replace(ctx, quiet=True))
    except TrainingDiverged as e:
        return "done", {DIVERGED_KEY: str(e)}, time.monotonic() - t0, buf.getvalue() + f"  diverged: {e}\n"
    except SystemExit as e:  # the loop's exit after the checkpoint a signal asked for
        if e.code not in (130, 143):
            raise
        _stopping = True
        return "stopped", {}, time.monotonic() - t0, buf.getvalue()
    return "done", result or {}, time.monotonic() - t0, buf.getvalue()


def _follow(fn, args: tuple) -> str | None:
    """In a worker: one piece of follow-up work; its error as text, or None. The caller does the same
    work again in its own process wherever this left nothing behind, and raises the error there."""
    global _busy
    if _stopping:
        return "skipped: a stop signal came first"
    _busy = True
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 (recomputed and raised by the caller, see above)
        return f"{type(e).__name__}: {e}"
    finally:
        _busy = False
    return None


def start_order(after: list | None, n: int) -> list[int]:
    """The order runs are offered to the workers: first every run another waits for, then the rest, each
    group in plan order."""
    if after is None:
        return list(range(n))
    awaited = {a for a in after if a is not None}
    return [i for i in range(n) if i in awaited] + [i for i in range(n) if i not in awaited]


def _epoch_reached(out: Path) -> float | None:
    """The epoch of the run's last logged row (the last line of metrics.jsonl), None before the first."""
    try:
        with open(out / "metrics.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
        return float(json.loads(lines[-1])["epoch"]) if lines else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # not there yet, or a line half-written
        return None


def _total_epochs(ctx) -> float | None:
    try:
        return float(ctx.cfg.schedule.epochs)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def run_side_by_side(console, labels: list[str], ctxs: list, jobs: int, on_done, every_s: float = 30.0,
                     after: list | None = None, follow_up=None) -> None:
    """Train `ctxs` `jobs` at a time; `on_done(i, result, wall_s, output)` in the parent as each ends, in
    the order they end. `after[i]`, when given and not None, is the index of a run that must have finished
    before run i starts: a run may read another's record (ctc-pseudo-label's κ > 2 runs take their start
    threshold from the same seed's κ=1 run), and one after another that order came for free. Runs that
    others wait for are offered first (`start_order`). `follow_up(i)`, when given, is called in the parent
    as run i ends and returns [(label, fn, args), ...]: picklable work a worker does when no run is ready
    to train, all of it before this returns. Its errors are not raised here (see `_follow`).

    Ctrl-C or SIGTERM to this process goes on to every worker once: each run in progress writes its
    checkpoint and stops, no further run starts, and this process exits as a stopped run does (130 or 143)
    after saying so. A second Ctrl-C stops everything at once. A run that fails stops the others the same
    way (at a checkpoint), and its error is raised here. Finished runs are kept; the same command resumes.
    """
    import multiprocessing

    from emarule import registry

    threads = max(1, cores() // jobs)
    console.print(f"{len(ctxs)} runs, {jobs} at a time ({threads} torch thread{'s' if threads > 1 else ''} each; "
                  f"--jobs 1 runs them one after another)", highlight=False)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start, initargs=(os.getpid(),))
    stop: dict = {"signal": None}

    def tell_workers(signum: int) -> None:
        for proc in list(getattr(pool, "_processes", {}).values()):  # the executor keeps its workers there
            try:
                os.kill(proc.pid, signum)
            except (OSError, AttributeError):
                pass

    def on_signal(signum, frame):
        again = stop["signal"] is not None
        stop["signal"] = signum
        tell_workers(signum)
        if again and signum == signal.SIGINT:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    stopped, finished_ok, waiting = [], set(), start_order(after, len(ctxs))
    in_flight: dict = {}  # future → a run's index, or a follow-up's label
    extra: list = []  # follow-up work not started yet

    def start_ready() -> None:
        # At most `jobs` submitted at a time, so that every submitted run has a worker of its own.
        while len(in_flight) < jobs and stop["signal"] is None:
            i = next((i for i in waiting if after is None or after[i] is None or after[i] in finished_ok), None)
            if i is not None:
                waiting.remove(i)
                in_flight[pool.submit(_train, ctxs[i], registry.lookup(ctxs[i].spec.get("task")), threads)] = i
            elif extra:
                label, fn, args = extra.pop(0)
                in_flight[pool.submit(_follow, fn, args)] = label
            else:
                return

    try:
        t_start = time.time()
        start_ready()
        while in_flight:
            finished, _ = wait(set(in_flight), timeout=1.0 if stop["signal"] else every_s,
                               return_when=FIRST_COMPLETED)
            for f in finished:
                i = in_flight.pop(f)
                if isinstance(i, str):  # follow-up work: its caller redoes what it did not leave behind
                    err = f.result()
                    if err is not None and stop["signal"] is None:
                        console.print(f"  {i}: {err}; it is done again after the runs", highlight=False)
                    continue
                try:
                    status, result, wall, output = f.result()
                except BaseException:
                    if stop["signal"] is None:
                        stop["signal"] = signal.SIGTERM
                        tell_workers(signal.SIGTERM)  # the others stop at a checkpoint
                    raise
                if status == "done":
                    finished_ok.add(i)
                    on_done(i, result, wall, output)
                    if follow_up is not None:
                        extra.extend(follow_up(i))
                elif status == "stopped":
                    stopped.append(i)
                    if output.strip():
                        console.print(output.rstrip(), markup=False, highlight=False)
            start_ready()
            if not finished and stop["signal"] is None:
                now = [i if isinstance(i, str) else _progress(labels[i], ctxs[i], t_start)
                       for i in in_flight.values()]
                console.print("  training: " + "; ".join(p for p in now if p) + (", " if any(now) else "")
                              + f"{len(waiting)} to go" + (f", {len(extra)} follow-ups" if extra else ""),
                              highlight=False)
        if waiting and stop["signal"] is None:  # only a dependency that never finished leaves runs here
            raise UserError(f"{len(waiting)} runs could not start: the runs they read did not finish")
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    pool.shutdown(wait=True)
    if stop["signal"] is not None:
        name = "SIGINT" if stop["signal"] == signal.SIGINT else "SIGTERM"
        console.print(f"{name}: {len(stopped)} run{'s' if len(stopped) != 1 else ''} stopped at a checkpoint; "
                      f"finished runs are kept; run the same command again to resume", highlight=False)
        raise SystemExit(130 if stop["signal"] == signal.SIGINT else 143)


def _progress(label: str, ctx, since: float) -> str | None:
    """How far a run has come, or None when it has logged nothing since `since` (not started yet)."""
    try:
        if (ctx.out / "metrics.jsonl").stat().st_mtime < since:
            return None
    except OSError:
        return None
    e, total = _epoch_reached(ctx.out), _total_epochs(ctx)
    if e is None:
        return None
    return f"{label} epoch {e:.2f}" + (f" of {total:g}" if total else "")
