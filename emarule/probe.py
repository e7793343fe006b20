"""The tracking probe of every self-supervised task (the paper's Definition "Tracking Probe"): a
pre-BN linear probe on the StopGrad teacher representation, trained alongside the run by an
optimizer of its own that stays stable at every κ.

Why its own optimizer. The probe used to be a parameter group of the run's optimizer, so under an
SGD or LARS recipe it took plain heavy-ball steps at κ × its base lr. Its loss is a softmax
cross-entropy on BatchNorm-normalized features, whose curvature does not shrink as the batch
grows: measured on byol-r18 `cpu` teachers, λ_max of the probe's Hessian is 4–8, so heavy-ball
(μ = 0.9) is stable only below lr = 2(1 + μ)/λ ≈ 0.5–0.9. The preset's probe lr 0.3 sat inside
that at κ = 1; at κ = 8 the SGD Scaling Rule made it 2.4, and `probe_loss` oscillated up to 13
(chance is ln 10 = 2.3). The SGD rule holds only while κηλ ≪ 1, and a probe's λ is set by its
normalized input, not by the batch: every linear-rule SGD probe breaks at some κ.

The mechanism, the same for every task (BYOL, DINO):
- Adam, under the Adam Scaling Rule like any Adam in a recipe: lr √κ · `probe.lr`, β̂ = 1 − κ(1 − β)
  (clamped at 0 beyond κ = 10, where β1 = 0.9 would turn negative), ε/√κ; no weight decay. Adam's
  step is the gradient divided by its own running scale, so its size is set by the learning rate,
  not by the loss's curvature or the gradient's size: a larger κ moves the probe faster but cannot
  make it oscillate out of control. `probe.lr` is an Adam learning rate at `batch.size`.
- The learning rate follows the run's schedule shape (warm-up, then the decay), so the probe
  settles at the end. The BatchNorm running statistics move with momentum 0.9^κ per step (the
  EMA Scaling Rule), so they average the same amount of data at every κ.
- It is no parameter of the run's optimizer: it never shares a learning rate, a scaling rule, a
  clipping budget or a gradient norm with the network it measures. Each micro-batch returns the
  probe's gradient and feature moments as tensor metrics (`probe/grad`, `probe/mean`, `probe/sq`);
  the loop averages them over the global batch (micro-batches and ranks included), and `step`
  applies them once per optimizer step, identically on every rank (`TaskParts.on_step`).
- Weights, Adam moments, step count and running statistics are buffers of this module, which sits
  inside the task's model (not in `ema_source`): they move to the device, are broadcast and
  checkpointed with the model and resume exactly; the run's optimizer and the EMAs never see them.

Use in a task: put the `TrackingProbe` in the model; in `loss`, merge
`probe.train_metrics(features, labels)` into the returned metrics; in `on_step`, call
`probe.step(now, reduced)`; evaluate with `probe_evaluation(...)` (`probe_top1`, teacher only).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from emarule import schedules
from emarule.spec import get
from emarule.tasks.parts import Evaluation

BETAS = (0.9, 0.999)  # Adam's defaults, at the base batch
EPS = 1e-8
BN_RHO = 0.9  # torch BatchNorm's running-statistics momentum (1 − 0.1) at the base batch
BN_EPS = 1e-5


def adam_rule(kappa: float, lr: float) -> tuple[float, float, float, float]:
    """(lr, β1, β2, ε) of the probe's Adam at κ: the Adam Scaling Rule, β clamped at 0."""
    b1, b2 = (max(0.0, 1.0 - kappa * (1.0 - b)) for b in BETAS)
    return lr * math.sqrt(kappa), b1, b2, EPS / math.sqrt(kappa)


class TrackingProbe(nn.Module):
    """Pre-BN linear probe: BatchNorm without affine terms, then [W | b]; trained by its own Adam.

    `lr` is `probe.lr` (Adam, at the base batch); `shape(epoch)` is the run's learning-rate
    schedule divided by its peak (1 throughout when None).
    """

    def __init__(self, features: int, num_classes: int, lr: float, shape: Callable[[float], float] | None = None):
        super().__init__()
        bound = 1.0 / math.sqrt(features)  # nn.Linear's default initialization
        self.register_buffer("theta", torch.empty(num_classes, features + 1).uniform_(-bound, bound))
        self.register_buffer("exp_avg", torch.zeros(num_classes, features + 1))
        self.register_buffer("exp_avg_sq", torch.zeros(num_classes, features + 1))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.base_lr = float(lr)
        self.shape = shape or (lambda epoch: 1.0)
        self.features, self.num_classes = features, num_classes

    @classmethod
    def from_spec(cls, spec: dict, features: int, num_classes: int, dataset_size: float) -> "TrackingProbe":
        """`probe.lr` and the run's schedule shape (`schedule.*`, over `dataset_size` per epoch)."""
        sched = schedules.from_spec(spec, dataset_size)
        return cls(features, num_classes, float(get(spec, "probe.lr")), lambda e: sched.shape(e, 1.0))

    @property
    def module(self) -> "TrackingProbe":
        """The module to hold in the task's model (the probe itself)."""
        return self

    def describe(self) -> str:
        return (f"pre-BN linear probe on the StopGrad teacher representation ({self.features} → "
                f"{self.num_classes}), its own Adam: lr √κ·{self.base_lr:g} × the run's schedule shape, "
                f"β̂ = 1 − κ(1 − β), outside the run's optimizer (emarule/probe.py)")

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.theta[:, :-1].T + self.theta[:, -1]

    def train_metrics(self, h: torch.Tensor, y: torch.Tensor) -> dict:
        """The probe's loss on one micro-batch of teacher features `h` (no gradient reaches them),
        and its gradient and feature moments as tensor metrics for `step`.

        BatchNorm in training mode normalizes with this micro-batch's statistics, as the model's
        own unsynchronized BatchNorm layers do. The cross-entropy's gradient is written out:
        d/dlogits = (softmax − onehot) / n, and d/d[W | b] = its transpose times [x̂ | 1].
        """
        with torch.no_grad(), torch.autocast(device_type=h.device.type, enabled=False):
            x = h.detach().float()
            mean, sq = x.mean(0), (x * x).mean(0)
            xn = (x - mean) / torch.sqrt((sq - mean * mean).clamp_min(0.0) + BN_EPS)
            logits = self._logits(xn)
            loss = torch.nn.functional.cross_entropy(logits, y)
            d = torch.softmax(logits, 1)
            d[torch.arange(len(y), device=y.device), y] -= 1.0
            d /= len(y)
            grad = torch.cat([d.T @ xn, d.sum(0)[:, None]], 1)
            top1 = (logits.argmax(1) == y).float().mean()
        return {"probe_loss": loss.item(), "probe_train_top1": 100.0 * top1.item(),
                "probe/grad": grad, "probe/mean": mean, "probe/sq": sq}

    def lr(self, epoch: float, kappa: float) -> float:
        return adam_rule(kappa, self.base_lr)[0] * self.shape(epoch)

    @torch.no_grad()
    def step(self, now, reduced: dict) -> None:
        """One Adam step from the global batch's mean gradient; the running statistics."""
        _, b1, b2, eps = adam_rule(now.kappa, self.base_lr)
        g = reduced["probe/grad"].to(self.theta.dtype)
        self.steps += 1
        t = int(self.steps)
        self.exp_avg.mul_(b1).add_(g, alpha=1.0 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        # bias corrections with the β in force, as torch's Adam computes them
        denom = (self.exp_avg_sq / (1.0 - b2**t)).sqrt_().add_(eps)
        self.theta.addcdiv_(self.exp_avg, denom, value=-self.lr(now.epoch, now.kappa) / (1.0 - b1**t))
        mean = reduced["probe/mean"].to(self.running_mean.dtype)
        var = (reduced["probe/sq"].to(self.running_var.dtype) - mean * mean).clamp_min(0.0)
        keep = BN_RHO**now.kappa
        self.running_mean.mul_(keep).add_(mean, alpha=1.0 - keep)
        self.running_var.mul_(keep).add_(var, alpha=1.0 - keep)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits at evaluation, normalized with the running statistics (a linear map)."""
        x = h.float()
        return self._logits((x - self.running_mean) / torch.sqrt(self.running_var + BN_EPS))


class EvalImages:
    """A test split's evaluation views and labels; small splits (digits, CIFAR-10) prepared once."""

    def __init__(self, source, image_size: int):
        self.source, self.size = source, image_size
        self.cache = [None] * len(source) if len(source) <= 20000 else None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        if self.cache is not None and self.cache[i] is not None:
            return self.cache[i]
        item = (self.source.eval_view(i, self.size), self.source.label(i))
        if self.cache is not None:
            self.cache[i] = item
        return item


def probe_evaluation(probe: TrackingProbe, represent: Callable, source, image_size: int,
                     every_epochs: float | None = 1.0, every_base_steps: float | None = None,
                     batch_size: int = 256) -> Evaluation:
    """`probe_top1` on `source`'s evaluation views: the teacher's representation
    `represent(teacher, x)` through the probe. It measures the teacher, so only the teacher is
    evaluated."""

    def score(teacher: nn.Module, batch, now):
        x, y = batch
        h = represent(teacher, x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            correct = (probe(h.float()).argmax(1) == y).sum()
        return {"correct": correct, "count": len(y)}

    return Evaluation(data=EvalImages(source, image_size), score=score, models="teacher", batch_size=batch_size,
                      finish=lambda s: {"probe_top1": 100.0 * s["correct"] / max(1.0, s["count"])},
                      every_epochs=every_epochs, every_base_steps=every_base_steps)
