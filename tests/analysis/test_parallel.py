"""`--jobs`: runs side by side in worker processes give the rows the same runs give one after another."""

import json

import pytest
from typer.testing import CliRunner

from emarule.analysis import parallel as P
from emarule.cli.main import app
from emarule.config.load import load_spec
from emarule.errors import UserError
from engine_util import rows_without_wall_clock

runner = CliRunner()


def test_parse_jobs(monkeypatch):
    monkeypatch.delenv(P.JOBS_ENV, raising=False)
    assert P.parse_jobs(None) is None and P.parse_jobs("auto") is None and P.parse_jobs(" AUTO ") is None
    assert P.parse_jobs("3") == 3
    for bad in ("0", "-1", "two", "1.5", ""):
        with pytest.raises(UserError, match="--jobs"):
            P.parse_jobs(bad)
    monkeypatch.setenv(P.JOBS_ENV, "2")
    assert P.parse_jobs(None) == 2 and P.parse_jobs("1") == 1  # the option wins over the variable
    monkeypatch.setenv(P.JOBS_ENV, "many")
    with pytest.raises(UserError, match=r"\$EMARULE_JOBS"):
        P.parse_jobs(None)


def test_jobs_for(monkeypatch):
    import torch

    monkeypatch.setattr(P, "cores", lambda: 6)
    monkeypatch.setenv("EMARULE_DEVICE", "auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.jobs_for(None, 25, 1) == 6
    assert P.jobs_for(None, 4, 1) == 4  # never more workers than runs
    assert P.jobs_for(3, 25, 1) == 3
    assert P.jobs_for(None, 25, 4) == 1  # torchrun: the launch's processes share every run
    with pytest.raises(UserError, match="torchrun"):
        P.jobs_for(2, 25, 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert P.jobs_for(None, 25, 1) == 1 and P.jobs_for(2, 25, 1) == 2
    monkeypatch.setenv("EMARULE_DEVICE", "cpu")  # a GPU machine's runs kept on the CPU share its cores
    assert P.jobs_for(None, 25, 1) == 6


def test_bad_jobs_writes_nothing(tmp_path):
    r = runner.invoke(app, ["sweep", "byol-r18", "--preset", "tiny", "--jobs", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--jobs 0" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def _one_thread(monkeypatch):
    # A worker trains with cores // jobs torch threads; the in-process run must use as many for its
    # floating-point sums to come out in the same order. Two cores make that 1 for 2 jobs on any machine
    # (with 16, a worker took 8 threads and its rows differed from the in-process run's).
    import torch

    torch.set_num_threads(1)
    monkeypatch.setattr(P, "cores", lambda: 2)


def test_side_by_side_rows_match_one_after_another(tmp_path, monkeypatch):
    _one_thread(monkeypatch)
    args = ["sweep", "byol-r18", "--preset", "tiny", "--kappas", "1,2"]
    one = runner.invoke(app, [*args, "--jobs", "1", "--out", str(tmp_path / "one")])
    two = runner.invoke(app, [*args, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert one.exit_code == 0, one.output
    assert two.exit_code == 0, two.output
    assert "3 runs, 2 at a time" in two.output and "wall time with 2 runs at a time" in two.output
    names = sorted(p.name for p in (tmp_path / "one" / "byol-r18").iterdir() if p.is_dir())
    assert names == ["tiny-k1-rule-s0", "tiny-k2-norule-s0", "tiny-k2-rule-s0"]
    for n in names:
        a, b = (rows_without_wall_clock(tmp_path / root / "byol-r18" / n) for root in ("one", "two"))
        assert len(a) > 3 and a == b, n
    # A second call reuses every finished run instead of training it again.
    again = runner.invoke(app, [*args, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert again.exit_code == 0 and again.output.count("(resuming what is there)") == 3


def test_progress_names_only_runs_that_logged_since_the_start(tmp_path):
    import os
    import time
    from types import SimpleNamespace

    ctx = SimpleNamespace(out=tmp_path, cfg=SimpleNamespace(schedule=SimpleNamespace(epochs=3)))
    t0 = time.time()
    assert P._progress("r", ctx, t0) is None  # nothing logged yet
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 0.5}\n{"epoch": 1.25, "loss": 2}\n')
    assert P._progress("r", ctx, t0 - 1) == "r epoch 1.25 of 3"
    os.utime(tmp_path / "metrics.jsonl", (t0 - 100, t0 - 100))  # a finished run's rows, from before
    assert P._progress("r", ctx, t0) is None
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 2.0}\n{"epo')  # a row half-written
    assert P._progress("r", ctx, t0 - 1) is None


def test_ctrl_c_stops_every_run_at_a_checkpoint_and_says_so(tmp_path):
    """One SIGINT to the sweep (a terminal's Ctrl-C reaches it alone: the workers have their own process
    group) stops each run in progress at a checkpoint, starts no further run, and exits 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "o"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "emarule", "sweep", "byol-r18", "--preset", "cpu", "--kappas",
                             "1,2", "--seeds", "2", "--jobs", "2", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    # The two seeds' baselines train first: a seed's other runs wait for its baseline.
    runs = [out / "byol-r18" / n for n in ("cpu-k1-rule-s0", "cpu-k1-rule-s1")]
    deadline = time.monotonic() + 240
    while not all((r / "metrics.jsonl").exists() for r in runs) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, output
    assert "stopped at a checkpoint; finished runs are kept; run the same command again to resume" in output
    assert output.count("SIGINT: checkpoint written at") == 2, output
    for r in runs:
        assert (r / "checkpoint.pt").is_file()
        last = json.loads((r / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["epoch"] < load_spec("byol-r18", preset="cpu")["schedule"]["epochs"]  # stopped, not finished
    assert not list((out / "byol-r18").glob("cpu-k2-*"))  # no further run started


def test_a_run_that_reads_its_seeds_baseline_waits_for_it(tmp_path, monkeypatch):
    """ctc-pseudo-label at κ > 2 takes its start threshold from the same seed's κ=1 run: side by side, it
    starts only once that run has finished, and reads what it reads one after another."""
    _one_thread(monkeypatch)
    args = ["sweep", "ctc-pseudo-label", "--preset", "tiny", "--kappas", "1,4", "--rule", "with"]
    one = runner.invoke(app, [*args, "--jobs", "1", "--out", str(tmp_path / "one")])
    two = runner.invoke(app, [*args, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert one.exit_code == 0, one.output
    assert two.exit_code == 0, two.output
    exp = "ctc-pseudo-label"
    thresholds = []
    for root in ("one", "two"):
        hp = json.loads((tmp_path / root / exp / "tiny-k4-rule-s0" / "hparams.json").read_text())
        thresholds.append(json.dumps(hp, sort_keys=True).count('"start_wer_threshold": null'))
    assert thresholds == [0, 0]  # a threshold was read, not the step-count fallback
    for n in ("tiny-k1-rule-s0", "tiny-k4-rule-s0"):
        a, b = (rows_without_wall_clock(tmp_path / root / exp / n) for root in ("one", "two"))
        assert a == b, n


def test_runs_others_wait_for_are_offered_first():
    assert P.start_order(None, 3) == [0, 1, 2]
    # two seeds: baseline 0 with runs 1-2, baseline 3 with runs 4-5; both baselines before any other run
    assert P.start_order([None, 0, 0, None, 3, 3], 6) == [0, 3, 1, 2, 4, 5]


def test_follow_up_work_is_done_by_the_workers_and_its_errors_are_reported(tmp_path, monkeypatch):
    """Each finished run's follow-up work runs in a worker before the sweep returns; an error in it is
    a line of output, not a failed sweep (the caller does that work again itself)."""
    from pathlib import Path

    from rich.console import Console

    from emarule.analysis import sweep
    from emarule import tasks
    from emarule.cli.main import EmaRule, resolve

    _one_thread(monkeypatch)
    runs = sweep.plan_runs([1.0, 2.0], ["exponential"], 2)

    def follow_up(i, run_dir):
        return [(f"mark {run_dir.name}", Path.touch, (run_dir / "followed",)),
                (f"fail {run_dir.name}", Path.mkdir, (run_dir / "no" / "such",))]

    console = Console(record=True, width=1000)
    def resolve_run(k, ema, baseline):
        return resolve("byol-r18", None, "tiny", [], repr(k), None, ema is None, ema and EmaRule(ema),
                       "constant" if baseline else None)

    done = sweep.execute(console, runs, resolve_run, tmp_path, tasks, jobs=2, follow_up=follow_up)
    out = console.export_text()
    assert len(done) == 4
    for d in done:
        assert (Path(d["run"]) / "followed").is_file()
    assert out.count("it is done again after the runs") == 4 and "FileNotFoundError" in out


def test_a_run_that_diverges_in_a_worker_is_done_with_its_message(monkeypatch):
    # Side by side, as one at a time (test_sweep): a diverged run is an answer, and the others go on.
    from dataclasses import dataclass

    from emarule import tasks
    from emarule.analysis.sweep import DIVERGED_KEY
    from emarule.errors import TrainingDiverged

    def diverge(ctx):
        print("epoch 1")
        raise TrainingDiverged("the loss became non-finite after epoch 2")

    monkeypatch.setattr(tasks, "run_task", diverge)
    monkeypatch.setattr(P, "_stopping", False)
    @dataclass
    class Ctx:
        quiet: bool = False

    status, result, _, output = P._train(Ctx(), None, 1)
    assert status == "done" and result == {DIVERGED_KEY: "the loss became non-finite after epoch 2"}
    assert output.startswith("epoch 1") and "diverged: the loss became non-finite" in output
