"""ModelEma at the edges a library EMA meets: low- and high-precision models, a shadow changed by hand,
dicts without a clock, timm's state_dict, pickling, modes and tensor clocks."""

import io

import pytest
import torch
from timm.utils.model_ema import ModelEmaV3
from torch import nn

from emarule.engine.ema import ModelEma


def bn_net(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to(dtype)


def test_a_bf16_model_with_batchnorm_gives_a_float32_average_that_runs():
    model = bn_net(torch.bfloat16)
    ema = ModelEma(model, 0.999)
    assert {t.dtype for t in ema.module.state_dict().values() if t.is_floating_point()} == {torch.float32}
    model.train()
    model(torch.randn(16, 4, dtype=torch.bfloat16))  # moves the running statistics
    ema.update(model)
    torch.testing.assert_close(ema.module[1].running_mean, model[1].running_mean.float())
    x = torch.randn(3, 4)
    assert ema(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ema(x).shape == (3, 2)


def test_the_default_dtype_never_lowers_a_float64_model():
    model = nn.Linear(4, 3).double()
    ema = ModelEma(model, 0.0)
    assert ema.dtype == torch.float64 and ema.settings()["dtype"] == "float64"
    with torch.no_grad():
        model.weight.add_(1e-12)
    ema.update(model)
    assert torch.equal(ema.module.weight, model.weight)  # ρ = 0 copies exactly
    assert ModelEma(model, 0.9, dtype="float32").module.weight.dtype == torch.float32
    assert ModelEma(nn.Linear(2, 2).half(), 0.9).dtype == torch.float32


def test_a_shadow_loaded_with_assign_is_paired_again():
    model = nn.Linear(2, 2)
    ema = ModelEma(model, 0.5)
    ema.update(model)
    zeros = {k: torch.zeros_like(v) for k, v in ema.module.state_dict().items()}
    ema.module.load_state_dict(zeros, assign=True)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.module.weight, torch.full((2, 2), 0.5))


def test_a_shadow_cast_in_place_is_paired_again():
    model = nn.Linear(2, 2)
    ema = ModelEma(model, 0.5)
    ema.update(model)
    ema.module.double()  # keeps the Parameter objects, changes their dtype
    with torch.no_grad():
        model.weight.fill_(1.0)
    before = ema.module.weight.clone()
    ema.update(model)
    assert ema.dtype == torch.float64 and ema.updates == 2
    torch.testing.assert_close(ema.module.weight, 0.5 * before + 0.5)


def test_a_dict_without_a_clock_names_the_one_way_on():
    model = nn.Linear(2, 2)
    ema = ModelEma(model, 0.999, base_batch_size=32, warmup_power=0.75)
    ema.load_state_dict({"module": model.state_dict(), "momentum": 0.999})
    with pytest.raises(ValueError, match="with batch_size=B too"):
        ema.update(model, batch_size=32)
    with pytest.raises(ValueError, match="pass this update's global batch_size=B with samples_seen=S once"):
        ema.update(model, samples_seen=6400)
    assert ema.updates == 0
    ema.update(model, samples_seen=6400, batch_size=32)
    rho = ema.update(model, samples_seen=6464)  # the clock is known now: ΔS = 64, κ = 2
    assert rho == pytest.approx(ema.scheduled(6464) ** 2)


def test_timms_state_dict_loads_and_the_next_update_needs_the_batch():
    model = bn_net()
    timm_ema = ModelEmaV3(model, decay=0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    timm_ema.update(model)
    ema = ModelEma(bn_net(), 0.9, base_batch_size=8)
    ema.load_state_dict(timm_ema.state_dict())  # strict
    for k, v in timm_ema.module.state_dict().items():
        torch.testing.assert_close(ema.module.state_dict()[k], v)
    assert ema.momentum == 0.9 and ema.base_batch_size == 8
    with pytest.raises(ValueError, match="no clock"):
        ema.update(model, samples_seen=100)
    assert ema.update(model, batch_size=16) == pytest.approx(0.81)


def test_an_ema_pickles_with_or_without_excluded_names():
    model = bn_net()
    for ema in (ModelEma(model, 0.9), ModelEma(model, 0.9, exclude=["2"])):
        ema.update(model)
        buf = io.BytesIO()
        torch.save(ema, buf)
        buf.seek(0)
        again = torch.load(buf, weights_only=False)
        assert again._excluded("2.weight") == ema._excluded("2.weight")
        again.update(model)
        ema.update(model)
        for a, b in zip(again.state_dict().values(), ema.state_dict().values(), strict=True):
            assert a == b if isinstance(a, dict) else torch.equal(a, b)


def test_eval_puts_a_teacher_in_train_mode_back_in_eval_and_train_leaves_it():
    model = bn_net()
    parent = nn.ModuleDict({"model": model, "ema": ModelEma(model, 0.9)})
    ema = parent["ema"]
    ema.module.train()  # a BYOL teacher's BatchNorm in train mode
    parent.train()
    assert ema.module.training
    parent.eval()
    assert not ema.module.training and not ema.training
    parent.train()
    assert not ema.module.training and ema.training


def test_a_one_element_tensor_clock_counts_as_its_value():
    model = nn.Linear(2, 2)
    ema = ModelEma(model, 0.9, base_batch_size=8)
    assert ema.update(model, samples_seen=torch.tensor(16)) == pytest.approx(0.81)
    assert ema.update(model, batch_size=torch.tensor([8.0])) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="batch_size must be a finite number"):
        ema.update(model, batch_size=torch.tensor([8, 8]))


@pytest.mark.parametrize("kwargs,message", [
    ({"base_batch_size": 8, "start_steps": 2, "start_samples": 16}, "start_steps .* or start_samples, not both"),
    ({"base_batch_size": 8, "warmup_gamma": 2.0}, "give warmup_power too"),
    ({"base_batch_size": 8, "total_samples": 100}, "give schedule='cosine' too"),
])
def test_settings_that_would_be_ignored_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelEma(nn.Linear(2, 2), 0.9, **kwargs)


def test_a_partial_load_keeps_the_clock():
    model = bn_net()
    ema = ModelEma(model, 0.9, base_batch_size=8)
    ema.update(model, samples_seen=8)
    ema.update(model, samples_seen=16)
    ema.load_state_dict({"module.2.weight": torch.zeros(2, 8)}, strict=False)
    assert ema.get_extra_state()["samples_seen"] == 16 and ema.updates == 2
    assert ema.update(model, samples_seen=24) == pytest.approx(0.9)


def test_a_float64_buffer_is_never_narrowed():
    model = bn_net()
    model.register_buffer("scale", torch.tensor([1.0 + 1e-12], dtype=torch.float64))
    ema = ModelEma(model, 0.9)
    assert ema.module.scale.dtype == torch.float64
    ema.update(model)
    assert torch.equal(ema.module.scale, model.scale)


def test_a_setting_of_the_wrong_type_is_named_before_what_it_would_mean():
    with pytest.raises(ValueError, match="warmup_gamma must be a finite number"):
        ModelEma(nn.Linear(2, 2), 0.9, base_batch_size=8, warmup_gamma="2")


def test_a_bf16_model_is_cast_for_the_update_in_bounded_parts(monkeypatch):
    """The float32 copies of a bf16 model's tensors exist a part at a time, the copies alive at once
    under CAST_BYTES (or one tensor), and the average is the same as a cast of everything at once."""
    import weakref

    from emarule.engine import ema as ema_mod

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6))).to(torch.bfloat16)  # weight and bias: 1,088 B
    ema = ModelEma(model, 0.9)
    reference = {n: t.double() for n, t in ema.module.state_dict().items()}
    monkeypatch.setattr(ema_mod, "CAST_BYTES", 1_500)
    to, copies, peaks, lerp, parts = torch.Tensor.to, [], [], torch._foreach_lerp_, []

    def spy_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if self.dtype == torch.bfloat16 and out.dtype == torch.float32:
            copies.append(weakref.ref(out))
            peaks.append(sum(r().numel() * 4 for r in copies if r() is not None))
        return out

    def spy_lerp(es, ss, weight):
        parts.append(len(ss))
        return lerp(es, ss, weight)

    monkeypatch.setattr(torch.Tensor, "to", spy_to)
    monkeypatch.setattr(torch, "_foreach_lerp_", spy_lerp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    monkeypatch.undo()
    assert parts == [2] * 6 and len(peaks) == 12 and max(peaks) == 1_088  # a layer a part, freed before the next
    for n, p in model.state_dict().items():
        want = (reference[n] * 0.9 + p.double() * 0.1).float()
        torch.testing.assert_close(ema.module.state_dict()[n], want, rtol=0, atol=1e-6)


class Tied(nn.Module):
    """A decoder tied to the embedding: named_parameters() lists the weight once, under the first name."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(5, 3), nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def test_a_tied_weight_is_excluded_by_either_name():
    for name in ("head.weight", "head", "embed"):
        model = Tied()
        ema = ModelEma(model, 0.5, exclude=[name])
        with torch.no_grad():
            model.embed.weight.add_(1.0)
        ema.update(model)
        assert torch.equal(ema.module.embed.weight, model.embed.weight), name  # copied, not averaged
        assert ema.module.head.weight is ema.module.embed.weight
    averaged = ModelEma(model := Tied(), 0.5, exclude=lambda n: n == "nothing")
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    averaged.update(model)
    torch.testing.assert_close(averaged.module.embed.weight, model.embed.weight - 0.5)
    with pytest.raises(ValueError, match="no parameter or buffer 'head.bias'"):
        ModelEma(Tied(), 0.5, exclude=["head.bias"])
    copy = io.BytesIO()
    torch.save(ModelEma(Tied(), 0.5, exclude=["head"]), copy)  # still picklable


def test_exclude_names_must_be_strings():
    with pytest.raises(ValueError, match="exclude's names must be strings.*got 0"):
        ModelEma(nn.Linear(2, 2), 0.9, exclude=[0])


def test_the_meta_device_is_refused():
    with pytest.raises(ValueError, match="holds no data"):
        ModelEma(nn.Linear(2, 2), 0.9, device="meta")
