"""BatchNorm's running statistics decay by the plan's ρ_BN per optimizer step, however many micro-batches the
step is split into (BatchNorm updates them on every forward)."""

import pytest
import torch
from torch import nn

from emarule.engine.loop import set_bn_momentum


class _Plan(dict):
    pass


@pytest.mark.parametrize("accumulation", [1, 2, 4, 7])
def test_a_steps_micro_batches_compose_to_the_plans_momentum(accumulation):
    bn = nn.BatchNorm1d(3)
    rho_step = 0.9 ** 4  # ρ_BN^κ at κ = 4 (norm.bn_scale)
    set_bn_momentum(nn.Sequential(bn), _Plan({"norm.bn_torch_momentum": 1 - rho_step}), accumulation)
    assert (1 - bn.momentum) ** accumulation == pytest.approx(rho_step, rel=1e-12)
    if accumulation == 1:
        assert bn.momentum == 1 - rho_step  # no accumulation: the plan's value as it is, bit for bit
    # A forwards of a constant batch move the running mean from 0 by 1 − ρ̂ of the way, as one step would
    x = torch.full((8, 3), 2.0)
    for _ in range(accumulation):
        bn(x)
    assert bn.running_mean.tolist() == pytest.approx([2.0 * (1 - rho_step)] * 3, rel=1e-6)


def test_no_batchnorm_momentum_in_the_plan_leaves_the_model_alone():
    bn = nn.BatchNorm1d(3)
    set_bn_momentum(nn.Sequential(bn), _Plan(), 4)
    assert bn.momentum == 0.1
