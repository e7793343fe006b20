"""A refused `load_state_dict` leaves the EMA as it was (weights, settings, clock), and a model that is not an
nn.Module is refused by name."""

import pytest
import torch
from torch import nn

from emarule.engine.ema import ModelEma


def _net(width: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.BatchNorm1d(width), nn.Linear(width, 2))


@pytest.mark.parametrize("other", [lambda: nn.Sequential(nn.Linear(4, 8)),  # missing keys
                                   lambda: _net(16)])  # same names, other shapes
def test_a_refused_load_changes_nothing(other):
    ema = ModelEma(_net(), 0.999, base_batch_size=32, samples_seen=640)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    foreign = ModelEma(other(), 0.5).state_dict()
    with pytest.raises(RuntimeError, match="not this EMA's model.*nothing was loaded"):
        ema.load_state_dict(foreign)
    assert (ema.momentum, ema.base_batch_size, ema._last) == (0.999, 32, 640)
    assert all(torch.equal(before[k], v) for k, v in ema.module.state_dict().items())


def test_a_partial_load_still_works_with_strict_false():
    ema = ModelEma(_net(), 0.999)
    part = {k: v for k, v in ModelEma(_net(), 0.9).state_dict().items() if not k.startswith("module.2.")}
    ema.load_state_dict(part, strict=False)
    assert ema.momentum == 0.9


def test_a_shape_mismatch_is_refused_even_with_strict_false():
    ema = ModelEma(_net(), 0.999)
    with pytest.raises(RuntimeError, match="of another shape"):
        ema.load_state_dict(ModelEma(_net(16), 0.5).state_dict(), strict=False)
    assert ema.momentum == 0.999


@pytest.mark.parametrize("model", [None, [nn.Parameter(torch.zeros(2))]])
def test_a_model_that_is_not_a_module_is_refused_by_name(model):
    with pytest.raises(TypeError, match="model must be the nn.Module whose weights are averaged, got"):
        ModelEma(model, 0.9)


@pytest.mark.parametrize("field, value, message", [
    ("samples_seen", "12", "samples_seen must be a finite number"),
    ("pending", float("nan"), "pending must be a finite number"),
    ("calls", 1.5, "calls must be a whole number"),
    ("updates", -1, "updates must be a whole number"),
    ("dtype_given", "yes", "dtype_given must be True or False"),
    ("momentum", "0.9", "momentum must be a finite number"),
    ("buffers", "mean", "buffers must be one of"),
    ("every", 0, "every must be a whole number"),
])
def test_a_saved_state_with_a_bad_setting_or_clock_is_refused_before_anything_is_loaded(field, value, message):
    saved = ModelEma(_net(), 0.9, base_batch_size=32, samples_seen=320)
    state = saved.state_dict()
    state["_extra_state"] = {**state["_extra_state"], field: value}
    with torch.no_grad():
        state["module.0.weight"] = state["module.0.weight"] + 1
    ema = ModelEma(_net(), 0.999, base_batch_size=32, samples_seen=640)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    with pytest.raises(ValueError, match=f"saved EMA state's {message}"):
        ema.load_state_dict(state)
    assert (ema.momentum, ema._last, ema.updates) == (0.999, 640, 0)
    assert all(torch.equal(before[k], v) for k, v in ema.module.state_dict().items())
    ema.update(_net(), samples_seen=672)  # still usable


@pytest.mark.parametrize("state", [[1, 2], {"module.0.weight": "weights"}])
def test_a_state_dict_that_is_not_one_is_named(state):
    with pytest.raises((TypeError, ValueError), match="load_state_dict takes the dict|not tensors|missing"):
        ModelEma(_net(), 0.9).load_state_dict(state)
