"""The model EMA against the naive formula ζ ← ρζ + (1 − ρ)θ, and the EMA Scaling Rule ρ → ρ^κ."""

import pytest
import torch
from torch import nn

from emarule.engine.ema import ModelEma


def net(bn: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(4, 6)] + ([nn.BatchNorm1d(6)] if bn else []) + [nn.Tanh(), nn.Linear(6, 3)]
    return nn.Sequential(*layers)


def perturb(model: nn.Module, scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def test_update_matches_naive_formula_over_many_steps():
    model = net()
    ema = ModelEma(model, 0.9)
    ref = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    for _ in range(50):
        perturb(model)
        assert ema.update(model) == 0.9
        for k, v in model.state_dict().items():
            ref[k] = 0.9 * ref[k] + 0.1 * v.double()
    for k, v in ema.module.state_dict().items():
        torch.testing.assert_close(v.double(), ref[k], rtol=0, atol=1e-6)
    # and the EMA is not just the model
    assert not torch.allclose(ema.module[0].weight, model[0].weight)


def test_module_is_a_usable_frozen_teacher():
    model = net()
    ema = ModelEma(model, 0.99)
    x = torch.randn(5, 4)
    torch.testing.assert_close(ema.module(x), model(x))
    assert all(not p.requires_grad for p in ema.module.parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_bf16_model_keeps_fp32_shadow_and_accumulates_small_updates():
    model = net().to(torch.bfloat16)
    ema = ModelEma(model, 0.999)
    assert all(p.dtype == torch.float32 for p in ema.module.parameters())
    ref = [p.detach().double().clone() for p in model.parameters()]
    for _ in range(20):
        perturb(model, 0.05)
        ema.update(model)
        ref = [0.999 * r + 0.001 * p.double() for r, p in zip(ref, model.parameters(), strict=True)]
    for e, r in zip(ema.module.parameters(), ref, strict=True):
        torch.testing.assert_close(e.double(), r, rtol=0, atol=1e-6)
    # a bf16 shadow loses these updates (1 − ρ = 1e-3 is below bf16's resolution near 1)
    low = ModelEma(net().to(torch.bfloat16), 0.999, dtype=torch.bfloat16)
    src = net().to(torch.bfloat16)
    with torch.no_grad():
        for p in src.parameters():
            p.fill_(1.0)
        for p in low.module.parameters():
            p.fill_(1.0)
        for p in src.parameters():
            p.fill_(1.0078125)  # one bf16 ulp above 1
    before = [p.clone() for p in low.module.parameters()]
    low.update(src)
    assert all(torch.equal(a, b) for a, b in zip(before, low.module.parameters(), strict=True))


def test_buffers_copy_versus_average():
    model = net(bn=True)
    copy_ema = ModelEma(model, 0.5, buffers="copy")
    avg_ema = ModelEma(model, 0.5, buffers="average")
    bn = model[1]
    old = bn.running_mean.clone()
    with torch.no_grad():
        bn.running_mean.add_(2.0)
        bn.num_batches_tracked.add_(7)
    copy_ema.update(model)
    avg_ema.update(model)
    torch.testing.assert_close(copy_ema.module[1].running_mean, bn.running_mean)
    torch.testing.assert_close(avg_ema.module[1].running_mean, 0.5 * old + 0.5 * bn.running_mean)
    # integer buffers are always copied
    assert int(avg_ema.module[1].num_batches_tracked) == int(bn.num_batches_tracked) == 7


def test_start_samples_copies_until_accumulation_starts():
    model = net()
    ema = ModelEma(model, 0.9, start_samples=64)
    for seen in (32, 64):
        perturb(model)
        assert ema.update(model, samples_seen=seen) == 0.0
        for e, p in zip(ema.module.parameters(), model.parameters(), strict=True):
            assert torch.equal(e, p)
    perturb(model)
    before = [e.clone() for e in ema.module.parameters()]
    assert ema.update(model, samples_seen=96) == 0.9
    for b, e, p in zip(before, ema.module.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(e, torch.lerp(b, p, 0.1))
    fresh = ModelEma(model, 0.9, start_samples=64)
    assert fresh.momentum_at(64) == 0.0 and fresh.momentum_at(65) == 0.9


def test_set_momentum_and_state_dict_round_trip():
    model = net()
    ema = ModelEma(model, 0.9)
    ema.set_momentum(0.99)
    perturb(model)
    assert ema.update(model) == 0.99
    state = ema.state_dict()
    other = ModelEma(net(), 0.5)
    other.load_state_dict(state)
    assert other.momentum == 0.99
    for a, b in zip(other.module.parameters(), ema.module.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError):
        ema.set_momentum(1.5)


def gap(a: ModelEma, b: ModelEma) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.module.parameters(), b.module.parameters(), strict=True))


@pytest.mark.parametrize("kappa", [2, 4, 8])
def test_rho_to_the_kappa_once_matches_kappa_sequential_updates(kappa):
    """One update at ρ^κ with θ_{t+κ} ≈ κ updates at ρ with θ_{t+1..t+κ}, error O(η(1 − ρ)).

    For θ moving by δ per step the exact gap is (1 − ρ) Σ_j ρ^{κ−j} (κ − j) δ ≤ (1 − ρ) δ κ²/2,
    and it halves when δ (the learning rate) halves; the unscaled ρ misses by (ρ − ρ^κ)|ζ − θ|.
    """
    rho = 0.99
    errors = []
    for delta in (1e-3, 5e-4):
        torch.manual_seed(1)
        model = net()
        direction = [torch.randn_like(p) for p in model.parameters()]
        seq, once, wrong = ModelEma(model, rho), ModelEma(model, rho**kappa), ModelEma(model, rho)
        with torch.no_grad():  # move the EMA away from θ so that the momentum matters
            for e in (seq, once, wrong):
                for p in e.module.parameters():
                    p.add_(0.5)
        for _ in range(kappa):
            with torch.no_grad():
                for p, d in zip(model.parameters(), direction, strict=True):
                    p.add_(delta * d)
            seq.update(model)
        once.update(model)
        wrong.update(model)
        err, err_wrong = gap(seq, once), gap(seq, wrong)
        step = max(float(d.abs().max()) for d in direction) * delta
        assert err <= (1 - rho) * step * kappa**2 / 2 + 1e-6
        assert err_wrong > 20 * err
        errors.append(err)
    assert errors[1] == pytest.approx(errors[0] / 2, rel=0.05)


def test_the_engines_emas_are_model_emas_that_raise_rho_to_kappa_once():
    """The engine sets the plan's ρ̂ = ρ^κ with no base batch: an update at κB applies ρ^κ, not ρ^(κ²)."""
    import emarule
    from emarule.engine.loop import build_emas

    spec = {"batch": {"size": 32}, "ema": {"momentum": 0.9, "also": [0.99]}}
    plan = emarule.scale(spec, 2)
    model = net()
    emas = build_emas(spec, model, plan)
    assert all(type(e) is emarule.ModelEma and e.base_batch_size is None for e in emas.values())
    perturb(model)
    used = [e.update(model, samples_seen=64) for e in emas.values()]
    assert used == [plan["ema.momentum"], plan["ema.momentum/0.99"]] == [0.9**2, 0.99**2]


def test_the_engine_refuses_a_first_stage_rho_hat_that_rounds_to_one_in_one_line():
    import emarule
    from emarule.engine.loop import build_emas

    spec = {"batch": {"size": 256}, "ema": {"momentum": 0.9999999999999999}}
    with pytest.warns(UserWarning, match="rounds to 1.0 in float32"):
        plan = emarule.scale(spec, 0.5)
    assert plan["ema.momentum"] == 1.0 and plan.warnings  # the plan warns; a run would never move its EMA
    with pytest.raises(emarule.UserError, match="ema.momentum: ρ̂ = 1 at κ=0.5 never moves the EMA"):
        build_emas(spec, net(), plan)
