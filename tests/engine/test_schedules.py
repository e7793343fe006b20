"""Learning-rate schedules in epochs: shapes at chosen epochs, scaled by κ through the scaling core."""

import math

import pytest

from emarule.errors import UserError
from emarule.scaling import scale
from emarule.engine.schedules import Schedule, from_spec


def spec(**schedule):
    opt = schedule.pop("optimizer", {"name": "sgd", "lr": 0.1, "momentum": 0.9})
    return {"name": "s", "batch": {"size": 256}, "optimizer": opt, "ema": {"momentum": 0.99},
            "schedule": schedule}


def test_cosine_with_warmup_at_chosen_epochs():
    s = from_spec(spec(kind="cosine", epochs=100, warmup_epochs=10, min_lr=0.001), dataset_size=1000)
    peak, floor = 0.1, 0.001
    assert s.shape(0, peak, floor) == 0.0
    assert s.shape(5, peak, floor) == pytest.approx(0.05)
    assert s.shape(10, peak, floor) == pytest.approx(peak)
    assert s.shape(55, peak, floor) == pytest.approx((peak + floor) / 2)
    assert s.shape(100, peak, floor) == pytest.approx(floor)
    t = (32.5 - 10) / 90
    assert s.shape(32.5, peak, floor) == pytest.approx(floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def test_multistep_after_warmup():
    s = from_spec(spec(kind="multistep", epochs=90, warmup_epochs=5, milestones_epochs=[30, 60, 80], gamma=0.1), 1000)
    assert s.shape(2.5, 0.4) == pytest.approx(0.2)
    assert s.shape(29.99, 0.4) == pytest.approx(0.4)
    assert s.shape(30, 0.4) == pytest.approx(0.04)
    assert s.shape(61, 0.4) == pytest.approx(0.004)
    assert s.shape(85, 0.4) == pytest.approx(0.0004)


def test_constant_with_and_without_warmup():
    assert from_spec(spec(kind="constant", epochs=3), 10).shape(0, 0.3) == 0.3
    s = from_spec(spec(kind="constant", epochs=3, warmup_epochs=1), 10)
    assert s.shape(0.25, 0.3) == pytest.approx(0.075)
    assert s.shape(2, 0.3) == 0.3


def test_step_counted_spec_converts_through_base_batch():
    # 1000 base steps × 256 samples over 25 600 samples = 10 epochs; 100 warm-up steps = 1 epoch
    s = from_spec(spec(kind="constant", total_steps=1000, warmup_steps=100), dataset_size=25_600)
    assert s.total_epochs == pytest.approx(10.0)
    assert s.warmup_epochs == pytest.approx(1.0)


@pytest.mark.parametrize("kappa", [0.5, 2, 4])
def test_lr_scaled_by_the_plan_for_sgd_and_adam(kappa):
    sgd = spec(kind="cosine", epochs=10, warmup_epochs=2, min_lr=0.01)
    s = from_spec(sgd, 1000)
    base, scaled = scale(sgd, 1.0), scale(sgd, kappa)
    for epoch in (1.0, 2.0, 6.0, 10.0):
        assert s.lr(epoch, scaled) == pytest.approx(kappa * s.lr(epoch, base))
    adam = spec(kind="cosine", epochs=10, warmup_epochs=2, min_lr=0.01,
                optimizer={"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8})
    s = from_spec(adam, 1000)
    for epoch in (1.0, 6.0, 10.0):
        assert s.lr(epoch, scale(adam, kappa)) == pytest.approx(math.sqrt(kappa) * s.lr(epoch, scale(adam, 1.0)))


def test_schedule_shape_is_independent_of_kappa_in_epochs():
    """Warm-up ends at the same epoch at every κ (time is samples seen, not steps)."""
    sp = spec(kind="cosine", epochs=10, warmup_epochs=2, min_lr=0.0)
    s = from_spec(sp, 1000)
    for kappa in (1, 8):
        p = scale(sp, kappa)
        assert s.lr(2.0, p) == pytest.approx(p["optimizer.lr"])
        assert s.lr(1.999, p) < p["optimizer.lr"]


def test_missing_length_and_milestones_are_user_errors():
    with pytest.raises(UserError, match="schedule.epochs"):
        from_spec(spec(kind="cosine"), 100)
    with pytest.raises(UserError, match="milestones"):
        from_spec(spec(kind="multistep", epochs=10), 100)
    with pytest.raises(UserError):
        Schedule("linear", 10, 0).shape(5, 0.1)


def test_warmup_starts_at_the_rate_of_its_first_step_not_zero():
    """Step k of W warm-up steps takes peak·k/W (timm, MAE): the first step already learns."""
    s = from_spec({"batch": {"size": 10}, "schedule": {"kind": "cosine", "epochs": 10, "warmup_epochs": 1}}, 100)
    p = {"optimizer.lr": 0.5}
    step = 10 / 100  # one step of 10 samples in epochs
    lrs = [s.shape(k * step, 0.5, 0.0, step) for k in range(10)]
    assert lrs == pytest.approx([0.5 * (k + 1) / 10 for k in range(10)])
    assert s.lr(1.0, p, step) == pytest.approx(0.5)  # the warm-up is over: the cosine's start


def test_the_ema_momenta_come_from_the_plan_once_per_stage():
    from emarule.engine.schedules import EmaMomenta, momentum_key, momentum_log_name
    from emarule.scaling import plan as make_plan
    from emarule.scaling.progressive import parse
    from emarule.config.load import load_spec

    spec = load_spec("byol-r18")
    p = make_plan(spec, 8, "exponential", parse("step:30"))
    m = EmaMomenta.from_plan(p, ["ema"])
    rho = spec["ema"]["momentum"]
    assert m.at(1.0) == {"ema": pytest.approx(rho)} and m.at(8.0) == {"ema": pytest.approx(rho**8)}
    assert momentum_key("ema") == "ema.momentum" and momentum_key("0.999") == "ema.momentum/0.999"
    assert momentum_log_name("ema") == "ema_momentum" and momentum_log_name("0.999") == "ema_momentum/0.999"
    constant = EmaMomenta.from_plan(make_plan(spec, 4, None), ["ema"])
    assert constant.by_kappa == {4.0: {"ema": pytest.approx(rho)}}  # without the rule ρ stays as written
