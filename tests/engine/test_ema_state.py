"""ModelEma as an nn.Module: saved state, pairing with the model, and the three state bugs of issue 20."""

import pytest
import torch
from torch import nn

from emarule.engine.ema import ModelEma


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))


def shift(model: nn.Module, by: float = 0.1) -> None:
    with torch.no_grad():
        for t in [*model.parameters(), model[1].running_mean]:
            t.add_(by * torch.randn_like(t))


def max_gap(a: nn.Module, b: nn.Module) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in
               zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_load_state_dict_restores_the_buffers_mode_and_the_dtype():
    """Bug: an EMA saved with buffers="average" and loaded into a default one kept copying."""
    model = net()
    saved = ModelEma(model, 0.5, buffers="average", dtype="bfloat16")
    restored = ModelEma(net(), 0.9)
    restored.load_state_dict(saved.state_dict())
    assert restored.buffers == "average" and restored.dtype == torch.bfloat16
    assert restored.module[0].weight.dtype == torch.bfloat16
    for _ in range(3):
        shift(model)
        saved.update(model)
        restored.update(model)
    assert max_gap(saved.module, restored.module) == 0.0
    # the engine's checkpoint form ({"module": weights, settings}) restores them too
    again = ModelEma(net(), 0.9)
    again.load_state_dict(saved.checkpoint())
    assert again.buffers == "average" and again.dtype == torch.bfloat16 and max_gap(again.module, saved.module) == 0


def test_a_model_loaded_with_assign_is_followed():
    """Bug: tensors were paired by id once; after load_state_dict(assign=True) the EMA averaged the old ones."""
    model = net()
    ema = ModelEma(model, 0.5)
    ema.update(model)
    new = {k: v + 1.0 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(new, assign=True)
    before = ema.module[0].weight.clone()
    ema.update(model)
    torch.testing.assert_close(ema.module[0].weight, 0.5 * before + 0.5 * model[0].weight)
    model[3] = nn.Linear(6, 3)  # a new submodule: its tensors are paired too
    before = ema.module[3].weight.clone()
    ema.update(model)
    torch.testing.assert_close(ema.module[3].weight, 0.5 * before + 0.5 * model[3].weight)


def test_a_positional_step_is_refused_and_momentum_keeps_the_rule():
    """Bug: update(model, n) read n as samples_seen; update(model, momentum=0.9) bypassed the rule."""
    model = net()
    ema = ModelEma(model, 0.9, base_batch_size=32)
    assert ema.update(model, momentum=0.9, batch_size=64) == pytest.approx(0.81)
    for e in (ema, ModelEma(model, 0.9, start_samples=64)):  # with the rule, and a plain EMA
        before = e.module[0].weight.clone()
        with pytest.raises(TypeError, match="takes its clock by keyword"):
            e.update(model, 100)
        assert torch.equal(e.module[0].weight, before)


def test_a_parents_state_dict_holds_the_ema_and_its_settings():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net()
            self.ema = ModelEma(self.net, 0.99, base_batch_size=16, buffers="average")

    a, b = Holder(), Holder()
    shift(a.net)
    a.ema.update(a.net, samples_seen=64)
    sd = a.state_dict()
    assert "ema.module.0.weight" in sd and sd["ema._extra_state"]["samples_seen"] == 64
    b.ema.load_state_dict({"module": b.ema.module.state_dict(), "momentum": 0.5})  # an old checkpoint form
    b.load_state_dict(sd)
    assert b.ema.momentum == 0.99 and max_gap(a.ema.module, b.ema.module) == 0
    # the clock came along: the next 32 samples are a batch of 32, ρ^(32/16)
    assert b.ema.update(b.net, samples_seen=96) == pytest.approx(0.99**2)


def test_an_nn_module_in_eval_mode_that_a_parents_train_leaves_alone():
    model = net()
    ema = ModelEma(model, 0.9)
    assert isinstance(ema, nn.Module) and not ema.module.training
    parent = nn.ModuleDict({"model": model, "ema": ema}).train()
    assert model.training and not ema.module.training
    x = torch.randn(5, 4)
    model.eval()
    torch.testing.assert_close(ema(x), model(x))
    assert all(not p.requires_grad for p in ema.parameters()) and parent


def test_to_moves_and_casts_the_shadow_and_updates_follow():
    model = net()
    ema = ModelEma(model, 0.5).to(torch.float64)
    assert ema.dtype == torch.float64 and ema.module[0].weight.dtype == torch.float64
    before = ema.module[0].weight.clone()
    shift(model)
    ema.update(model)
    torch.testing.assert_close(ema.module[0].weight, 0.5 * before + 0.5 * model[0].weight.double())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cpu_copy_of_a_gpu_model():
    model = net().cuda()
    ema = ModelEma(model, 0.5, device="cpu")
    assert ema.module[0].weight.device.type == "cpu"
    before = ema.module[0].weight.clone()
    shift(model)
    ema.update(model)
    torch.testing.assert_close(ema.module[0].weight, 0.5 * before + 0.5 * model[0].weight.cpu())


def test_swap_into_evaluates_the_average_and_restores_the_model():
    model = net()
    ema = ModelEma(model, 0.5)
    shift(model)
    ema.update(model)
    own = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    model.eval()
    with ema.swap_into(model) as m:
        torch.testing.assert_close(m(x), ema(x))
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError), ema.apply_to(model):
        raise RuntimeError("an evaluation that fails")
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())


def test_exclude_by_name_or_predicate_copies_instead_of_averaging():
    for exclude in (["3"], lambda name: name.startswith("3.")):
        model = net()
        ema = ModelEma(model, 0.5, exclude=exclude)
        w0 = ema.module[0].weight.clone()
        shift(model)
        ema.update(model)
        assert torch.equal(ema.module[3].weight, model[3].weight) and torch.equal(ema.module[3].bias, model[3].bias)
        torch.testing.assert_close(ema.module[0].weight, 0.5 * w0 + 0.5 * model[0].weight)
    for names in (["head"], iter(["3", "head"])):  # a generator's names are checked too
        with pytest.raises(ValueError, match="no parameter or buffer 'head'"):
            ModelEma(net(), 0.5, exclude=names)


def test_a_different_model_is_named_not_averaged():
    ema = ModelEma(net(), 0.5)
    wider = nn.Sequential(nn.Linear(4, 7), nn.BatchNorm1d(7), nn.Tanh(), nn.Linear(7, 3))
    before = ema.module[0].weight.clone()
    with pytest.raises(ValueError, match=r"parameter '0.weight' has shape \(7, 4\) in the model but \(6, 4\)"):
        ema.update(wider)
    assert torch.equal(before, ema.module[0].weight)
    with pytest.raises(ValueError, match="the model has no parameter '0.weight'"):
        ema.update(nn.Sequential(nn.Identity(), nn.Linear(4, 6)))


def test_a_deep_copy_does_not_hold_the_models_tensors():
    import copy

    model = net()
    ema = ModelEma(model, 0.5)
    ema.update(model)
    twin = copy.deepcopy(ema)
    assert twin._groups == [] and max_gap(twin.module, ema.module) == 0
    shift(model)
    assert twin.update(model) == ema.update(model) == 0.5 and max_gap(twin.module, ema.module) == 0


def test_schedules_and_every_are_saved_and_win_over_the_constructor():
    model = net()
    saved = ModelEma(model, 0.999, base_batch_size=8, warmup_power=0.75, schedule="cosine", total_samples=800,
                     every=2, start_samples=16)
    saved.update(model, samples_seen=8)  # a skipped call: the next one is due
    restored = ModelEma(net(), 0.9)
    restored.load_state_dict(saved.state_dict())
    assert restored.settings() == saved.settings()
    assert restored.momentum_at(samples_seen=40) == saved.momentum_at(samples_seen=40) == pytest.approx(
        saved.scheduled(40) ** (40 / 8))
