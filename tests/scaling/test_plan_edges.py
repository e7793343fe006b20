"""The plan at the edges of κ: exact zeros at κ = 1/(1 − β), values that round to 1, step counts and
other values past float64's range, repeated EMAs, the rounding warning's fix, a spec's batch_multiple."""

import math

import pytest

from emarule import scale as api_scale
from emarule.config.load import load_spec
from emarule.errors import ScalingError
from emarule.scaling import plan, rules, scale


def test_beta_at_kappa_one_over_one_minus_beta_is_exactly_zero():
    p = scale(load_spec("byol-vit"), 10)  # betas (0.9, 0.95): 1 − 10·0.1 is 0, not float noise 2.2e-16
    assert p["optimizer.betas"] == [0.0, 0.5]
    assert p.as_dict()["hyperparameters"]["optimizer.betas"]["scaled"] == [0.0, 0.5]
    for betas, kappa in (("[0.999,0.999]", 1000), ("[0.95,0.999]", 20)):
        s = load_spec("byol-vit", overrides=[f"optimizer.betas={betas}"])
        assert scale(s, kappa)["optimizer.betas"][0] == 0.0
    assert scale(load_spec("byol-r18"), 125, "linear")["ema.momentum"] == 0.0  # 1 − 125·0.008


def test_just_past_the_largest_kappa_names_it():
    s = load_spec("byol-vit", overrides=["optimizer.betas=[0.999,0.999]"])
    with pytest.raises(ScalingError, match=r"= -1e-06 at κ=1000.001 for β=0.999.*largest valid κ is 1000$"):
        scale(s, 1000.001)


@pytest.mark.parametrize("name,rule,needle", [
    # both betas round to 1; the bound named is the larger β's, which the smaller meets too
    ("ctc-pseudo-label", "exponential", r"optimizer.betas\[1\]: 1 − κ\(1 − β\) for β=0.999 rounds to 1 at "
                                         r"κ=1e-15 .* use κ ≥ 2.22e-13"),
    ("byol-r18", "linear", r"ema.momentum: the linear EMA rule 1 − κ\(1 − ρ\) rounds to 1 at κ=1e-15 .* "
                           r"use κ ≥ 2.78e-14"),
])
def test_a_linear_rule_that_rounds_to_one_names_the_smallest_kappa(name, rule, needle):
    with pytest.raises(ScalingError, match=needle):
        scale(load_spec(name), 1e-15, rule)


def test_the_named_smallest_kappa_works_and_float64_is_used_to_its_last_step():
    assert scale(load_spec("byol-r18"), 2.78e-14, "linear")["ema.momentum"] < 1.0
    # κ(1 − ρ) = 8e-17 is past half a step below 1 (2^-54 ≈ 5.6e-17): 1 − 2^-53, not 1
    assert scale(load_spec("byol-r18"), 1e-14, "linear")["ema.momentum"] == 1.0 - 2.0**-53
    assert scale(load_spec("ctc-pseudo-label"), 2.22e-13)["optimizer.betas"][1] < 1.0


def test_step_counts_past_float64_name_the_key_and_the_smallest_kappa():
    with pytest.raises(ScalingError, match=r"schedule.total_steps: 1000 / κ overflows at κ=1e-310; the smallest "
                                           r"usable κ is 1e-305"):
        api_scale({"batch": {"size": 256}, "schedule": {"total_steps": 1000}}, 1e-310)
    with pytest.raises(ScalingError, match="overflows"):
        scale(load_spec("parabola"), 1e-320)
    assert rules.steps(1000, 1e-305) == int(1000 / 1e-305)


@pytest.mark.parametrize("overrides", [["optimizer.lr=1e10"],
                                       ["optimizer.lr=1e10", "optimizer.weight_decay_rule=auto"]])
def test_a_scaled_value_past_float64_is_refused(overrides):
    with pytest.raises(ScalingError, match=r"optimizer.lr: 1e\+10 scales to inf at κ=1e\+300.*past float64's range"):
        scale(load_spec("byol-r18", overrides=overrides), 1e300)


def test_every_scaled_value_is_finite_at_a_large_kappa():
    p = scale(load_spec("byol-r18"), 1e300)
    assert all(math.isfinite(x) for v in p.values.values()
               for x in (v.scaled if isinstance(v.scaled, list) else [v.scaled]))


@pytest.mark.parametrize("also", ["ema.also=[0.9, 0.9]", "ema.also=[0.992]"])
def test_a_repeated_ema_momentum_is_refused(also):
    with pytest.raises(ScalingError, match=r"ema.also\[\d\]: 0.9\d* is already kept"):
        scale(load_spec("byol-r18", overrides=[also]), 2)


def test_rounds_to_one_asks_for_a_larger_kappa():
    w = " ".join(scale(load_spec("polyak-r50", overrides=["ema.dtype=bfloat16"]), 2).warnings)
    assert "rounds to 1.0 in bfloat16" in w and "keep it in float32 or use a larger κ" in w
    assert "smaller κ" not in w
    w32 = " ".join(scale(load_spec("polyak-r50"), 1e-9).warnings)  # 0.9999^1e-9 is 1.0 in float32 already
    assert "rounds to 1.0 in float32" in w32 and "use a larger κ" in w32 and "keep it in float32" not in w32


def test_the_specs_batch_multiple_holds_for_a_command_line_ramp():
    s = load_spec("byol-r18", overrides=["progressive.batch_multiple=3"])
    p = plan(s, 4, progressive={"kind": "smooth", "start_epoch": 10, "end_epoch": 20})
    ramp = [st.batch_size for st, _ in p.stages][1:-1]
    assert ramp and all(b % 3 == 0 for b in ramp), ramp
    assert p.progressive["batch_multiple"] == 3
    assert plan(s, 4, progressive={"kind": "step", "epoch": 10}).progressive == {"kind": "step", "epoch": 10}
