"""Two parts of ModelEma's clock: the batches counted between the updates of `every > 1` survive a
state_dict round trip taken mid-cycle (the resumed EMA applies the same ρ and holds the same shadow as one
never interrupted), and timm's warm-up with `warmup_gamma`, by value and against timm's ModelEmaV3."""

import pytest
import torch
from torch import nn

from emarule.engine.ema import ModelEma


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def moved(model: nn.Module, k: int) -> nn.Module:
    """The model after step k: the weights move at every step, so a shadow that skipped one differs."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * (k + 1) * torch.ones_like(p))
    return model


def shadow(ema: ModelEma) -> list:
    return [p.clone() for p in ema.module.parameters()]


def make(model):
    # Three calls per update, each counting a batch of 32 at a base batch of 32: ρ = 0.9^3 per update.
    return ModelEma(model, 0.9, base_batch_size=32, every=3)


def run(ema, model, steps):
    return [ema.update(moved(model, k), batch_size=32) for k in steps]


@pytest.mark.parametrize("calls_before", [1, 2, 4, 5])
@pytest.mark.parametrize("form", ["state_dict", "checkpoint"])
def test_a_resume_mid_cycle_keeps_the_batches_counted_so_far(calls_before, form):
    whole_model = net()
    whole = make(whole_model)
    rhos = run(whole, whole_model, range(9))
    assert rhos == pytest.approx([1.0, 1.0, 0.729] * 3)  # the update averages over the 96 samples since the last

    model = net()
    first = make(model)
    before = run(first, model, range(calls_before))
    saved = first.state_dict() if form == "state_dict" else first.checkpoint()
    resumed = make(model)  # a new process: built from the model as it is, then loaded
    resumed.load_state_dict(saved)
    after = run(resumed, model, range(calls_before, 9))
    assert before + after == pytest.approx(rhos)
    assert resumed.updates == whole.updates == 3
    for a, b in zip(shadow(resumed), shadow(whole), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def timm_warmup(step, rho, gamma, power):
    """timm's ModelEmaV3.get_decay with use_warmup and update_after_step=0 (steps counted from 1)."""
    step = step - 1
    return 0.0 if step <= 0 else min(rho, 1 - (1 + step / gamma) ** -power)


@pytest.mark.parametrize("gamma,power", [(1.0, 0.75), (10.0, 0.75), (250.0, 2 / 3)])
def test_warmup_gamma_stretches_timms_warmup(gamma, power):
    # ρ(t) = 1 − (1 + t/γ)^−power at t base steps past the start, capped at ρ: a larger γ warms up slower.
    ema = ModelEma(net(), 0.999, base_batch_size=8, warmup_power=power, warmup_gamma=gamma)
    for t in (0, 1, 3, 10, 50, 400, 10_000):
        want = min(0.999, 1 - (1 + t / gamma) ** -power)
        assert ema.scheduled(8 * t) == pytest.approx(want, rel=1e-12, abs=1e-15), t
    assert ema.scheduled(8 * 10) < ModelEma(net(), 0.999, base_batch_size=8, warmup_power=power,
                                            warmup_gamma=gamma / 2).scheduled(8 * 10)


def test_warmup_gamma_counts_from_the_start_in_base_steps():
    # start_steps=1 is timm's update_after_step=0; at κ=4 one update spans 4 base steps, ρ to the 4th power.
    ema = ModelEma(net(), 0.999, base_batch_size=8, start_steps=1, warmup_power=0.75, warmup_gamma=10.0)
    model = net()
    for step in range(1, 60):
        assert ema.update(model, samples_seen=8 * step) == pytest.approx(
            timm_warmup(step, 0.999, 10.0, 0.75), rel=1e-12), step
    at4 = ModelEma(net(), 0.999, base_batch_size=8, start_steps=1, warmup_power=0.75, warmup_gamma=10.0)
    for step in range(4, 60, 4):
        assert at4.update(model, samples_seen=8 * step) == pytest.approx(
            timm_warmup(step, 0.999, 10.0, 0.75) ** 4, rel=1e-12), step


@pytest.mark.parametrize("gamma", [1.0, 10.0, 250.0])
def test_warmup_gamma_matches_timms_model_ema_v3(gamma):
    timm_utils = pytest.importorskip("timm.utils")
    model = net()
    theirs = timm_utils.ModelEmaV3(model, decay=0.9999, update_after_step=2, use_warmup=True, warmup_gamma=gamma,
                                   warmup_power=0.75)
    ours = ModelEma(model, 0.9999, base_batch_size=8, start_steps=3, warmup_power=0.75, warmup_gamma=gamma)
    for step in range(1, 200):
        assert ours.update(model, samples_seen=8 * step) == pytest.approx(theirs.get_decay(step), rel=1e-12), step
