"""timm's train.py EMA pattern (`ModelEmaV3`, updated once per optimizer step) ported to `emarule.ModelEma`.

`train_timm` is the loop as timm's train.py writes it; `train_emarule` is the port. At κ=4 (batch 128, base
32) timm's EMA keeps ρ=0.99 per step, so it averages over 4× more samples than at batch 32; the port applies
ρ^(128/32). The example prints the diff size and the results; run it with

    .venv/bin/python examples/timm_model_ema.py      # a few seconds on a CPU

Measured here (that command, with the Makefile's torch 2.14.1; another torch or CPU moves the last digits):

    timm ModelEmaV3 → emarule.ModelEma
    the port changes 2 lines of the peer's loop (2 removed, 2 added; `train_timm` → `train_emarule`)
    held-out digits; distance = mean total variation to the κ=1 EMA's predictions
      κ=1 timm ModelEmaV3                EMA accuracy 0.869  distance 0.000
      κ=1 emarule.ModelEma               EMA accuracy 0.869  distance 0.000
      κ=4 timm ModelEmaV3 (no EMA rule)  EMA accuracy 0.834  distance 0.378
      κ=4 emarule.ModelEma (ρ^κ)         EMA accuracy 0.859  distance 0.037
    κ=1: largest difference between the EMAs' weights 7.1e-05 (ModelEmaV3's first update, step=1, copies the weights)
"""

import torch
import torch.nn.functional as F
from timm.utils import ModelEmaV3

import emarule
from _common import batches, mlp, report

RECIPE = {"batch": {"size": 32}, "optimizer": {"name": "sgd", "lr": 0.05}, "ema": {"momentum": 0.99}}
BASE, RHO, EPOCHS = RECIPE["batch"]["size"], RECIPE["ema"]["momentum"], 10


def train_timm(batch, lr):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model_ema = ModelEmaV3(model, decay=RHO)
    num_updates = 0
    for epoch in range(EPOCHS):
        for x, y in batches(batch, epoch):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            num_updates += 1
            model_ema.update(model, step=num_updates)
    return model_ema.module


def train_emarule(batch, lr):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model_ema = emarule.ModelEma(model, RHO, base_batch_size=BASE)
    num_updates = 0
    for epoch in range(EPOCHS):
        for x, y in batches(batch, epoch):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            num_updates += 1
            model_ema.update(model, samples_seen=num_updates * batch, batch_size=batch)
    return model_ema.module


def run(kappa, train):
    plan = emarule.scale(RECIPE, kappa)  # the optimizer's rule (SGD: lr × κ) in both loops
    return train(int(plan["batch_size"]), plan["optimizer.lr"])


def main():
    base = run(1, train_emarule)
    timm_base = run(1, train_timm)
    same = max((a - b).abs().max().item() for a, b in zip(base.state_dict().values(),
                                                          timm_base.state_dict().values(), strict=True))
    report("timm ModelEmaV3 → emarule.ModelEma", train_timm, train_emarule, [
        ("κ=1 timm ModelEmaV3", timm_base),
        ("κ=1 emarule.ModelEma", base),
        ("κ=4 timm ModelEmaV3 (no EMA rule)", run(4, train_timm)),
        ("κ=4 emarule.ModelEma (ρ^κ)", run(4, train_emarule)),
    ], base)
    print(f"κ=1: largest difference between the EMAs' weights {same:.2g} (ModelEmaV3's first update, "
          f"step=1, copies the weights)")


if __name__ == "__main__":
    main()
