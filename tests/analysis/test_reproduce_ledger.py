"""A reproduction's wall time, summed over the invocations of its command."""

import json
import time

import pytest

from emarule.analysis.reproduce import ledger as L

CMD = "emarule reproduce polyak --out /a/polyak"


def _t(wall, runs=30, reused=0):
    return {"wall_s": wall, "runs": runs, "reused": reused, "load_start": 1.0, "load_end": 2.0, "cpus": 2}


def test_invocations_of_one_command_add_up_and_others_do_not(tmp_path):
    assert L.record(tmp_path, CMD, _t(100.0), "verdict.json") == {"invocations": 1, "wall_s_total": 100.0,
                                                                  "trained": 30}
    L.record(tmp_path, "emarule reproduce polyak --seeds 7 --out /a/polyak", _t(50.0, 6), "verdict.json")
    # The same command with the root moved elsewhere counts; its reused runs are not counted as trained.
    got = L.record(tmp_path, "emarule reproduce polyak --out /b/polyak", _t(20.0, 30, 25), "verdict.json")
    assert got == {"invocations": 2, "wall_s_total": 120.0, "trained": 35}
    # A root whose path has a space is quoted in the command; it is still the same command.
    assert L.record(tmp_path, "emarule reproduce polyak --out '/c d/polyak'", _t(5.0, 30, 30),
                    "verdict.json")["invocations"] == 3
    assert len((tmp_path / L.LEDGER).read_text().splitlines()) == 4


def test_an_earlier_verdict_without_a_ledger_is_its_first_line(tmp_path):
    (tmp_path / "verdict.json").write_text(json.dumps({"command": "emarule reproduce polyak --out x",
                                                       "timing": _t(1200.0)}))
    got = L.record(tmp_path, CMD, _t(30.0, 30, 30), "verdict.json")
    assert got == {"invocations": 2, "wall_s_total": 1230.0, "trained": 30}


def test_a_damaged_ledger_line_is_skipped_not_fatal(tmp_path):
    (tmp_path / L.LEDGER).write_text(json.dumps({"command": CMD, **_t(10.0)}) + "\n{\"command\": \"emar\n")
    assert L.record(tmp_path, CMD, _t(5.0, 30, 30), "verdict.json")["wall_s_total"] == 15.0


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
    from emarule.cli.render import wide_console

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
    assert line["ended"] == error.__name__ and line["wall_s"] >= 0.05 and "runs" not in line
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
    assert line["ended"] == "UserError"
