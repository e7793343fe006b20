"""`sweep --metric` is checked whole before anything trains (emarule.request.checks.metric): the names it accepts are
the names a run logs, EMA prefix, further-EMA and split suffixes included."""

import json

import pytest

from emarule.request import checks
from emarule.config.load import load_spec
from emarule.errors import UserError
from emarule import registry


def names(experiment, preset="tiny", sets=()):
    spec = load_spec(experiment, preset=preset, overrides=list(sets))
    return spec, checks.logged_metrics(spec, registry.lookup(spec["task"]))


@pytest.mark.parametrize("experiment,sets,accepted,refused", [
    ("byol-r18", (), ["loss", "probe_top1", "byol_loss"], ["ema_loss", "ema_probe_top1", "probe_top1/0.5"]),
    ("polyak-r50", (), ["ema_top1", "top1", "ema_val_loss"], ["ema_top1/0.5", "ema_train_top1", "top1/dev"]),
    ("polyak-r50", ("ema.also=[0.5]",), ["ema_top1/0.5", "ema_val_loss/0.5"], ["top1/0.5", "ema_top1/0.9"]),
    ("ctc-polyak", ("ema.also=[0.5]",), ["ema_wer", "wer/test-clean", "ema_wer/0.5/test-clean"],
     ["ema_wer/dev-clean", "ema_ctc_loss", "ema_pl_wer", "pl_wer/test-clean"]),
])
def test_names_a_run_logs_and_names_it_does_not(experiment, sets, accepted, refused):
    spec, logged = names(experiment, sets=sets)
    for m in accepted:
        assert m in logged, m
        checks.metric(spec, m)
    for m in refused:
        with pytest.raises(UserError, match=f"--metric '{m}'"):
            checks.metric(spec, m)


def test_every_evaluation_a_run_logs_is_a_name_the_check_accepts(tmp_path, monkeypatch):
    """What the registry declares (TaskSpec.ema_metrics) against what a tiny run writes, further EMA included."""
    from emarule.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(SystemExit) as e:
        main(["run", "polyak-r50", "--preset", "tiny", "--kappa", "2", "--set", "ema.also=[0.5]", "--out", "r"])
    assert e.value.code == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evaluated = {k for r in rows if r["kind"] == "eval" for k in r} - {"kind", "epoch", "step", "kappa",
                                                                       "samples_seen"}
    _, logged = names("polyak-r50", sets=("ema.also=[0.5]",))
    assert evaluated and evaluated <= logged, evaluated - logged
    assert {m for m in logged if m.startswith("ema_")} <= evaluated
