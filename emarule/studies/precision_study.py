"""The numerical-stability appendix: SGD on linear regression with a Polyak-Ruppert EMA, the model
and EMA weights held in float32, bfloat16 and float16, compared with a float32 reference.

Besides runs with both model and EMA in a dtype, `<dtype>_ema` runs keep the model in float32 and
only the EMA in the dtype, which separates the EMA's rounding from the model's.

Every run sees the same data, the same initial weights and (except `fp32_seed`) the same
minibatches. Forward, backward, the SGD step and the EMA step all run in the held dtype; the EMA
step is ζ.lerp_(θ, 1 − ρ), the update `emarule.engine.ema.ModelEma` applies, whose weight 1 − ρ stays a
float32 scalar, so ρ itself is never rounded to the held dtype: an update is lost only when the
increment (1 − ρ)(θ − ζ) falls under half a unit in the last place of ζ.

Two "second FP32 runs" give the scale below which a difference means nothing:
- fp32_reorder: identical, except that each minibatch's gradient sums its samples in the reverse
  order, so the runs differ from the first rounding on. This is what a second FP32 run of the same
  seed gives on a GPU, whose reductions are not ordered; it is the floor for "the same run".
- fp32_seed: the minibatches come in another order; the run-to-run spread of training itself.

Repeats are independent regressions (data, w*, init, order) trained side by side as a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Config:
    features: int = 64
    samples: int = 4096
    steps: int = 2000
    batch: int = 64
    lr: float = 0.01
    noise: float = 0.1
    init_std: float = 0.0
    momenta: tuple = (0.9, 0.99, 0.999, 0.9999, 0.99999)
    dtypes: tuple = ("fp32", "bf16", "fp16")
    repeats: int = 5
    seed: int = 0


@dataclass
class Run:
    """Final weights and per-step bookkeeping of one training run (all repeats)."""

    theta: torch.Tensor  # (repeats, F), float32 copy of the final target weights
    zeta: torch.Tensor  # (momenta, repeats, F), float32 copy of the final EMA weights
    lost: torch.Tensor  # (momenta,) fraction of due EMA updates (θ ≠ ζ) that left the weight unchanged
    frozen_steps: torch.Tensor  # (momenta,) fraction of steps at which updates were due and none moved ζ
    gap: torch.Tensor  # (momenta,) median |θ − ζ|/|ζ| over the due updates of the second half


def problem(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.repeats, cfg.samples, cfg.features, generator=g)
    w_true = torch.randn(cfg.repeats, cfg.features, generator=g)
    y = torch.einsum("rnf,rf->rn", x, w_true) + cfg.noise * torch.randn(cfg.repeats, cfg.samples, generator=g)
    theta0 = cfg.init_std * torch.randn(cfg.repeats, cfg.features, generator=g)
    return x, y, theta0


def batches(cfg: Config, order_seed: int) -> torch.Tensor:
    """(steps, repeats, batch) sample indices: epochs of shuffles, drawn once and shared by runs."""
    g = torch.Generator().manual_seed(order_seed)
    per_epoch = cfg.samples // cfg.batch
    epochs = -(-cfg.steps // per_epoch)
    perms = torch.stack([torch.stack([torch.randperm(cfg.samples, generator=g) for _ in range(cfg.repeats)])
                         for _ in range(epochs)])  # (epochs, repeats, samples)
    idx = perms[:, :, : per_epoch * cfg.batch].reshape(epochs, cfg.repeats, per_epoch, cfg.batch)
    return idx.permute(0, 2, 1, 3).reshape(epochs * per_epoch, cfg.repeats, cfg.batch)[: cfg.steps]


def train(cfg: Config, dtype: str, order: torch.Tensor, data, reverse: bool = False,
          ema_dtype: str | None = None) -> Run:
    """The model in `dtype` and its EMA in `ema_dtype` (default: the same)."""
    d, e = DTYPES[dtype], DTYPES[ema_dtype or dtype]
    x, y, theta0 = data
    x, y = x.to(d), y.to(d)
    theta = theta0.to(d).clone()
    momenta = [float(m) for m in cfg.momenta]
    zeta = theta.to(e).unsqueeze(0).repeat(len(momenta), 1, 1)
    due_n = torch.zeros(len(momenta), dtype=torch.float64)
    lost_n = torch.zeros(len(momenta), dtype=torch.float64)
    frozen = torch.zeros(len(momenta), dtype=torch.float64)
    gaps = []
    rows = torch.arange(cfg.repeats)[:, None]
    for step in range(cfg.steps):
        idx = order[step].flip(-1) if reverse else order[step]
        xb, yb = x[rows, idx], y[rows, idx]  # (repeats, batch, F), (repeats, batch)
        residual = torch.einsum("rbf,rf->rb", xb, theta) - yb
        theta.add_(torch.einsum("rbf,rb->rf", xb, residual), alpha=-cfg.lr / cfg.batch)
        before = zeta.clone()
        target = theta if e == d else theta.to(e)  # lerp needs one dtype, as in emarule.engine.ema
        for i, m in enumerate(momenta):
            zeta[i].lerp_(target, 1.0 - m)
        due = (before != target).flatten(1)
        lost = (zeta == before).flatten(1) & due
        due_n += due.sum(dim=1)
        lost_n += lost.sum(dim=1)
        frozen += (due.any(dim=1) & ~(due & ~lost).any(dim=1)).double()
        if step >= cfg.steps // 2:
            rel = ((target.float() - before.float()).abs() / before.float().abs().clamp_min(1e-30)).flatten(1)
            gaps.append(torch.where(due, rel, torch.nan))
    gap = torch.cat(gaps, dim=1).nanmedian(dim=1).values
    return Run(theta.float(), zeta.float(), lost_n / due_n.clamp_min(1), frozen / cfg.steps, gap)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max_i |a_i − b_i| over the weights of each repeat: (..., repeats, F) → (..., repeats)."""
    return (a - b).abs().amax(dim=-1)


def study(cfg: Config) -> dict:
    """{run name: Run}: the fp32 reference; for each other dtype the model and EMA held in it, and
    an fp32 model whose EMA alone is held in it (`<dtype>_ema`); the two second FP32 runs."""
    data = problem(cfg)
    order = batches(cfg, cfg.seed + 1)
    runs = {"fp32": train(cfg, "fp32", order, data)}
    for dt in cfg.dtypes:
        if dt != "fp32":
            runs[dt] = train(cfg, dt, order, data)
            runs[f"{dt}_ema"] = train(cfg, "fp32", order, data, ema_dtype=dt)
    runs["fp32_reorder"] = train(cfg, "fp32", order, data, reverse=True)
    runs["fp32_seed"] = train(cfg, "fp32", batches(cfg, cfg.seed + 2), data)
    return runs
