"""A sweep's runs as submitit jobs, through submitit's LocalExecutor (`--executor submitit-local`): the rows a
sweep on this machine logs, a job killed mid-run resubmitted and resumed, a preempted job requeued by submitit's
checkpointing protocol, a failed job named with its log, and nothing submitted twice."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from emarule.analysis import jobs as J
from emarule.cli.main import app

runner = CliRunner()
TIMING = ("samples_per_s", "wall_s", "data_wait_s")
SWEEP = ["sweep", "polyak-r50", "--preset", "tiny", "--rule", "with"]
# long enough (about 40 steps) for a signal to land between two checkpoints (one an epoch)
LONG = ["--set", "schedule.epochs=10"]

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    # the jobs' processes inherit it; this process's runs set it: the same arithmetic on both sides
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def job_ids(sweep_dir: Path) -> dict:
    return {n: r["job"] for n, r in J.read_record(sweep_dir)["runs"].items()}


def test_jobs_log_the_rows_of_a_local_sweep_and_a_rerun_submits_nothing(tmp_path):
    here = runner.invoke(app, [*SWEEP, "--kappas", "2", "--out", str(tmp_path / "local")])
    assert here.exit_code == 0, here.output
    args = [*SWEEP, "--kappas", "2", "--out", str(tmp_path / "jobs"), "--executor", "submitit-local"]
    sub = runner.invoke(app, args)
    assert sub.exit_code == 0, sub.output
    for name in ("tiny-k1-rule-s0", "tiny-k2-rule-s0"):
        assert rows(tmp_path / "jobs" / "polyak-r50" / name) == rows(tmp_path / "local" / "polyak-r50" / name)
        assert f"run finished: {tmp_path / 'jobs' / 'polyak-r50' / name}" in sub.output
    assert "sweep: runs" in sub.output and (tmp_path / "jobs" / "polyak-r50" / "compare-loss.png").is_file()
    submitted = job_ids(tmp_path / "jobs" / "polyak-r50")
    assert len(set(submitted.values())) == 2

    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert job_ids(tmp_path / "jobs" / "polyak-r50") == submitted  # nothing submitted again
    assert "tiny-k1-rule-s0: finished" in again.output and "tiny-k2-rule-s0: finished" in again.output
    assert "sweep: runs" in again.output


def test_a_run_kept_as_its_records_is_not_submitted_and_the_others_do_not_wait_for_it(tmp_path):
    import shutil

    here = runner.invoke(app, [*SWEEP, "--kappas", "2", "--out", str(tmp_path / "local")])
    assert here.exit_code == 0, here.output
    base = tmp_path / "jobs" / "polyak-r50" / "tiny-k1-rule-s0"  # the baseline, its checkpoint gone
    shutil.copytree(tmp_path / "local" / "polyak-r50" / "tiny-k1-rule-s0", base,
                    ignore=shutil.ignore_patterns("*.pt"))
    kept = (base / "metrics.jsonl").read_bytes()
    sub = runner.invoke(app, [*SWEEP, "--kappas", "2", "--out", str(tmp_path / "jobs"), "--executor", "submitit-local"])
    assert sub.exit_code == 0, sub.output
    assert "1 of the 2 runs ended before and kept only their records" in " ".join(sub.output.split())
    assert list(job_ids(tmp_path / "jobs" / "polyak-r50")) == ["tiny-k2-rule-s0"]
    assert rows(tmp_path / "jobs" / "polyak-r50" / "tiny-k2-rule-s0") == \
        rows(tmp_path / "local" / "polyak-r50" / "tiny-k2-rule-s0")
    assert (base / "metrics.jsonl").read_bytes() == kept and not (base / "checkpoint.pt").exists()
    assert "sweep: runs" in sub.output and "tiny-k1-rule-s0" in sub.output.split("sweep: runs")[1]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _training_task(sweep_dir: Path, name: str, timeout_s: float = 120.0) -> int:
    """The pid of the job's training process, once the run has written a checkpoint and trained past it."""
    controller = int(job_ids(sweep_dir)[name])
    run = sweep_dir / name
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run / "checkpoint.pt").exists() and (run / "metrics.jsonl").exists():
            epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
            tasks = _children(controller)
            if epochs and 1 < epochs[-1] < 8 and tasks:
                return tasks[0]
        time.sleep(0.05)
    raise AssertionError(f"{run} did not train past its first checkpoint in {timeout_s} s")


def reference(tmp_path: Path) -> list[dict]:
    res = runner.invoke(app, [*SWEEP, "--kappas", "1", *LONG, "--out", str(tmp_path / "ref")])
    assert res.exit_code == 0, res.output
    return rows(tmp_path / "ref" / "polyak-r50" / "tiny-k1-rule-s0")


def submitted_and_training(tmp_path: Path, signum: int) -> tuple[list, Path, str]:
    """A one-run sweep submitted with --no-wait, `signum` sent to its training process past its first checkpoint:
    (the command, the sweep's directory, the job id)."""
    args = [*SWEEP, "--kappas", "1", *LONG, "--out", str(tmp_path / "jobs"), "--executor", "submitit-local"]
    first = runner.invoke(app, [*args, "--no-wait"])
    assert first.exit_code == 0, first.output
    sweep_dir = tmp_path / "jobs" / "polyak-r50"
    job = job_ids(sweep_dir)["tiny-k1-rule-s0"]
    os.kill(_training_task(sweep_dir, "tiny-k1-rule-s0"), signum)
    return args, sweep_dir, job


def log_of(sweep_dir: Path, job: str) -> str:
    return (sweep_dir / J.JOBS_DIR / job / f"{job}_0_log.out").read_text()


def test_a_job_killed_mid_run_is_submitted_again_and_resumes(tmp_path):
    args, sweep_dir, killed = submitted_and_training(tmp_path, signal.SIGKILL)  # no checkpoint, no word
    deadline = time.monotonic() + 30
    while J._job_state("submitit-local", sweep_dir / J.JOBS_DIR, killed, {}) != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.1)

    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    record = J.read_record(sweep_dir)["runs"]["tiny-k1-rule-s0"]
    assert record["job"] != killed and record["earlier"] == [killed]
    assert f"resuming {sweep_dir / 'tiny-k1-rule-s0'} at " in log_of(sweep_dir, record["job"])
    assert rows(sweep_dir / "tiny-k1-rule-s0") == reference(tmp_path)


def test_a_preempted_job_checkpoints_requeues_and_resumes(tmp_path):
    """Slurm's signal before a time limit or on a preemption is submitit's USR2: the loop checkpoints, submitit's
    checkpointing protocol requeues the job (here its LocalExecutor starts the process again) and the run resumes."""
    args, sweep_dir, job = submitted_and_training(tmp_path, signal.SIGUSR2)
    follow = runner.invoke(app, args)  # the same job, requeued: nothing submitted again
    assert follow.exit_code == 0, follow.output
    assert job_ids(sweep_dir) == {"tiny-k1-rule-s0": job}
    log = log_of(sweep_dir, job)
    assert "SIGTERM: checkpoint written" in log and "Requeued job" in log, log
    assert log.index("Requeued job") < log.index(f"resuming {sweep_dir / 'tiny-k1-rule-s0'} at "), log
    assert rows(sweep_dir / "tiny-k1-rule-s0") == reference(tmp_path)


def test_a_failed_job_is_one_line_naming_the_run_and_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("EMARULE_DEVICE", "tpu")  # read first in the job: every check before it passes
    res = runner.invoke(app, [*SWEEP, "--kappas", "1", "--out", str(tmp_path), "--executor", "submitit-local"])
    assert res.exit_code == 2, res.output
    last = res.output.strip().splitlines()[-1]
    job = job_ids(tmp_path / "polyak-r50")["tiny-k1-rule-s0"]
    log = tmp_path / "polyak-r50" / J.JOBS_DIR / job / f"{job}_0_log.out"
    assert last.startswith(f"error: {tmp_path / 'polyak-r50' / 'tiny-k1-rule-s0'} failed in job {job}: "), last
    assert "EMARULE_DEVICE='tpu'" in last and f"its log: {log}" in last, last
    assert "EMARULE_DEVICE='tpu'" in log.read_text()


def test_a_job_of_two_processes_trains_one_run_in_one_process_group(tmp_path):
    """Each process reads its rank from submitit's environment and joins the group (gloo here): one run at
    world size 2, its record written once."""
    res = runner.invoke(app, [*SWEEP, "--kappas", "1", "--out", str(tmp_path), "--executor", "submitit-local",
                              "--gpus-per-node", "2"])
    assert res.exit_code == 0, res.output
    run = tmp_path / "polyak-r50" / "tiny-k1-rule-s0"
    assert json.loads((run / "hparams.json").read_text())["world_size"] == 2
    job = job_ids(tmp_path / "polyak-r50")["tiny-k1-rule-s0"]
    second = (tmp_path / "polyak-r50" / J.JOBS_DIR / job / f"{job}_1_log.out").read_text()
    assert "global_rank=1(2)" in second and "Traceback" not in second, second
