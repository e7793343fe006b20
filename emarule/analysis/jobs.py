"""A sweep's runs as submitit jobs (`--executor slurm` or `submitit-local`), one job per run that is not finished.

    ROOT/<experiment>/jobs.json      each run's latest job id (and those before it), written as jobs are submitted
    ROOT/<experiment>/jobs/<id>/     submitit's files of one job: <id>_0_log.out, its log, is the one to read

Run again, the same command submits nothing for a run that is finished or whose job is queued or running: it
prints each run's state and job id, follows the jobs until they end (unless --no-wait), and judges the runs
as a sweep on this machine does. A job that failed is one line naming its run and log; run again, the command
submits that run again and it resumes from its checkpoint.

In the job (`TrainJob`), every process of an N nodes × G GPUs job reads its rank from submitit's environment
(`submitit.helpers.TorchDistributedEnvironment`) and joins the process group as under torchrun. Before a time
limit or on a preemption Slurm sends submitit's signal (USR2): the loop checkpoints after the step in progress
(the SIGTERM it already obeys), then submitit's checkpointing protocol (`TrainJob.checkpoint`) requeues the job,
which resumes the run. A baseline the seed's other runs read (`sweep`'s `after`) finishes first: on Slurm they
wait in the queue on it (`--dependency=afterok`), here they are submitted once it has finished.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from emarule.analysis.executors import Executor, make, require_submitit
from emarule.engine.rundir import CHECKPOINT, atomic_write_text, read_json
from emarule.errors import UserError

RECORD = "jobs.json"
JOBS_DIR = "jobs"
LIVE = {"PENDING": "queued", "REQUEUED": "queued", "CONFIGURING": "queued", "SUSPENDED": "queued",
        "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued", "RESIZING": "running", "RUNNING": "running",
        "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running"}


class Pending(SystemExit):
    """--no-wait: the jobs are submitted and some are still queued or running; the command ends here (exit 0)."""

    def __init__(self):
        super().__init__(0)


class TrainJob:
    """One run, as submitit runs it in each process of the job. Picklable: the run's context and its task."""

    def __init__(self, ctx, task_spec=None, threads: int | None = None):
        self.ctx, self.task_spec, self.threads = ctx, task_spec, threads

    def __call__(self) -> tuple[dict, float]:
        """The run's result (its final metrics) and this job's time training it."""
        import submitit

        from emarule import tasks
        from emarule.analysis.parallel import DIVERGED_KEY
        from emarule.errors import TrainingDiverged
        from emarule import registry

        if self.threads is not None:  # jobs that share this machine's cores, as `parallel`'s workers do
            import torch

            torch.set_num_threads(self.threads)
        if self.task_spec is not None and registry.lookup(self.task_spec.name) is None:
            registry.register(self.task_spec)
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # torchrun's variables, which emarule.engine.distributed reads
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        stop = _PreemptionStops()
        ctx = replace(self.ctx, resume=(Path(self.ctx.out) / CHECKPOINT).exists(),
                      resume_hint="the same emarule command submits the run again, and it resumes")
        t0 = time.monotonic()
        try:
            return tasks.run_task(ctx) or {}, time.monotonic() - t0
        except TrainingDiverged as e:  # the sweep's answer for this run, as on this machine
            return {DIVERGED_KEY: str(e)}, time.monotonic() - t0
        except SystemExit as e:
            if stop.signum is not None and e.code in (130, 143):
                stop.requeue()  # a checkpoint is written: submitit's protocol requeues the job and exits
            raise
        finally:
            stop.restore()

    def checkpoint(self, *args, **kwargs):
        """submitit's checkpointing protocol, on a preemption or the time limit: the same run, resumed."""
        import submitit

        return submitit.helpers.DelayedSubmission(TrainJob(replace(self.ctx, resume=True), self.task_spec,
                                                           self.threads))


class _PreemptionStops:
    """submitit's signal (USR2) stops the loop as SIGTERM does, at a checkpoint after the step in progress; then
    submitit's own handler checkpoints the job (`TrainJob.checkpoint`) and requeues it. A signal that comes
    while no loop trains (the job still starting) goes to submitit's handler at once."""

    def __init__(self):
        from submitit.core.job_environment import JobEnvironment

        self.sig = JobEnvironment._usr_sig()
        self.signum = None
        self.submitit_handler = signal.getsignal(self.sig)
        signal.signal(self.sig, self._handle)

    def _handle(self, signum, frame):
        from emarule.engine.checkpoint import StopSignal

        self.signum = signum
        term = signal.getsignal(signal.SIGTERM)
        if isinstance(getattr(term, "__self__", None), StopSignal):
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            self.requeue()

    def requeue(self) -> None:
        if callable(self.submitit_handler):
            self.submitit_handler(self.sig, None)

    def restore(self) -> None:
        signal.signal(self.sig, self.submitit_handler)


def _job_state(kind: str, folder: Path, job_id: str, held: dict) -> str:
    """queued, running or ended."""
    job = held.get(job_id)
    if kind == "submitit-local":
        if job is not None:
            return "running" if job.state == "RUNNING" else "ended"
        try:  # a controller started by an earlier command: alive, and still submitit's
            cmd = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
        except (OSError, ValueError):
            return "ended"
        return "running" if b"submitit.local._local" in cmd else "ended"
    from submitit.slurm.slurm import SlurmJob

    if _paths(folder, job_id).result_pickle.exists():
        return "ended"
    state = ((job or SlurmJob(folder / "%j", job_id)).state.split() or ["UNKNOWN"])[0]
    # UNKNOWN: sacct does not list the job yet (just submitted)
    return LIVE.get(state, "queued" if state == "UNKNOWN" else "ended")


def _paths(folder: Path, job_id: str):
    from submitit.core.utils import JobPaths

    return JobPaths(folder / "%j", job_id, 0)


def _outcome(folder: Path, job_id: str) -> tuple[str, object]:
    """("success", result), ("error", traceback text), or ("gone", None) for a job that left no result."""
    from submitit.core.utils import pickle_load

    p = _paths(folder, job_id).result_pickle
    try:
        return tuple(pickle_load(p))
    except (OSError, EOFError, ValueError, TypeError):
        return "gone", None


def log_of(folder: Path, job_id: str) -> Path:
    return _paths(folder, job_id).stdout


def _finished(out: Path) -> dict | None:
    """A finished run's final metrics, read from its checkpoint; None when it has not finished."""
    p = Path(out) / CHECKPOINT
    if not p.is_file():
        return None
    import torch

    try:
        ck = torch.load(p, map_location="cpu", weights_only=False, mmap=True)
    except Exception:  # noqa: BLE001 - a damaged checkpoint: the run's own job says so
        return None
    return dict(ck.get("final_metrics") or {}) if isinstance(ck, dict) and ck.get("finished") else None


def read_record(sweep_dir: Path) -> dict:
    data = read_json(sweep_dir / RECORD)
    return data if isinstance(data, dict) and isinstance(data.get("runs"), dict) else {"runs": {}}


def _write_record(sweep_dir: Path, record: dict) -> None:
    atomic_write_text(sweep_dir / RECORD, json.dumps(record, indent=1) + "\n")


def run_as_jobs(console, runs: list, ctxs: list, executor: Executor, after: list, tasks, check: Callable,
                on_run_end=None, at_once: int | None = None) -> list[tuple[int, dict, float]]:
    """Submit every run that is neither finished nor queued or running; follow them. [(i, result, wall_s)] of
    every run once all have finished; a UserError naming each failed run's log; `Pending` with --no-wait.
    `at_once`: at most this many jobs queued or running at a time (submitit-local's processes share this
    machine's cores; Slurm's queue needs no such limit). `check`: the sweep's check of the runs before the first
    trains (`sweep.check_before_training`), passed in as `tasks` is."""
    from emarule import registry

    sweep_dir = Path(ctxs[0].out).parent
    folder = sweep_dir / JOBS_DIR
    record = read_record(sweep_dir)
    if record.get("executor") not in (None, executor.kind):
        raise UserError(f"{sweep_dir / RECORD} records {record['executor']} jobs; follow them with --executor "
                        f"{record['executor']}, or give the sweep another --out")
    require_submitit(executor.kind)
    held: dict = {}  # job id → the submitit Job this command submitted
    names = [Path(c.out).name for c in ctxs]
    state, done = {}, {}  # done: run → (its final metrics, this command's time training it)
    for i, name in enumerate(names):
        job_id = (record["runs"].get(name) or {}).get("job")
        live = _job_state(executor.kind, folder, job_id, held) if job_id else "ended"
        final = _finished(ctxs[i].out) if live == "ended" else None
        state[i] = live if live != "ended" else ("finished" if final is not None else "to submit")
        if final is not None:
            done[i] = (final, 0.0)
    # runs this command may train are checked as on this machine (settings, locks); a live job holds its lock
    free = [ctxs[i] for i in state if state[i] in ("to submit", "finished")]
    if free:
        check(free, tasks.build_parts)
    ex = None
    threads = None
    if at_once is not None and not os.environ.get("OMP_NUM_THREADS"):  # else the jobs take what it says
        from emarule.analysis.parallel import cores

        threads = max(1, cores() // (at_once * executor.world[1]))
    started = set()  # the runs submitted by this command

    def submit(i: int) -> None:
        nonlocal ex
        ex = ex or make(executor, folder)
        extra = {}
        base = after[i]
        if executor.kind == "slurm":
            add = dict(executor.params.get("slurm_additional_parameters") or {})
            if base is not None and state[base] in ("queued", "running"):
                add |= {"dependency": f"afterok:{record['runs'][names[base]]['job']}", "kill-on-invalid-dep": "yes"}
            extra = {"slurm_additional_parameters": add, "name": f"emarule-{names[i]}"}
        if extra:
            ex.update_parameters(**extra)
        job = ex.submit(TrainJob(ctxs[i], registry.lookup(ctxs[i].spec.get("task")), threads))
        held[job.job_id] = job
        entry = record["runs"].get(name_i := names[i]) or {}
        record["runs"][name_i] = {"job": job.job_id, "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  "earlier": [*entry.get("earlier", []), *([entry["job"]] if entry.get("job") else [])]}
        record["executor"] = executor.kind
        _write_record(sweep_dir, record)
        state[i] = "queued"
        started.add(i)

    def ready(i: int) -> bool:
        base = after[i]
        if base is None or state[base] == "finished":
            return True
        return executor.kind == "slurm" and state[base] in ("queued", "running")  # waits in the queue on it

    def submit_ready() -> None:
        for i in sorted(state, key=lambda i: after[i] is not None):  # baselines first: the others name their job
            busy = sum(s in ("queued", "running") for s in state.values())
            if state[i] == "to submit" and ready(i) and (at_once is None or busy < at_once):
                submit(i)

    def waiting(i: int) -> str:
        return "waits for its baseline" if not ready(i) else "waits for a job to end (--jobs)"

    submit_ready()
    for i, name in enumerate(names):
        job_id = (record["runs"].get(name) or {}).get("job")
        what = state[i] + (" (submitted now)" if i in started else "") if state[i] != "to submit" else waiting(i)
        console.print(f"  {name}: {what}" + (f", job {job_id}" if job_id and state[i] != "finished" else "")
                      + (f", log {log_of(folder, job_id)}" if job_id and state[i] in ("queued", "running") else ""),
                      highlight=False)
    failed: list[str] = []
    for _ in done if on_run_end is not None else ():
        on_run_end()
    if not executor.wait and any(state[i] != "finished" for i in state):
        console.print(f"{sum(state[i] != 'finished' for i in state)} of {len(state)} runs not finished yet; run the "
                      f"same command again to see their states, submit what is left and judge them once every one "
                      f"has finished", highlight=False)
        raise Pending()
    try:
        while any(state[i] in ("queued", "running", "to submit") for i in state):
            time.sleep(executor.poll_s)
            for i in [i for i in state if state[i] in ("queued", "running")]:
                job_id = record["runs"][names[i]]["job"]
                now = _job_state(executor.kind, folder, job_id, held)
                if now != "ended":
                    if now != state[i]:
                        console.print(f"  {names[i]}: {now}, job {job_id}", highlight=False)
                    state[i] = now
                    continue
                kind, value = _outcome(folder, job_id)
                final = _finished(ctxs[i].out) if kind == "gone" else None
                if kind == "success" or final is not None:  # a run whose job's result went astray is still done
                    state[i], done[i] = "finished", tuple(value) if kind == "success" else (final, 0.0)
                    console.print(f"  {names[i]}: finished, job {job_id}", highlight=False)
                    if on_run_end is not None:
                        on_run_end()
                else:
                    state[i] = "failed"
                    why = _last_line(value) if kind == "error" else "the job ended without a result (killed, " \
                                                                      "cancelled or its node lost)"
                    failed.append(f"{ctxs[i].out} failed in job {job_id}: {why}; its log: {log_of(folder, job_id)}")
                    console.print(f"  {failed[-1]}", markup=False, highlight=False)
            for i in state:  # a run whose baseline failed cannot start: it is left for the next command
                if state[i] == "to submit" and after[i] is not None and state[after[i]] == "failed":
                    state[i] = "waits for its baseline"
            submit_ready()
    except KeyboardInterrupt:
        if executor.kind == "slurm":
            console.print("stopped following the jobs; they go on in Slurm's queue, and the same command follows "
                          "them again", highlight=False)
        raise
    if failed:
        more = f" ({len(failed) - 1} more above)" if len(failed) > 1 else ""
        raise UserError(f"{failed[-1]}{more}; fix it and run the same command again: finished runs are kept and "
                        f"this one resumes")
    return [(i, done[i][0], done[i][1]) for i in sorted(done)]


def drop_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not there, or not empty
        pass


def _last_line(text) -> str:
    lines = [ln.strip() for ln in str(text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "an error without a message"
