"""`model.init`: BYOL's Haiku default (`fan_in_trunc_normal`) draws each conv and linear weight from a normal of
std 1/√fan_in truncated at ±2 std, with zero biases and unit norms; an unknown name is refused by name."""

import math

import pytest
import torch
from torch import nn

from emarule.errors import UserError
from emarule.vision.models import backbone, init_weights, mlp


def test_fan_in_trunc_normal_scales_each_layer_by_its_own_fan_in():
    torch.manual_seed(0)
    net = backbone("resnet50", init="fan_in_trunc_normal")
    for m in (net.conv1, net.layer4[0].conv2, net.layer1[0].conv1):
        fan_in = m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
        std = 1 / math.sqrt(fan_in)
        w = m.weight.detach()
        assert w.abs().max() <= 2 * std + 1e-7
        # a unit normal cut at ±2 has std 0.8796: the weights' spread is that times 1/√fan_in
        assert w.std().item() == pytest.approx(0.8796 * std, rel=0.05)
    assert all(float(b.weight.detach().min()) == 1.0 and float(b.bias.detach().abs().max()) == 0.0
               for b in net.modules() if isinstance(b, nn.BatchNorm2d))


def test_fan_in_trunc_normal_zeroes_linear_biases():
    torch.manual_seed(0)
    head = mlp(256, 4096, 256)
    init_weights(head, "fan_in_trunc_normal")
    first = next(m for m in head.modules() if isinstance(m, nn.Linear))
    assert float(first.bias.detach().abs().max()) == 0.0
    assert first.weight.detach().std().item() == pytest.approx(0.8796 / 16, rel=0.05)  # fan-in 256


def test_an_unknown_init_names_the_choices():
    with pytest.raises(UserError, match="fan_in_trunc_normal"):
        init_weights(nn.Linear(2, 2), "xavier")
