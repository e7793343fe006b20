"""Rules whose reading is easy to get wrong: weight decay that is an L2 term (Adam, RMSProp), the copy warning
at limits' κ_max, halves in step counts, and what a Progressive Scaling plan's step counts mean."""

import pytest

from emarule import scale as api_scale
from emarule.config.load import load_spec
from emarule.scaling import plan, rules, scale
from emarule.scaling.limits import limits


def _opt(name, **extra):
    return {"batch": {"size": 256}, "optimizer": {"name": name, "lr": 1e-3, "weight_decay": 0.1,
                                                  "weight_decay_rule": "auto", **extra}}


@pytest.mark.parametrize("name,extra", [("adam", {"betas": [0.9, 0.999], "eps": 1e-8}),
                                        ("rmsprop", {"alpha": 0.99, "eps": 1e-8})])
def test_auto_decay_of_an_l2_optimizer_is_unchanged(name, extra):
    p = scale(_opt(name, **extra), 4)
    assert p["optimizer.weight_decay"] == 0.1
    assert "L2 in the gradient" in p.values["optimizer.weight_decay"].rule


def test_auto_decay_of_adamw_follows_its_sqrt_lr():
    p = scale(_opt("adamw", betas=[0.9, 0.999], eps=1e-8), 4)
    assert p["optimizer.weight_decay"] == pytest.approx(0.2)  # κηλ/η̂ with η̂ = √κη
    assert api_scale(_opt("adamw", betas=[0.9, 0.999], eps=1e-8), 4)["optimizer.weight_decay"] == pytest.approx(0.2)


def test_rmsprop_momentum_is_reported_unchanged_with_no_known_rule():
    p = scale(_opt("rmsprop", alpha=0.99, momentum=0.9), 4)
    assert p["optimizer.momentum"] == 0.9 and "none is known" in p.values["optimizer.momentum"].rule


@pytest.mark.parametrize("n,kappa,expected", [(5, 2, 3), (7, 2, 4), (1000, 16, 63), (19000, 16, 1188)])
def test_halves_round_up_whatever_the_parity(n, kappa, expected):
    assert rules.steps(n, kappa) == expected


def test_a_step_count_that_is_not_whole_says_how_a_run_counts_it():
    s = load_spec("polyak-r50", preset="tiny", overrides=["schedule.warmup_epochs=null",
                                                          "schedule.warmup_steps=7"])
    v = scale(s, 2).values["schedule.warmup_steps"]
    assert v.scaled == 4 and "= 3.5, rounded (a run counts N × B of data seen)" in v.rule
    assert "rounded" not in scale(s, 7).values["schedule.warmup_steps"].rule  # 7 / 7 is whole


def test_the_copy_warning_starts_at_limits_kappa_max():
    lim = limits(0.9999, 1024)
    spec = load_spec("polyak-r50")
    below = " ".join(scale(spec, lim.kappa_max * 0.99).warnings)
    above = " ".join(scale(spec, lim.kappa_max * 1.01).warnings)
    assert "plain copy" not in below
    assert "plain copy" in above and "1 − ρ̂ rounds to 1.0 in float32" in above
    assert lim.kappa_max * 1.01 < lim.kappa_underflow  # the case the old check (ρ̂ == 0) missed


def test_a_progressive_plan_says_its_step_counts_are_the_last_stages():
    from typer.testing import CliRunner

    from emarule.cli.main import app

    out = CliRunner().invoke(app, ["plan", "byol-r18", "-k", "4", "--progressive", "step:30"]).output
    assert "Step counts above: N / κ at the last κ" in " ".join(out.split())
    assert "Step counts above" not in CliRunner().invoke(app, ["plan", "byol-r18", "-k", "4"]).output


def test_a_batch_that_is_not_whole_is_a_warning_in_the_plan():
    w = " ".join(scale(load_spec("byol-vit"), 7.3).warnings)
    assert "29900.8 samples" in w and "pass --batch-size N" in w
    assert not any("samples (κ ×" in x for x in scale(load_spec("byol-vit"), 6).warnings)
    assert not any("samples (κ ×" in x for x in scale(load_spec("ctc-polyak"), 1.3).warnings)  # seconds split freely


def test_a_one_stage_schedule_says_momentum_after_transition_does_nothing():
    s = load_spec("byol-vit", overrides=["progressive.from_kappa=6", "ema.momentum_after_transition=0.95"])
    p = plan(s, 6)
    assert len(p.stages) == 1 and any("no effect: this schedule runs one stage" in w for w in p.warnings)
    assert p["ema.momentum"] != 0.95
