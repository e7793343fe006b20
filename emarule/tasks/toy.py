"""A tiny regression task that exercises the shared training loop (tests and smoke runs).

y = W x + noise on generated data; a small MLP student (optionally with BatchNorm) is pulled
towards the targets and, with `toy.teacher_weight`, towards its own EMA teacher, so the EMA
feeds back into the dynamics as in BYOL. Every sample, augmentation included, is a pure
function of (seed, epoch, index). Not a paper experiment: there is no experiments/toy.yaml;
tests write a spec to a temporary directory and pass it with `--spec`.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from emarule.context import RunContext
from emarule.distributed import _mix
from emarule.spec import get
from emarule.tasks.parts import TaskParts


class ToyData:
    def __init__(self, n: int, dim: int, out: int, seed: int, noise: float, augment: float, split: int = 0):
        w = torch.randn(dim, out, generator=torch.Generator().manual_seed(_mix(seed, 0x70F))) / dim**0.5
        g = torch.Generator().manual_seed(_mix(seed, 0x70F, split + 1))
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.tanh(self.x @ w) + noise * torch.randn(n, out, generator=g)
        self.seed, self.augment, self.epoch = seed, augment, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int):
        x = self.x[i]
        if self.augment:
            g = torch.Generator().manual_seed(_mix(self.seed, self.epoch, i))
            x = x + self.augment * torch.randn(x.shape, generator=g)
        return x, self.y[i]


def build_model(dim: int, hidden: int, out: int, batchnorm: bool, seed: int, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(_mix(seed, 0xB1D))
    layers: list[nn.Module] = [nn.Linear(dim, hidden)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(hidden))
    layers.append(nn.Tanh())
    if dropout:  # draws from the global RNG: makes checkpointed RNG state matter
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(hidden, out))
    return nn.Sequential(*layers)


def make_parts(ctx: RunContext) -> TaskParts:
    s = ctx.spec
    dim, hidden, out = get(s, "toy.dim", 8), get(s, "toy.hidden", 16), get(s, "toy.out", 2)
    data = ToyData(get(s, "toy.samples", 256), dim, out, ctx.seed, get(s, "toy.noise", 0.1), get(s, "toy.augment", 0.0))
    held_out = ToyData(get(s, "toy.eval_samples", 128), dim, out, ctx.seed, 0.0, 0.0, split=1)
    model = build_model(dim, hidden, out, bool(get(s, "toy.batchnorm", False)), ctx.seed, get(s, "toy.dropout", 0.0))
    teacher_weight = float(get(s, "toy.teacher_weight", 0.0))
    delay = float(get(s, "toy.step_delay", 0.0))

    def loss(model, teacher, batch):
        x, y = batch
        pred = model(x)
        value = nn.functional.mse_loss(pred, y)
        metrics = {"mse": value.item()}
        if teacher is not None and teacher_weight:
            with torch.no_grad():
                target = teacher(x)
            value = value + teacher_weight * nn.functional.mse_loss(pred, target)
        if delay:
            time.sleep(delay)  # lets tests kill a run part-way
        return value, metrics

    def evaluate(model, teacher):
        dev = next(model.parameters()).device
        x, y = held_out.x.to(dev), held_out.y.to(dev)
        with torch.no_grad():
            out = {"val_mse": nn.functional.mse_loss(model(x), y).item()}
            if teacher is not None:
                out["ema_val_mse"] = nn.functional.mse_loss(teacher(x), y).item()
        return out

    no_decay = {n for n, p in model.named_parameters() if p.ndim <= 1}
    return TaskParts(model=model, ema_source=model, train_set=data, loss=loss, evaluate=evaluate, no_decay=no_decay,
                     info={"model": "mlp", "parameters": sum(p.numel() for p in model.parameters()),
                           "dataset": f"toy regression ({len(data)} samples)"})


def run(ctx: RunContext) -> dict:
    from emarule.train import train

    every = get(ctx.spec, "toy.checkpoint_every_epochs")
    if every is not None:
        ctx.extra.setdefault("checkpoint_every_epochs", every)
    threads = get(ctx.spec, "toy.threads")
    if threads:
        torch.set_num_threads(int(threads))
    ctx.quiet = ctx.quiet or bool(get(ctx.spec, "toy.quiet", False))
    return train(ctx, make_parts(ctx))
