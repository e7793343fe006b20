"""lightly's BYOL loop (`update_momentum` with a `cosine_schedule` ramp to 1) ported to `emarule.ModelEma`.

`train_lightly` is the loop as lightly's BYOL examples write it (the two helpers below are written here, so
lightly need not be installed: `update_momentum` is ζ ← mζ + (1 − m)θ, `cosine_schedule` lightly's ramp);
`train_emarule` is the port: the schedule is set at the base batch and each update raises it to
batch / base, so the ramp composes with the EMA Scaling Rule. Both use the Adam rule for the optimizer.
The port sets lightly's per-epoch values with `set_momentum`: ModelEma's built-in `schedule="cosine"`
ramps ρ continuously in samples, so it would not reproduce lightly's loop at κ=1.
The example prints the diff size and the results (a linear probe on the target encoder, the last epoch's
BYOL loss); run it with

    .venv/bin/python examples/lightly_byol.py      # a few seconds on a CPU

Measured here (that command, with the Makefile's torch 2.14.1; another torch or CPU moves the last digits):

    lightly update_momentum + cosine_schedule → emarule.ModelEma
    the port changes 5 lines of the peer's loop (5 removed, 5 added; `train_lightly` → `train_emarule`)
    κ=1: largest difference between the two loops' BYOL losses over 430 steps: 2.4e-07
    linear probe on the target encoder (held-out digits); BYOL loss: mean over the last epoch; gap: mean
    |loss − κ=1 loss| over training, the κ=1 curve averaged over the samples of each κ=4 step
      κ=1 lightly                  probe accuracy 0.793  BYOL loss 0.0006  gap 0.0000
      κ=1 emarule.ModelEma         probe accuracy 0.793  BYOL loss 0.0006  gap 0.0000
      κ=4 lightly (no EMA rule)    probe accuracy 0.826  BYOL loss 0.0441  gap 0.0843
      κ=4 emarule.ModelEma (ρ^κ)   probe accuracy 0.798  BYOL loss 0.0031  gap 0.0368
"""

import copy
import math

import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from torch import nn

import emarule
from _common import X_TEST, X_TRAIN, Y_TEST, Y_TRAIN, batches

RECIPE = {"batch": {"size": 32}, "optimizer": {"name": "adam", "lr": 2e-3, "betas": [0.9, 0.999]},
          "ema": {"momentum": 0.99}}
BASE, EPOCHS = RECIPE["batch"]["size"], 10


def cosine_schedule(step, max_steps, start_value, end_value):
    """From start_value at step 0 to end_value at max_steps − 1, along half a cosine."""
    return end_value - (end_value - start_value) * (math.cos(math.pi * step / (max_steps - 1)) + 1) / 2


@torch.no_grad()
def update_momentum(model, model_ema, m):
    for ema_p, p in zip(model_ema.parameters(), model.parameters(), strict=True):
        ema_p.mul_(m).add_(p, alpha=1 - m)


def networks():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 32))
    projection_head = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 16))
    prediction_head = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))
    return nn.Sequential(backbone, projection_head), prediction_head


def views(x, step):
    """Two noisy, partly masked views of each digit (seeded per step: the same in every loop)."""
    g = torch.Generator().manual_seed(step)
    return [(x + 0.2 * torch.randn(x.shape, generator=g)) * (torch.rand(x.shape, generator=g) > 0.25)
            for _ in range(2)]


def byol_loss(p, z):
    return 2 - 2 * F.cosine_similarity(p, z.detach(), dim=-1).mean()


def train_lightly(batch, opt):
    online, prediction_head = networks()
    online_momentum = copy.deepcopy(online).requires_grad_(False)
    optimizer = torch.optim.Adam([*online.parameters(), *prediction_head.parameters()], **opt)
    step, losses = 0, []
    for epoch in range(EPOCHS):
        momentum = cosine_schedule(epoch, EPOCHS, RECIPE["ema"]["momentum"], 1.0)
        for x, _ in batches(batch, epoch):
            update_momentum(online, online_momentum, m=momentum)
            x0, x1 = views(x, step)
            p0, p1 = prediction_head(online(x0)), prediction_head(online(x1))
            loss = 0.5 * (byol_loss(p0, online_momentum(x1)) + byol_loss(p1, online_momentum(x0)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
    return online_momentum, losses


def train_emarule(batch, opt):
    online, prediction_head = networks()
    online_momentum = emarule.ModelEma(online, RECIPE["ema"]["momentum"], base_batch_size=BASE)
    optimizer = torch.optim.Adam([*online.parameters(), *prediction_head.parameters()], **opt)
    step, losses = 0, []
    for epoch in range(EPOCHS):
        online_momentum.set_momentum(cosine_schedule(epoch, EPOCHS, RECIPE["ema"]["momentum"], 1.0))
        for x, _ in batches(batch, epoch):
            online_momentum.update(online, batch_size=batch)
            x0, x1 = views(x, step)
            p0, p1 = prediction_head(online(x0)), prediction_head(online(x1))
            loss = 0.5 * (byol_loss(p0, online_momentum.module(x1)) + byol_loss(p1, online_momentum.module(x0)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
    return online_momentum.module, losses


def run(kappa, train):
    plan = emarule.scale(RECIPE, kappa)  # the Adam rule: lr × √κ, β̂ = 1 − κ(1 − β), in both loops
    target, losses = train(int(plan["batch_size"]), {"lr": plan["optimizer.lr"], "betas": plan["optimizer.betas"]})
    steps_per_epoch = len(losses) // EPOCHS
    return target, sum(losses[-steps_per_epoch:]) / steps_per_epoch, losses


@torch.no_grad()
def probe(target) -> float:
    """Held-out accuracy of a logistic regression on the target encoder's features."""
    encoder = target[0]
    clf = LogisticRegression(max_iter=2000).fit(encoder(X_TRAIN).numpy(), Y_TRAIN.numpy())
    return clf.score(encoder(X_TEST).numpy(), Y_TEST.numpy())


def main():
    from _common import diff_size

    removed, added = diff_size(train_lightly, train_emarule)
    print("lightly update_momentum + cosine_schedule → emarule.ModelEma")
    print(f"the port changes {max(removed, added)} lines of the peer's loop ({removed} removed, {added} added; "
          f"`train_lightly` → `train_emarule`)")
    rows = [("κ=1 lightly", run(1, train_lightly)), ("κ=1 emarule.ModelEma", run(1, train_emarule)),
            ("κ=4 lightly (no EMA rule)", run(4, train_lightly)),
            ("κ=4 emarule.ModelEma (ρ^κ)", run(4, train_emarule))]
    base = rows[0][1][2]
    worst = max(abs(a - b) for a, b in zip(base, rows[1][1][2], strict=True))
    print(f"κ=1: largest difference between the two loops' BYOL losses over {len(base)} steps: {worst:.2g}")
    print("linear probe on the target encoder (held-out digits); BYOL loss: mean over the last epoch; gap: mean")
    print("|loss − κ=1 loss| over training, the κ=1 curve averaged over the samples of each κ=4 step")
    for name, (target, last_loss, losses) in rows:
        k = len(base) // len(losses)
        gap = sum(abs(v - sum(base[i * k:(i + 1) * k]) / k) for i, v in enumerate(losses)) / len(losses)
        print(f"  {name:<28} probe accuracy {probe(target):.3f}  BYOL loss {last_loss:.4f}  gap {gap:.4f}")


if __name__ == "__main__":
    main()
