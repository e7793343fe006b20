"""What the examples share: scikit-learn's digits (bundled, no download), a small MLP, the metrics, and the
diff between a peer's loop and its port, counted from the two functions' source."""

import difflib
import inspect

import torch
from sklearn.datasets import load_digits
from torch import nn

torch.set_num_threads(1)  # tiny models: threads only add overhead and run-to-run noise

_digits = load_digits()
X = torch.tensor(_digits.data, dtype=torch.float32) / 16
Y = torch.tensor(_digits.target)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X[:1400], Y[:1400], X[1400:], Y[1400:]


def mlp() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights in every run
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))


def batches(batch: int, epoch: int):
    """The same samples in the same order at every batch size: only the grouping changes."""
    perm = torch.randperm(len(X_TRAIN), generator=torch.Generator().manual_seed(epoch))
    for start in range(0, len(X_TRAIN) - batch + 1, batch):
        idx = perm[start:start + batch]
        yield X_TRAIN[idx], Y_TRAIN[idx]


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    model.eval()
    return (model(X_TEST).argmax(-1) == Y_TEST).float().mean().item()


@torch.no_grad()
def distance(a: nn.Module, b: nn.Module) -> float:
    """Mean total-variation distance between two models' class probabilities on the held-out digits."""
    a.eval(), b.eval()
    return 0.5 * (a(X_TEST).softmax(-1) - b(X_TEST).softmax(-1)).abs().sum(-1).mean().item()


def diff_size(peer, port) -> tuple[int, int]:
    """(lines removed, lines added) from the peer function's body to the port's; blank lines, comments and
    the `def` line are not counted."""
    def body(fn):
        lines = inspect.getsource(fn).splitlines()[1:]
        return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]

    ops = list(difflib.ndiff(body(peer), body(port)))
    return sum(o.startswith("- ") for o in ops), sum(o.startswith("+ ") for o in ops)


def report(title: str, peer, port, rows: list[tuple[str, nn.Module]], base: nn.Module) -> None:
    removed, added = diff_size(peer, port)
    print(title)
    print(f"the port changes {max(removed, added)} lines of the peer's loop ({removed} removed, {added} added; "
          f"`{peer.__name__}` → `{port.__name__}`)")
    print("held-out digits; distance = mean total variation to the κ=1 EMA's predictions")
    for name, model in rows:
        print(f"  {name:<34} EMA accuracy {accuracy(model):.3f}  distance {distance(base, model):.3f}")
