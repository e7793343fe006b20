"""A reproduction's wall time, summed over the invocations of its command."""

import json
import time
from pathlib import Path

import pytest

from emarule.analysis.reproduce import ledger as L

CMD = "emarule reproduce polyak --out /a/polyak"


def _t(wall, runs=30, reused=0):
    return {"wall_s": wall, "runs": runs, "reused": reused, "load_start": 1.0, "load_end": 2.0, "cpus": 2}


def test_invocations_of_one_command_add_up_and_others_do_not(tmp_path):
    polyak = L.resolved("polyak")
    assert L.record(tmp_path, CMD, _t(100.0), polyak) == {"invocations": 1, "wall_s_total": 100.0, "trained": 30}
    L.record(tmp_path, "emarule reproduce polyak --seeds 7 --out /a", _t(50.0, 6), L.resolved("polyak", seeds=[7]))
    # The same command with the root moved elsewhere counts; its reused runs are not counted as trained.
    got = L.record(tmp_path, "emarule reproduce polyak --out /b/polyak", _t(20.0, 30, 25), polyak)
    assert got == {"invocations": 2, "wall_s_total": 120.0, "trained": 35}
    assert len((tmp_path / L.LEDGER).read_text().splitlines()) == 3


def test_a_line_without_its_arguments_is_its_command_texts(tmp_path):
    assert L.record(tmp_path, "not a reproduce command", _t(7.0))["invocations"] == 1
    assert L.record(tmp_path, "not a reproduce command", _t(1.0))["invocations"] == 2
    assert L.record(tmp_path, CMD, _t(1.0), L.resolved("polyak"))["invocations"] == 1


def test_judging_a_finished_root_again_keeps_one_judging_line(tmp_path):
    """An invocation that trained nothing replaces the command's previous one of that kind; training lines, an
    interrupted one and another command's judging line stay."""
    polyak = L.resolved("polyak")
    L.record(tmp_path, CMD, _t(3.0, 2, 0) | {"ended": "KeyboardInterrupt"}, polyak)  # trained 2 runs, then stopped
    L.record(tmp_path, CMD, _t(100.0, 30, 2), polyak)
    L.record(tmp_path, "emarule reproduce polyak --seeds 7 --out /a", _t(2.0, 6, 6), L.resolved("polyak", seeds=[7]))
    assert L.record(tmp_path, CMD, _t(5.0, 30, 30), polyak)["invocations"] == 3
    got = L.record(tmp_path, CMD, _t(6.0, 30, 30), polyak)
    assert got == {"invocations": 3, "wall_s_total": 109.0, "trained": 30}
    walls = [json.loads(s)["wall_s"] for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert walls == [3.0, 100.0, 2.0, 6.0]
    # a resumed invocation that trained some runs is history, not a judging: it stays
    assert L.record(tmp_path, CMD, _t(8.0, 30, 28), polyak)["invocations"] == 4
    assert L.record(tmp_path, CMD, _t(7.0, 30, 30), polyak)["invocations"] == 4


def test_a_damaged_ledger_line_is_skipped_not_fatal(tmp_path):
    (tmp_path / L.LEDGER).write_text(json.dumps({"command": CMD, **_t(10.0)}) + "\n{\"command\": \"emar\n")
    assert L.record(tmp_path, CMD, _t(5.0, 30, 30))["wall_s_total"] == 15.0


def _precision_resolver():
    from emarule.config.load import load_spec
    from emarule.scaling import plan

    def resolver(experiment, preset):
        def resolve_run(k, ema, baseline):
            s = load_spec(experiment, preset=preset, overrides=["precision_study.samples=64"])
            return s, 1.0, "exponential", None, plan(s, 1.0)
        return resolve_run

    return resolver


def _reproduce(root):
    from emarule.analysis.reproduce.command import reproduce
    from emarule.console import wide_console

    return reproduce(wide_console(quiet=True), "precision", preset=None, seeds=None, kappas=None, out=str(root),
                     data=None, resolver=_precision_resolver())


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_invocation_that_raises_still_counts_its_time(tmp_path, monkeypatch, error):
    import emarule.tasks

    def fail(ctx):
        time.sleep(0.05)
        raise error("stopped")

    monkeypatch.setattr(emarule.tasks, "run_task", fail)
    with pytest.raises(error):
        _reproduce(tmp_path)
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert line["ended"] == error.__name__ and line["wall_s"] >= 0.05
    assert line["runs"] == line["reused"] == 0  # it trained nothing
    assert line["command"].startswith("emarule reproduce precision")


def test_bad_input_raised_inside_a_reproduction_writes_no_line(tmp_path, monkeypatch):
    import emarule.tasks
    from emarule.errors import UserError

    def refuse(ctx):
        raise UserError("bad input")

    monkeypatch.setattr(emarule.tasks, "run_task", refuse)
    with pytest.raises(UserError):
        _reproduce(tmp_path)
    assert not (tmp_path / L.LEDGER).exists()


def test_a_runs_own_error_after_it_trained_still_counts_its_time(tmp_path, monkeypatch):
    # "cannot decode FILE" is a UserError too, but it comes after training began: its time is counted
    import emarule.tasks
    from emarule.engine.rundir import METRICS
    from emarule.errors import UserError

    def fail_after_training(ctx):
        ctx.out.mkdir(parents=True, exist_ok=True)
        (ctx.out / METRICS).write_text('{"epoch": 1}\n')
        raise UserError("cannot decode a file")

    monkeypatch.setattr(emarule.tasks, "run_task", fail_after_training)
    with pytest.raises(UserError):
        _reproduce(tmp_path)
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert line["ended"] == "UserError" and line["runs"] == 1 and line["reused"] == 0


def test_an_interrupted_invocation_records_the_runs_it_trained(tmp_path, monkeypatch):
    """Its runs are counted as trained here, so the invocation that resumes it does not make them reused."""
    import emarule.tasks
    from emarule.engine.rundir import METRICS

    old = tmp_path / "precision" / "old-run" / METRICS
    old.parent.mkdir(parents=True)
    old.write_text('{"epoch": 1}\n')  # a run finished before this invocation
    time.sleep(0.05)

    def train_then_stop(ctx):
        old.write_text('{"epoch": 1}\n')  # resumed, a finished run's log is rewritten as it was: not trained
        for name in ("a", "b"):
            (ctx.out.parent / name).mkdir(parents=True, exist_ok=True)
            (ctx.out.parent / name / METRICS).write_text('{"epoch": 1}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(emarule.tasks, "run_task", train_then_stop)
    with pytest.raises(KeyboardInterrupt):
        _reproduce(tmp_path)
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert line["ended"] == "KeyboardInterrupt" and line["runs"] == 2 and line["reused"] == 0
    assert line["args"] == {"family": "precision", "preset": "full", "seeds": None, "kappas": [], "headline": False,
                            "data": None}


@pytest.mark.parametrize("a, b, same", [
    ({"name": "polyak", "kappas": [2, 1]}, {"name": "polyak", "kappas": [1, 2]}, True),
    ({"name": "polyak", "preset": "cpu"}, {"name": "polyak"}, True),
    ({"name": "polyak", "seeds": [0, 1, 2, 3, 4]}, {"name": "polyak"}, True),  # 0-4, the default
    ({"name": "polyak", "seeds": [3, 1]}, {"name": "polyak", "seeds": [1, 3]}, True),
    ({"name": "polyak", "kappas": [0.5, 1, 2, 4]}, {"name": "polyak"}, True),
    ({"name": "polyak", "kappas": [1, 2, 4]}, {"name": "polyak"}, False),
    ({"name": "polyak", "headline": True}, {"name": "polyak", "headline": True, "kappas": [1, 2]},
     True),  # the headline's κ: 1 and its claim's 2
    ({"name": "precision", "preset": "full"}, {"name": "precision"}, True),
    ({"name": "polyak", "preset": "tiny"}, {"name": "polyak"}, False),
    ({"name": "polyak", "seeds": range(100, 105)}, {"name": "polyak"}, False),
    ({"name": "polyak", "headline": True}, {"name": "polyak"}, False),
    ({"name": "polyak", "data": "/d"}, {"name": "polyak"}, False),
    ({"name": "byol"}, {"name": "polyak"}, False),
])
def test_invocations_are_the_same_command_by_their_resolved_arguments(tmp_path, a, b, same):
    L.record(tmp_path, CMD, _t(100.0), L.resolved(**a))
    assert L.record(tmp_path, CMD, _t(20.0), L.resolved(**b))["invocations"] == (2 if same else 1)


def test_a_resumed_runs_training_time_is_the_sum_of_its_stretches(tmp_path):
    from emarule.analysis.reproduce.command import _logged_wall
    from emarule.engine.rundir import METRICS

    rows = [{"kind": "train", "wall_s": 3.9}, {"kind": "train", "wall_s": 7.96}, {"kind": "eval", "top1": 1.0},
            {"kind": "train", "wall_s": 0.52}, {"kind": "train", "wall_s": 0.72},  # resumed: its clock restarts
            {"kind": "train", "wall_s": 0.3}, {"kind": "train", "wall_s": 2.0}]  # and again
    (tmp_path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _logged_wall(tmp_path) == pytest.approx(7.96 + 0.72 + 2.0)
    (tmp_path / METRICS).write_text("")
    assert _logged_wall(tmp_path) == 0.0


def test_the_report_never_says_more_runs_were_trained_than_there_are():
    from emarule.analysis.reproduce.report import _total

    t = {"invocations": 4, "wall_s_total": 102.0, "runs": 4}
    assert _total(t | {"trained": 4}).endswith("that trained 4 of its 4 runs)")
    # a run whose directory was deleted is trained twice in the root's history
    assert _total(t | {"trained": 5}).endswith("that trained 4 of its 4 runs and 1 of them again)")


def test_a_killed_invocations_heartbeat_line_counts_its_time_and_runs(tmp_path):
    beat = L.Heartbeat(tmp_path, CMD, L.resolved("polyak"), time.monotonic() - 40.0, lambda: 2)
    beat.beat()
    beat.beat()  # each beat rewrites its own line, never adds one
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert line["ended"] == L.KILLED and line["runs"] == 2 and line["reused"] == 0
    assert 40.0 <= line["wall_s"] < 60.0 and line["token"] == beat.token
    # The invocation that resumes it reuses those 2 runs and trains the other 28.
    got = L.record(tmp_path, "emarule reproduce polyak --out /b/polyak", _t(10.0, 30, 2), L.resolved("polyak"))
    assert got["invocations"] == 2 and got["trained"] == 30
    assert got["wall_s_total"] == pytest.approx(line["wall_s"] + 10.0)


def test_an_invocations_own_line_replaces_its_heartbeat_line(tmp_path):
    L.record(tmp_path, CMD, _t(100.0))  # an earlier invocation's line stays
    beat = L.Heartbeat(tmp_path, CMD, None, time.monotonic(), lambda: 0)
    beat.beat()
    assert len((tmp_path / L.LEDGER).read_text().splitlines()) == 2
    got = L.record(tmp_path, CMD, _t(5.0, 30, 30), replaces=beat.token)
    lines = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert [e["wall_s"] for e in lines] == [100.0, 5.0] and not any("ended" in e or "token" in e for e in lines)
    assert got["invocations"] == 2 and got["wall_s_total"] == 105.0


def test_the_heartbeat_rewrites_until_stopped(tmp_path):
    path = tmp_path / L.LEDGER
    with L.Heartbeat(tmp_path, CMD, None, time.monotonic(), lambda: 1, interval=0.01):
        deadline = time.monotonic() + 10.0
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    after_stop = path.read_bytes()
    time.sleep(0.1)
    assert path.read_bytes() == after_stop  # no rewrite once stopped
    (line,) = [json.loads(s) for s in after_stop.decode().splitlines()]
    assert line["ended"] == L.KILLED and line["runs"] == 1


def test_each_run_that_ends_rewrites_the_line_at_once(tmp_path, monkeypatch):
    """A kill between two beats loses none of the runs that finished: the sweep pokes the line as each ends."""
    from cli_util import invoke

    lines = []
    poke = L.Heartbeat.poke

    def record_poke(self):
        poke(self)
        lines.append(json.loads((tmp_path / L.LEDGER).read_text().splitlines()[-1]))

    monkeypatch.setattr(L, "HEARTBEAT_S", 3600.0)  # no timed beat: every line below is a poke
    monkeypatch.setattr(L.Heartbeat, "poke", record_poke)
    res = invoke("reproduce", "polyak", "--preset", "tiny", "--seeds", "1", "--kappas", "1,2", "--jobs", "1",
                 "--out", tmp_path)
    assert res.exit_code == 0, res.output
    assert len(lines) >= 3 and [e["runs"] for e in lines] == list(range(1, len(lines) + 1))
    assert all(e["ended"] == L.KILLED for e in lines)
    (own,) = [json.loads(x) for x in (tmp_path / L.LEDGER).read_text().splitlines()]  # replaced by its own line
    assert "ended" not in own and own["runs"] == len(lines)


def test_bad_input_after_a_heartbeat_leaves_no_line(tmp_path, monkeypatch):
    import emarule.tasks
    from emarule.errors import UserError

    def refuse_late(ctx):
        time.sleep(0.3)  # long enough for several beats
        raise UserError("bad input")

    dropped = []

    def drop(root, token):
        dropped.append((root / L.LEDGER).read_text())  # what the beats had written
        drop_line(root, token)

    drop_line = L.drop
    monkeypatch.setattr(L, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(L, "drop", drop)
    monkeypatch.setattr(emarule.tasks, "run_task", refuse_late)
    with pytest.raises(UserError):
        _reproduce(tmp_path)
    assert len(dropped) == 1 and json.loads(dropped[0])["ended"] == L.KILLED
    assert not (tmp_path / L.LEDGER).exists()


def test_a_finished_invocation_leaves_one_line_whatever_its_beats(tmp_path, monkeypatch):
    import emarule.tasks

    run_task = emarule.tasks.run_task

    def slow(ctx):
        time.sleep(0.2)
        return run_task(ctx)

    monkeypatch.setattr(L, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(emarule.tasks, "run_task", slow)
    _reproduce(tmp_path)
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert "ended" not in line and "token" not in line and line["wall_s"] >= 0.2


KILLED_SCRIPT = """
import os, sys, time
import emarule.tasks
from emarule.analysis.reproduce import ledger
from emarule.engine.rundir import METRICS

sys.path.insert(0, sys.argv[2])
from test_reproduce_ledger import _reproduce

ledger.HEARTBEAT_S = 0.01

def killed(ctx):
    ctx.out.mkdir(parents=True, exist_ok=True)
    (ctx.out / METRICS).write_text('{"epoch": 1}\\n')
    time.sleep(0.5)
    os._exit(137)  # as SIGKILL does: no except, no finally

emarule.tasks.run_task = killed
_reproduce(sys.argv[1])
"""


def test_an_invocation_killed_outright_leaves_its_time_and_runs(tmp_path):
    import subprocess
    import sys

    here = str(Path(__file__).parent)  # the script reuses this module's `_reproduce`
    proc = subprocess.run([sys.executable, "-c", KILLED_SCRIPT, str(tmp_path), here], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr
    (line,) = [json.loads(s) for s in (tmp_path / L.LEDGER).read_text().splitlines()]
    assert line["ended"] == L.KILLED and line["runs"] == 1 and line["reused"] == 0
    assert 0.3 <= line["wall_s"] < 60.0
    assert line["command"].startswith("emarule reproduce precision")
