"""`emarule sweep`: the run plan, bad arguments, and the tiny BYOL preset end to end."""

import json

import pytest
import torch
from typer.testing import CliRunner

from emarule.request import checks
from emarule.analysis import compare as C
from emarule.analysis import run_report as report
from emarule.analysis import sweep as S
from emarule.cli.main import app
from emarule.errors import UserError

runner = CliRunner()


def test_plan_runs_baseline_once_per_seed():
    runs = S.plan_runs([4, 1, 2], [S.RULES["with"], S.RULES["without"]], seeds=2)
    got = [(r.kappa, r.rule, r.seed, r.baseline) for r in runs]
    assert got == [(1.0, "exponential", 0, True), (2.0, "exponential", 0, False), (2.0, None, 0, False),
                   (4.0, "exponential", 0, False), (4.0, None, 0, False),
                   (1.0, "exponential", 1, True), (2.0, "exponential", 1, False), (2.0, None, 1, False),
                   (4.0, "exponential", 1, False), (4.0, None, 1, False)]
    # κ=1 need not be listed; "without" alone makes a baseline without the rule (ρ^1 = ρ anyway).
    assert [(r.kappa, r.rule) for r in S.plan_runs([8], [None], 1)] == [(1.0, None), (8.0, None)]


def test_parse_rules():
    assert S.parse_rules("with,without") == ["exponential", None]
    assert S.parse_rules(" without , linear") == [None, "linear"]
    for bad in ("", "both", "with,maybe", "with,,without", "with,", " without , linear,without"):  # a repeat too
        with pytest.raises(UserError):
            S.parse_rules(bad)


@pytest.mark.parametrize("args,needle", [
    (["--kappas", "1,x"], "--kappas must be a number"),
    (["--kappas", "0,2"], "must be finite and > 0"),
    (["--rule", "sometimes"], "--rule 'sometimes'"),
    (["--seeds", "0"], "--seeds must be ≥ 1"),
    (["--set", "model.nope=1"], "unknown key"),
    (["--metric", "top5"], "--metric 'top5'"),
    (["--kappas", "1,2.3"], "κ=2.3 gives a batch of 73.6 samples"),
    # a κ a hair from a whole batch is printed with the digits that make it one (not "κ=2 gives a batch of 64")
    (["--kappas", "2,2.0000001"], "κ=2.0000001 gives a batch of 64.0000032 samples"),
    (["--data", "/tmp"], "uses bundled data"),
])
def test_bad_arguments_fail_before_training(tmp_path, args, needle):
    res = runner.invoke(app, ["sweep", "byol-r18", "--preset", "tiny", "--out", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output
    assert not any(tmp_path.iterdir())  # nothing was run


def test_linear_rule_out_of_range_fails_before_any_run(tmp_path):
    # 1 − κ(1 − ρ) < 0 at ρ = 0.97, κ = 40: the whole sweep is refused up front.
    res = runner.invoke(app, ["sweep", "byol-r18", "--preset", "tiny", "--kappas", "2,40", "--rule", "linear",
                              "--out", str(tmp_path)])
    assert res.exit_code == 2 and "linear EMA rule" in res.output
    assert not any(tmp_path.iterdir())


def test_sweep_tiny_kappas_1_2_end_to_end(tmp_path):
    torch.set_num_threads(1)
    res = runner.invoke(app, ["sweep", "byol-r18", "--preset", "tiny", "--kappas", "1,2", "--rule", "with,without",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    root = tmp_path / "byol-r18"
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert names == ["tiny-k1-rule-s0", "tiny-k2-norule-s0", "tiny-k2-rule-s0"]
    for n in names:
        h = json.loads((root / n / "hparams.json").read_text())
        assert h["seed"] == 0 and h["kappa"] == (1 if n.startswith("tiny-k1") else 2)
        # every run draws its own figures and prints its summary
        figures = sorted(p.name for p in (root / n / "figures").iterdir())
        assert figures == ["eval.png", "loss.png", "schedules.png"], figures
        assert f"run finished: {root / n}" in res.output
    assert res.output.count("\n  wall time:") == 3 and res.output.count("\n  figures: ") == 3
    # `sweep --metric` is checked against checks.TASK_METRICS before training: it must hold what BYOL logs.
    logged = {k for line in (root / names[0] / "metrics.jsonl").read_text().splitlines()
              for k in json.loads(line) if C.is_metric(k)}
    declared = {*checks.LOOP_METRICS, *checks.TASK_METRICS["byol"]}
    assert {report.base_metric(k) for k in logged} <= declared, logged
    h = json.loads((root / "tiny-k2-norule-s0" / "hparams.json").read_text())
    assert h["ema_rule"] is False or h["ema_rule"] is None
    assert (root / "compare-probe_top1.png").exists() and (root / "compare-byol_loss.png").exists()
    out = res.output
    assert "[1/3]" in out and "[3/3]" in out and "mean |Δ|" in out and "total wall time" in out
    assert out.index("tiny-k2-rule-s0") < out.index("tiny-k2-norule-s0")
    # The same command again keeps the finished runs (each is resumed, and returns at once).
    before = (root / "tiny-k2-rule-s0" / "metrics.jsonl").read_text()
    res = runner.invoke(app, ["sweep", "byol-r18", "--preset", "tiny", "--kappas", "2", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "resuming" in res.output and (root / "tiny-k2-rule-s0" / "metrics.jsonl").read_text() == before


def _toy_sweep(tmp_path, spec, *args):
    from engine_util import write_spec

    path = write_spec(tmp_path, spec, "sweep.yaml")
    return runner.invoke(app, ["sweep", "--spec", str(path), "--out", str(tmp_path / "sw"), *args])


def test_a_batch_larger_than_the_data_fails_before_the_baseline_trains(tmp_path):
    from engine_util import toy_spec

    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 1}), "--kappas", "1,16")  # 16 × 16 > 128 samples
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "the batch κB = 256 is larger than the training set (128 samples)" in lines[0]
    assert not (tmp_path / "sw").exists()


def test_a_run_made_with_other_settings_fails_before_the_baseline_trains(tmp_path):
    from engine_util import toy_spec

    torch.set_num_threads(1)
    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 1}), "--kappas", "2", "--rule", "with")
    assert res.exit_code == 0, res.output
    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 2}), "--kappas", "2", "--rule", "with")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "was made with other settings (spec.schedule.epochs differ)" in lines[0]
    assert "--resume" not in lines[0] and "give the sweep a new --out" in lines[0]


def test_a_record_edited_after_the_run_is_said_to_be_edited_not_made_otherwise(tmp_path):
    """The sweep checks hparams.json before anything trains. Where the file names other settings but the
    checkpoint's copy names the sweep's, the run was made with them: the line says the file was edited (and how
    to put it back), rather than sending the user to a new --out that would train the run again."""
    import json

    from engine_util import toy_spec

    torch.set_num_threads(1)
    spec = toy_spec(**{"schedule.epochs": 1})
    assert _toy_sweep(tmp_path, spec, "--kappas", "2", "--rule", "with").exit_code == 0
    (hp,) = (tmp_path / "sw").glob("*/k2-*/hparams.json")
    record = json.loads(hp.read_text())
    record["fingerprint"]["spec"]["schedule"]["epochs"] = 2
    hp.write_text(json.dumps(record))
    res = _toy_sweep(tmp_path, spec, "--kappas", "2", "--rule", "with")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and f"{hp} was edited after the run wrote it (fingerprint.spec.schedule.epochs differ" \
        in lines[0], lines
    assert "put back the file the run wrote" in lines[0]
    # made with other settings indeed (the sweep's spec changed): the line the sweep gave before
    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 2}), "--kappas", "2", "--rule", "with")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "was made with other settings" in lines[0], lines


def test_a_run_whose_checkpoint_was_deleted_is_kept_as_its_records_if_it_ended_and_refused_if_not(tmp_path):
    from engine_util import toy_spec

    torch.set_num_threads(1)
    spec = toy_spec(**{"schedule.epochs": 1})
    assert _toy_sweep(tmp_path, spec, "--kappas", "2", "--rule", "with").exit_code == 0
    (run,) = [p.parent for p in (tmp_path / "sw").rglob("checkpoint.pt") if "k2-" in p.parent.name]
    (run / "checkpoint.pt").unlink()
    record = {n: (run / n).read_bytes() for n in ("hparams.json", "metrics.jsonl")}
    res = _toy_sweep(tmp_path, spec, "--kappas", "2", "--rule", "with")
    assert res.exit_code == 0, res.output
    assert "1 of the 2 runs ended before and kept only their records" in " ".join(res.output.split()), res.output
    assert {n: (run / n).read_bytes() for n in record} == record and not (run / "checkpoint.pt").exists()
    rows = record["metrics.jsonl"].decode().splitlines()  # killed half-way: its log stops before its end
    (run / "metrics.jsonl").write_text("\n".join(rows[: len(rows) // 2]) + "\n")
    cut = (run / "metrics.jsonl").read_bytes()
    res = _toy_sweep(tmp_path, spec, "--kappas", "2", "--rule", "with")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "whose checkpoint is gone and whose log stops before its end" in lines[0], lines
    assert f"delete {run}" in lines[0] and (run / "metrics.jsonl").read_bytes() == cut


def test_two_kappas_that_name_the_same_run_fail_before_the_baseline_trains(tmp_path):
    # Run names keep κ to 6 significant digits: κ=1.0000001 would resume the baseline's directory.
    from engine_util import toy_spec

    spec = toy_spec(**{"schedule.epochs": 1, "batch.size": 10_000_000})  # κ=1.0000001 makes a whole batch
    res = _toy_sweep(tmp_path, spec, "--kappas", "1.0000001", "--rule", "with")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "κ=1.0 and κ=1.0000001 both make the run" in lines[0], res.output
    assert not (tmp_path / "sw").exists()


def test_a_diverging_run_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    from emarule import tasks
    from emarule.errors import TrainingDiverged
    from engine_util import toy_spec

    torch.set_num_threads(1)
    real = tasks.run_task

    def run_task(ctx):
        result = real(ctx)
        if ctx.kappa != 2:
            return result
        log = ctx.out / "metrics.jsonl"  # as if its loss had become nan half-way
        lines = log.read_text().splitlines()
        log.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
        raise TrainingDiverged("loss became nan after epoch 1; stopped: lower the learning rate or κ")

    monkeypatch.setattr(tasks, "run_task", run_task)
    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 2}), "--kappas", "2,4", "--rule", "with")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "  diverged: loss became nan after epoch 1" in out and "[3/3]" in out  # κ=4 trained after it
    assert (tmp_path / "sw" / "toy" / "k4-rule-s0" / "checkpoint.pt").is_file()
    row = next(x for x in out.splitlines() if "k2-rule-s0" in x and "stopped early" in x)
    assert row.count("∞") == 2  # compare: max and mean |Δ|


def test_a_kept_run_made_with_other_settings_is_one_line_for_a_sweep(tmp_path):
    from engine_util import toy_spec

    torch.set_num_threads(1)
    assert _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 1}), "--kappas", "2", "--rule", "with").exit_code == 0
    for ck in (tmp_path / "sw").rglob("checkpoint.pt"):
        ck.unlink()
    res = _toy_sweep(tmp_path, toy_spec(**{"schedule.epochs": 2}), "--kappas", "2", "--rule", "with")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "was made with other settings (spec.schedule.epochs differ); give the sweep a new " \
        "--out or remove that run" in lines[0] and "--resume" not in lines[0], lines


def test_runs_side_by_side_are_the_runs_not_kept_each_waiting_for_its_own_seeds_baseline(tmp_path, monkeypatch):
    """`_run_all` hands `run_side_by_side` the runs that train, numbered among themselves: the waits, the
    follow-ups and the results are mapped back to the right run, and a kept baseline is waited for by none."""
    from types import SimpleNamespace

    from emarule.analysis import parallel

    runs = [S.SweepRun(1.0, "exponential", 0, True), S.SweepRun(2.0, "exponential", 0, False),
            S.SweepRun(2.0, None, 0, False), S.SweepRun(1.0, "exponential", 1, True),
            S.SweepRun(2.0, "exponential", 1, False)]

    class Plan(dict):
        warnings: list = []

    ctxs = [SimpleNamespace(out=tmp_path / f"run{i}", kappa=r.kappa, plan=Plan(batch_size=32))
            for i, r in enumerate(runs)]
    seen = {}

    def side_by_side(console, labels, sub, jobs, on_done, after=None, follow_up=None):
        seen.update(labels=labels, after=after, follow=[follow_up(j) for j in range(len(sub))])
        for j in range(len(sub)):
            on_done(j, {"steps": j}, 1.0, "")

    monkeypatch.setattr(parallel, "run_side_by_side", side_by_side)
    monkeypatch.setattr(parallel, "jobs_for", lambda jobs, n, world: 2)
    monkeypatch.setattr(report, "report", lambda out, wall: None)
    monkeypatch.setattr(report, "print_report", lambda console, r: None)
    monkeypatch.setattr(S, "compare_after", lambda *a, **k: [])
    monkeypatch.setattr(S, "print_summary", lambda console, done: None)
    console = SimpleNamespace(print=lambda *a, **k: None)
    done = S._run_all(console, runs, ctxs, None, None, jobs=2, follow_up=lambda i, d: (i, d.name),
                      kept=frozenset({0, 2}))  # seed 0's baseline and one of its runs kept
    assert seen["labels"] == ["run1", "run3", "run4"]
    assert seen["after"] == [None, None, 1]  # run1's baseline is kept; run4 waits for run3, its seed's baseline
    assert seen["follow"] == [(1, "run1"), (3, "run3"), (4, "run4")]
    assert [(d["run"], d["result"]) for d in done] == [(str(tmp_path / f"run{i}"), r) for i, r in enumerate(
        [{}, {"steps": 0}, {}, {"steps": 1}, {"steps": 2}])]
