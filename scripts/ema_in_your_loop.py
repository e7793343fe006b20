"""emarule in a plain PyTorch loop: train on scikit-learn's digits at κ=1 and at κ=4, then see how
close the EMA models end, with the EMA Scaling Rule and without it (the paper's baseline).

    .venv/bin/python scripts/ema_in_your_loop.py        # a few seconds on a CPU
"""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import emarule

# The recipe as you tuned it, at your reference batch size.
RECIPE = {"batch": {"size": 32}, "optimizer": {"name": "sgd", "lr": 0.05}, "ema": {"momentum": 0.99}}
EPOCHS = 10

digits = load_digits()
X, y = torch.tensor(digits.data, dtype=torch.float32) / 16, torch.tensor(digits.target)
X_train, y_train, X_test, y_test = X[:1400], y[:1400], X[1400:], y[1400:]


def train(kappa: float, ema_rule: bool) -> nn.Module:
    """The same samples in the same order at every κ: only the batch (and what scales with it) changes."""
    plan = emarule.scale(RECIPE, kappa)  # lr ×κ for SGD; every value with its rule
    batch = int(plan["batch_size"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=plan["optimizer.lr"])
    # With base_batch_size the EMA applies ρ^(batch / base); without it, ρ as is (no rule).
    ema = emarule.ModelEma(model, RECIPE["ema"]["momentum"],
                           base_batch_size=RECIPE["batch"]["size"] if ema_rule else None)
    order = torch.Generator().manual_seed(1)
    for _ in range(EPOCHS):
        perm = torch.randperm(len(X_train), generator=order)
        for start in range(0, len(X_train) - batch + 1, batch):
            idx = perm[start:start + batch]
            loss = F.cross_entropy(model(X_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model, batch_size=batch)  # after step(): averages θ_{t+1} (BYOL's "post")
    return ema.module


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    return (model(X_test).argmax(-1) == y_test).float().mean().item()


@torch.no_grad()
def distance(a: nn.Module, b: nn.Module) -> float:
    """Mean total-variation distance between the two models' class probabilities on held-out digits."""
    return 0.5 * (a(X_test).softmax(-1) - b(X_test).softmax(-1)).abs().sum(-1).mean().item()


def main() -> None:
    torch.set_num_threads(1)  # tiny model: threads only add overhead and run-to-run noise
    plan = emarule.scale(RECIPE, 4)
    print(f"κ=4: batch {plan['batch_size']:g}, lr {plan['optimizer.lr']:g} ({plan.values['optimizer.lr'].rule}), "
          f"EMA ρ {plan['ema.momentum']:.6f} ({plan.values['ema.momentum'].rule})")
    base, ruled, unruled = train(1, True), train(4, True), train(4, False)
    print(f"held-out digits after {EPOCHS} epochs; distance = mean total variation to the κ=1 EMA's predictions")
    print(f"κ=1                   EMA accuracy {accuracy(base):.3f}")
    print(f"κ=4 with the EMA rule EMA accuracy {accuracy(ruled):.3f}  distance {distance(base, ruled):.3f}")
    print(f"κ=4 without it        EMA accuracy {accuracy(unruled):.3f}  distance {distance(base, unruled):.3f}")


if __name__ == "__main__":
    main()
