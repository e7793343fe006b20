"""The tracking probe (emarule/vision/probe.py): its gradient, its stability at large κ, and its isolation
from the run it measures."""

import math

import pytest
import torch

from emarule.vision.probe import TrackingProbe, adam_hyperparameters
from emarule.engine.interface import Now


def now(epoch=0.0, kappa=1.0):
    return Now(seen=0, samples=0, epoch=epoch, base_step=0, step=0, kappa=kappa, plan=None)


def tensors(metrics):
    return {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}


def collapsed_features(n=1408, d=64, classes=10, seed=0):
    """Teacher-like features: one shared factor dominates every dimension (λ_max of the normalized
    second moment ≈ 0.8 d, as measured on byol-r18 cpu teachers: 43–48 of 64) plus a weak class
    signal. A linear probe's cross-entropy is steep here whatever the batch."""
    means = torch.randn(classes, d, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 2.0 * torch.randn(n, 1, generator=g) + 0.5 * torch.randn(n, d, generator=g) + 0.25 * means[y]
    return x, y


def test_gradient_is_the_cross_entropy_gradient_of_the_pre_bn_probe():
    torch.manual_seed(0)
    probe = TrackingProbe(5, 3, base_lr=0.01)
    h, y = torch.randn(16, 5) * 3 + 1, torch.randint(0, 3, (16,))
    m = probe.train_metrics(h, y)
    w, b = (p.clone().requires_grad_(True) for p in (probe.module.fc.weight, probe.module.fc.bias))
    xn = torch.nn.functional.batch_norm(h, None, None, training=True, eps=1e-5)
    loss = torch.nn.functional.cross_entropy(xn @ w.T + b, y)
    loss.backward()
    assert m["probe_loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert torch.allclose(m["probe_grad/weight"], w.grad, atol=1e-6)
    assert torch.allclose(m["probe_grad/bias"], b.grad, atol=1e-6)
    assert torch.allclose(m["probe_stat/mean"], h.mean(0)) and torch.allclose(m["probe_stat/sq"], (h * h).mean(0))


def test_adam_rule_and_its_clamp():
    lr, b1, b2, eps = adam_hyperparameters(0.01, 4)
    assert (lr, b1, b2, eps) == pytest.approx((0.02, 0.6, 0.996, 5e-9))
    assert adam_hyperparameters(0.01, 12)[1] == 0.0  # β1 = 1 − 12·0.1 < 0: clamped, no momentum


def test_step_moves_only_with_the_reduced_gradient_and_tracks_statistics():
    torch.manual_seed(0)
    probe = TrackingProbe(4, 2, base_lr=0.1)
    w, bn = probe.module.fc.weight, probe.module.bn
    before = w.clone()
    assert not any(p.requires_grad for p in probe.module.parameters())  # the run's optimizer skips it
    h, y = torch.randn(32, 4) * 2 + 3, torch.randint(0, 2, (32,))
    probe.train_metrics(h, y)
    assert torch.equal(w, before) and torch.equal(bn.running_mean, torch.zeros(4))  # the loss changes nothing
    probe.step(now(kappa=2), tensors(probe.train_metrics(h, y)))
    assert not torch.equal(w, before) and probe.state_dict()["steps"] == 1
    keep = 0.9**2  # running statistics under the EMA Scaling Rule
    assert torch.allclose(bn.running_mean, (1 - keep) * h.mean(0), atol=1e-6)
    assert torch.allclose(bn.running_var, keep + (1 - keep) * h.var(0, unbiased=False), atol=1e-5)
    again = TrackingProbe(4, 2, base_lr=0.1)
    again.load_state_dict(probe.state_dict())
    assert torch.equal(again.exp_avg["probe_grad/weight"], probe.exp_avg["probe_grad/weight"])


def train_probe(kappa, update, epochs=6):
    """Train on collapsed features with the global batch 64κ; `update(probe, reduced, kappa, epoch)`."""
    x, y = collapsed_features()
    torch.manual_seed(1)
    probe = TrackingProbe(x.shape[1], 10, base_lr=0.01)
    b, losses = 64 * kappa, []
    for e in range(epochs):
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(e))
        for i in range(0, len(y) - b + 1, b):
            m = probe.train_metrics(x[perm[i:i + b]], y[perm[i:i + b]])
            losses.append(m["probe_loss"])
            update(probe, tensors(m), kappa, e + (i + b) / len(y))
    return probe, losses


def old_sgd_rule(velocity):
    """The probe before the fix: heavy-ball SGD in the run's optimizer at κ × lr (SGD rule)."""

    def update(probe, reduced, kappa, epoch):
        fc = probe.module.fc
        g = torch.cat([reduced["probe_grad/weight"], reduced["probe_grad/bias"][:, None]], 1)
        velocity.mul_(0.9).add_(g)
        fc.weight.sub_(0.3 * kappa * velocity[:, :-1])
        fc.bias.sub_(0.3 * kappa * velocity[:, -1])

    return update


def test_probe_stays_stable_at_kappa_8_where_the_sgd_rule_probe_diverges():
    """The regression test for the κ = 8 probe: probe_loss rose from 2.1 to 13.2 (chance: ln 10)."""
    torch.set_num_threads(1)
    chance = math.log(10)
    _, old1 = train_probe(1, old_sgd_rule(torch.zeros(10, 65)))
    _, old8 = train_probe(8, old_sgd_rule(torch.zeros(10, 65)))
    half1, half8 = len(old1) // 2, len(old8) // 2
    assert max(old1[half1:]) < chance  # the old probe learned at κ = 1 ...
    assert min(old8[half8:]) > 3 * chance  # ... and blew up at κ = 8: this data reproduces the failure

    def adam(probe, reduced, kappa, epoch):
        probe.step(now(epoch, kappa), reduced)

    p1, new1 = train_probe(1, adam)
    p8, new8 = train_probe(8, adam)
    assert max(new1[half1:]) < chance and max(new8[half8:]) < new8[0]  # it learns at both κ
    x, y = collapsed_features(seed=5)  # held-out draws of the same classes

    def top1(p):
        return (p.module.predict(x).argmax(1) == y).float().mean().item()

    # Both read the features; κ = 8 more slowly per epoch (12 steps here against 132 at κ = 1).
    assert top1(p1) > 0.8 and top1(p8) > 0.3
