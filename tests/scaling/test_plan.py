"""The one entry point: every scaled hyperparameter with its rule, per experiment."""

import math

import pytest

from emarule.errors import ScalingError, UserError
from emarule.scaling import kappa_from, plan, scale
from emarule.config.load import experiment_names, load_spec


@pytest.fixture(scope="module")
def vit():
    return load_spec("byol-vit")


def test_byol_vit_at_kappa_6(vit):
    p = scale(vit, 6)
    assert p["batch_size"] == 24576
    assert p["optimizer.lr"] == pytest.approx(1e-3 * math.sqrt(6))
    assert p["optimizer.betas"] == pytest.approx([0.4, 0.7])
    assert p["optimizer.eps"] == pytest.approx(1e-8 / math.sqrt(6))
    assert p["ema.momentum"] == pytest.approx(0.99**6)
    assert p["schedule.min_lr"] == pytest.approx(1e-6 * math.sqrt(6))
    assert p["optimizer.weight_decay"] == 0.3  # the recipe's rule is "none"
    assert "Adam" in p.values["optimizer.lr"].rule and "ρ^κ" in p.values["ema.momentum"].rule


def test_no_ema_rule_keeps_momentum_but_scales_the_rest(vit):
    p = scale(vit, 4, ema_rule=None)
    assert p["ema.momentum"] == 0.99 and "no EMA rule" in p.values["ema.momentum"].rule
    assert p["optimizer.lr"] == pytest.approx(2e-3)
    assert p.as_dict()["ema_rule"] is False


def test_linear_ema_rule_and_its_limit():
    s = load_spec("byol-r18")
    assert scale(s, 2, "linear")["ema.momentum"] == pytest.approx(1 - 2 * 0.008)
    with pytest.raises(ScalingError, match=r"ema.momentum.*linear.*125"):
        scale(s, 200, "linear")


def test_adam_beta_breaking_names_beta_value_and_largest_kappa(vit):
    with pytest.raises(ScalingError, match=r"optimizer.betas\[0\].*-0.1.*β=0.9.*largest valid κ is 10"):
        scale(vit, 11)


def test_sgd_recipe_scales_lr_linearly_and_keeps_heavy_ball():
    p = scale(load_spec("polyak-r50"), 4)
    assert p["optimizer.lr"] == pytest.approx(1.6)
    assert p["optimizer.momentum"] == 0.9
    assert p["ema.momentum"] == pytest.approx(0.9999**4)
    assert p["schedule.milestones_epochs"] == [30, 60, 80]


def test_lars_is_flagged_without_guarantee():
    p = scale(load_spec("byol-r50-lars"), 8)
    assert p["optimizer.lr"] == pytest.approx(38.4)  # 8 × 4.8, BYOL's 300-epoch lr at B = 4096
    assert "no SDE guarantee" in p.values["optimizer.lr"].rule


def test_lamb_is_sqrt_and_empirical():
    s = load_spec("byol-vit", overrides=["optimizer.name=lamb"])
    p = scale(s, 4)
    assert p["optimizer.lr"] == pytest.approx(2e-3) and "empirical" in p.values["optimizer.lr"].rule
    assert p["optimizer.betas"] == [0.9, 0.95]


def test_rmsprop_scales_alpha():
    s = load_spec("byol-vit", overrides=["optimizer.name=rmsprop", "optimizer.alpha=0.99"])
    assert scale(s, 5)["optimizer.alpha"] == pytest.approx(0.95)


@pytest.mark.parametrize("rule,expected", [
    ("none", 0.04), ("linear", 0.16), ("sqrt", 0.08), ("auto", 0.08), ("uncoupled", 1 - 0.96**4),
])
def test_weight_decay_rules_on_adamw(rule, expected):
    s = load_spec("dino-vit", overrides=[f"optimizer.weight_decay_rule={rule}"])
    assert scale(s, 4)["optimizer.weight_decay"] == pytest.approx(expected)


def test_weight_decay_auto_on_sgd_is_unchanged():
    s = load_spec("polyak-r50", overrides=["optimizer.weight_decay_rule=auto"])
    assert scale(s, 8)["optimizer.weight_decay"] == pytest.approx(1e-4)


def test_step_counted_durations_divide_and_epochs_stay():
    p = scale(load_spec("ctc-pseudo-label"), 4)
    assert p["schedule.total_steps"] == 125000
    assert p["schedule.warmup_steps"] == 16000
    assert p["pseudo_label.pretrain_steps"] == 5000
    assert p["ema.start_steps"] == 4750
    assert p["specaug.start_steps"] == 1250
    q = scale(load_spec("byol-r18"), 4)
    assert q["schedule.epochs"] == 100 and q["schedule.warmup_epochs"] == 20


def test_dynamic_batch_in_seconds():
    s = load_spec("ctc-polyak")
    k = kappa_from(s, None, 4640)
    assert k == 2
    p = scale(s, k)
    assert p.values["batch_size"].unit == "seconds" and p["batch_size"] == 4640
    assert p["optimizer.betas"] == pytest.approx([0.99, 0.998])


def test_batchnorm_and_center_momenta_unscaled_unless_asked():
    s = load_spec("polyak-r50")
    assert scale(s, 4)["norm.bn_momentum"] == 0.9
    scaled = scale(load_spec("polyak-r50", overrides=["norm.bn_scale=true"]), 4)
    assert scaled["norm.bn_momentum"] == pytest.approx(0.9**4)
    assert scaled["norm.bn_torch_momentum"] == pytest.approx(1 - 0.9**4)  # torch's convention: 1 − ρ
    assert scale(load_spec("polyak-r50", overrides=["norm.bn_scale=true"]), 4, None)["norm.bn_momentum"] == 0.9
    d = load_spec("dino-vit", overrides=["dino.center_scale=true"])
    assert scale(d, 2)["dino.center_momentum"] == pytest.approx(0.81)
    assert scale(load_spec("dino-vit"), 2)["dino.center_momentum"] == 0.9


def test_rounding_warnings_in_low_precision():
    s = load_spec("ctc-polyak", overrides=["ema.dtype=bfloat16"])
    assert any("rounds to 1.0 in bfloat16" in w for w in scale(s, 1).warnings)
    assert not scale(load_spec("ctc-polyak"), 1).warnings  # float32 holds 0.99995
    tiny = scale(load_spec("byol-r18"), 1e5)  # 0.992^(1e5) underflows to 0 in float64 already
    assert "ema.momentum scales from 0.992 to 0: the EMA is a plain copy of the model" in " ".join(tiny.warnings)
    small = scale(load_spec("byol-r18", overrides=["ema.dtype=bfloat16"]), 2e4)  # 0.992^(2e4) ≈ 1.7e-70
    assert any("ema.momentum = 1.71e-70 rounds to 0.0 in bfloat16" in w for w in small.warnings), small.warnings


@pytest.mark.parametrize("name", experiment_names())
def test_every_spec_plans_at_several_kappas(name):
    s = load_spec(name)
    for k in (0.5, 1, 2, 4):
        p = plan(s, k)
        assert p["batch_size"] == pytest.approx(k * s["batch"]["size"])
        assert "ema.momentum" in p.values


def test_kappa_from_rejects_both_and_bad_values(vit):
    with pytest.raises(UserError):
        kappa_from(vit, 2, 8192)
    with pytest.raises(UserError):
        kappa_from(vit, None, -5)
    assert kappa_from(vit, None, 8192) == 2


def test_plan_json_shape(vit):
    d = plan(vit, 6).as_dict()
    assert set(d) >= {"experiment", "kappa", "ema_rule", "hyperparameters"}
    hp = d["hyperparameters"]
    for key in ("batch_size", "ema.momentum", "optimizer.lr", "optimizer.betas", "optimizer.eps",
                "optimizer.weight_decay", "schedule.warmup_epochs"):
        assert set(hp[key]) >= {"base", "scaled", "rule"}
    assert hp["optimizer.betas"]["scaled"] == [0.4, 0.7]  # float noise rounded away
    assert [s["kappa"] for s in d["stages"]] == [1, 6]  # the spec's step at epoch 60


def test_momentum_after_transition_is_the_literal_rho_of_every_later_stage(vit):
    """App. H's ablation: the step to κ = 6 at epoch 60, then ρ as written, no rule applied."""
    s = load_spec("byol-vit", overrides=["ema.momentum_after_transition=0.95"])
    for rule in ("exponential", None):
        p = plan(s, 6, rule)
        (_, first), (_, after) = p.stages
        assert first["ema.momentum"] == 0.99 and after["ema.momentum"] == 0.95
        assert p.for_kappa(6)["ema.momentum"] == 0.95 and "as is" in after.values["ema.momentum"].rule
    waterfall = plan(s, 6, progressive={"kind": "incremental", "start_epoch": 60, "delta_batch": 3072,
                                        "every_epochs": 60, "from_kappa": 0.75})
    rhos = [q["ema.momentum"] for _, q in waterfall.stages]
    assert rhos[0] == pytest.approx(0.99**0.75) and set(rhos[1:]) == {0.95}
    assert plan(vit, 6).stages[1][1]["ema.momentum"] == pytest.approx(0.99**6)  # unset: the rule
    constant = plan(s, 6, progressive={"kind": "constant"})
    assert constant["ema.momentum"] == pytest.approx(0.99**6) and "no effect" in " ".join(constant.warnings)
