"""CI smoke: a tiny κ sweep of every training family through `emarule reproduce`, arms included (one seed:
the plumbing, metric names and figure; the verdict maths and the 2-seed path are in test_reproduce.py and
test_reproduce_paired.py)."""

import json

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import rules as R

runner = CliRunner()


@pytest.mark.parametrize("family", ["polyak", "dino", "ctc-polyak", "ctc-pseudo-label", "byol-vit", "byol-r50-lars"])
def test_tiny_reproduction(tmp_path, family):
    import torch

    from emarule.config.load import load_spec
    from emarule.tasks import RUNNABLE_TASKS

    f = K.FAMILIES[family]
    assert load_spec(f.experiment)["task"] in RUNNABLE_TASKS
    torch.set_num_threads(1)
    res = runner.invoke(app, ["reproduce", family, "--preset", "tiny", "--seeds", "1", "--kappas", "1,2",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    v = json.loads((tmp_path / "verdict.json").read_text())
    assert v["family"] == family and v["timing"]["runs"] == 3 + len(f.arms)
    assert [a["name"] for a in v["arms"]] == [a.name for a in f.arms] and v["seeds"] == [0]
    assert v["optimizer_check"]["metric"] == f.target_metric.name
    assert {f.ema_metric.name, f.target_metric.name} <= {r["metric"] for r in v["settings"]}
    assert len(v["claims"]) >= len(f.claims)
    for c in v["claims"]:  # one seed: no spread and no interval, so no verdict either way
        assert c["verdict"] in (R.NOT_REPRODUCED, R.NOT_TESTABLE, R.NOT_MEASURED), c
        if c["verdict"] == R.NOT_MEASURED:
            assert c["why"] and c["effect"] is None, c
        else:
            assert R.NOT_REPRODUCED in (c["verdict"], c["verdict_if_applicable"]), c
            assert c["n"] == 1 and "no finite baseline spread" in c["rule"], c
    assert (tmp_path / "figures" / f"{family}.png").stat().st_size > 10_000
    assert "## Verdicts" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("family", [f.name for f in K.FAMILIES.values() if f.kind == "sweep"])
def test_default_kappas_scale_under_the_default_preset(family):
    """`emarule reproduce FAMILY` with its defaults must not stop half-way at a κ whose scaled optimizer
    settings are invalid (ctc-polyak's κ=8 needs the cpu preset's β1 ≥ 0.875)."""
    from emarule.scaling.plan import scale
    from emarule.config.load import load_spec

    f = K.FAMILIES[family]
    spec = load_spec(f.experiment, preset=f.preset)
    for kappa in f.kappas:
        for rule in ("exponential", None):
            scale(spec, kappa, rule)  # raises ScalingError on an invalid value


class _BeforeTraining(Exception):
    pass


@pytest.mark.parametrize("family", [f.name for f in K.FAMILIES.values() if f.kind == "sweep"])
def test_default_kappas_fit_the_tiny_preset(tmp_path, monkeypatch, family):
    """`emarule reproduce FAMILY --preset tiny` at the family's own κ (and arms) passes every check made
    before training, the batch at the largest κ against the tiny training set included: the CI preset
    runs the reproduction as a user types it. Stopped where training would start."""
    from emarule.analysis import sweep

    checked, real = [], sweep.check_before_training

    def check_then_stop(ctxs, build_parts):
        real(ctxs, build_parts)
        checked.append(len(ctxs))
        raise _BeforeTraining

    monkeypatch.setattr(sweep, "check_before_training", check_then_stop)
    res = runner.invoke(app, ["reproduce", family, "--preset", "tiny", "--seeds", "1", "--out", str(tmp_path)])
    assert isinstance(res.exception, _BeforeTraining), res.output
    assert checked and checked[0] == 1 + 2 * (len(K.FAMILIES[family].kappas) - 1) + len(K.FAMILIES[family].arms)
