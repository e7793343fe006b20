"""A tiny regression task that exercises every part of the shared training loop (tests and smoke runs).

y = W x + noise on generated data; a small MLP student (optionally with BatchNorm) is pulled
towards the targets and, with `toy.teacher_weight`, towards its own EMA teacher, so the EMA
feeds back into the dynamics as in BYOL. Every sample, augmentation included, is a pure
function of (seed, epoch, index). Options that exercise the engine's other parts:

- `toy.seconds`: items carry a duration (0.5 to 2.75 s) and the spec batches by seconds
  (`batch.unit: seconds`); the loss is a mean per second of data, as the loop requires.
- `toy.center_momentum`: a task state updated once per optimizer step, DINO-style: the teacher's
  targets are centred by an EMA of their global-batch mean (a tensor metric the loop averages over
  micro-batches and ranks), and the center is checkpointed.
- `ema.also` in the spec: further EMAs, each evaluated (`ema_val_mse/<momentum>`).

Not a paper experiment: there is no emarule/experiments/toy.yaml; tests write a spec to a temporary
directory and pass it with `--spec`.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from emarule.engine.context import RunContext
from emarule.engine.seeding import mix
from emarule.engine.interface import Evaluation, TaskParts


def duration_of(i: int) -> float:
    """Seconds of item i: ten lengths from 0.5 s to 2.75 s, mixed across the index."""
    return 0.5 + 0.25 * ((i * 7) % 10)


class ToyData:
    def __init__(self, n: int, dim: int, out: int, seed: int, noise: float, augment: float, split: int = 0,
                 seconds: bool = False):
        w = torch.randn(dim, out, generator=torch.Generator().manual_seed(mix(seed, 0x70F))) / dim**0.5
        g = torch.Generator().manual_seed(mix(seed, 0x70F, split + 1))
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.tanh(self.x @ w) + noise * torch.randn(n, out, generator=g)
        self.seed, self.augment, self.epoch, self.seconds = seed, augment, 0, seconds

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int):
        x = self.x[i]
        if self.augment:
            g = torch.Generator().manual_seed(mix(self.seed, self.epoch, i))
            x = x + self.augment * torch.randn(x.shape, generator=g)
        if self.seconds:
            return x, self.y[i], torch.tensor(duration_of(i))
        return x, self.y[i]


def build_model(dim: int, hidden: int, out: int, batchnorm: bool, seed: int, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(mix(seed, 0xB1D))
    layers: list[nn.Module] = [nn.Linear(dim, hidden)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(hidden))
    layers.append(nn.Tanh())
    if dropout:  # draws from the global RNG: makes checkpointed RNG state matter
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(hidden, out))
    return nn.Sequential(*layers)


class Center:
    """An EMA of the teacher's mean output, moved once per optimizer step (the task's state)."""

    def __init__(self, out: int, momentum: float):
        self.value = torch.zeros(out)
        self.momentum = momentum
        self.updates = 0

    def step(self, batch_mean: torch.Tensor) -> None:
        self.value = self.momentum * self.value + (1 - self.momentum) * batch_mean.float().cpu()
        self.updates += 1

    def state_dict(self) -> dict:
        return {"value": self.value.clone(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.updates = state["value"].clone(), int(state["updates"])


def make_parts(ctx: RunContext) -> TaskParts:
    t = ctx.cfg.toy
    dim, hidden, out = t.dim, t.hidden, t.out
    seconds = bool(t.seconds)
    data = ToyData(t.samples, dim, out, ctx.seed, t.noise, t.augment, seconds=seconds)
    held_out = ToyData(t.eval_samples, dim, out, ctx.seed, 0.0, 0.0, split=1)
    model = build_model(dim, hidden, out, bool(t.batchnorm), ctx.seed, t.dropout)
    teacher_weight = float(t.teacher_weight)
    delay = float(t.step_delay)
    center_momentum = t.center_momentum
    center = Center(out, float(center_momentum)) if center_momentum is not None else None

    def loss(model, teacher, batch, now):
        x, y, *rest = batch
        pred = model(x)
        # per item, then a mean per unit of the batch measure: per sample, or per second of data
        per_item = (pred - y).pow(2).mean(1)
        w = rest[0] if seconds else torch.ones_like(per_item)
        value = (per_item * w).sum() / w.sum()
        metrics = {"mse": value.item()}
        if teacher is not None and teacher_weight:
            with torch.no_grad():
                target = teacher(x)
            if center is not None:
                # a mean per unit of measure, like the loss: the loop averages it over the global batch
                metrics["teacher_mean"] = (target * w[:, None]).sum(0) / w.sum()
                target = target - center.value.to(target.device)
            value = value + teacher_weight * (((pred - target).pow(2).mean(1) * w).sum() / w.sum())
        if delay:
            time.sleep(delay)  # lets tests kill a run part-way
        return value, metrics

    def on_step(now, reduced):
        if center is not None and "teacher_mean" in reduced:
            center.step(reduced["teacher_mean"])

    def score(net, batch, now):
        x, y = batch
        return {"sse": (net(x) - y).pow(2).sum(), "count": y.numel()}

    evaluation = Evaluation(data=list(zip(held_out.x, held_out.y, strict=True)), score=score,
                            finish=lambda sums: {"val_mse": sums["sse"] / sums["count"]},
                            every_epochs=float(ctx.cfg.eval.every_epochs),
                            every_base_steps=ctx.cfg.eval.every_base_steps)
    no_decay = {n for n, p in model.named_parameters() if p.ndim <= 1}
    return TaskParts(model=model, train_set=data, loss=loss, evaluations=[evaluation], no_decay=no_decay,
                     on_step=on_step, state=center, progress_metric="mse",
                     duration=duration_of if seconds else None,
                     info={"model": "mlp", "parameters": sum(p.numel() for p in model.parameters()),
                           "dataset": f"toy regression ({len(data)} samples)"})


def build(ctx: RunContext) -> TaskParts:
    """The run's settings from the toy section, then the parts."""
    t = ctx.cfg.toy
    if t.checkpoint_every_epochs is not None:
        ctx.checkpoint_every_epochs = float(t.checkpoint_every_epochs)
    if t.threads:
        torch.set_num_threads(int(t.threads))
    ctx.quiet = ctx.quiet or bool(t.quiet)
    return make_parts(ctx)
