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
  probe's gradient and feature moments as tensor metrics (`probe_grad/*`, `probe_stat/*`);
  the loop averages them over the global batch (micro-batches and ranks included), and `step`
  applies them once per optimizer step, identically on every rank (`TaskParts.on_step`).
- The probe's module (`probe.module`: BatchNorm without affine terms, then Linear) sits inside the
  task's model, its parameters frozen (`requires_grad=False`): it moves to the device, is
  broadcast and checkpointed with the model, and the run's optimizer, clipping and EMAs skip it.
  Its Adam moments and step count are the task's state (`TaskParts.state`), so a run resumes
  exactly.

Use in a task: put `probe.module` in the model; in `loss`, merge `probe.train_metrics(features,
labels)` into the returned metrics; in `on_step`, call `probe.step(now, reduced)`; hand `probe` (or
an object whose state includes `probe.state_dict()`) to `TaskParts.state`; evaluate with
`probe_evaluation(probe.module, ...)` (`probe_top1`, the teacher only).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from emarule.engine import schedules
from emarule.config.typed import Config, config_of
from emarule.engine.interface import Evaluation

BETAS = (0.9, 0.999)  # Adam's defaults, at the base batch
EPS = 1e-8
BN_RHO = 0.9  # torch BatchNorm's running-statistics momentum (1 − 0.1) at the base batch
GRADS = ("probe_grad/weight", "probe_grad/bias")


def adam_hyperparameters(base_lr: float, kappa: float) -> tuple[float, float, float, float]:
    """(lr, β1, β2, ε) of the probe's Adam at κ: the Adam Scaling Rule, each β clamped at 0."""
    b1, b2 = (max(0.0, 1.0 - kappa * (1.0 - b)) for b in BETAS)
    return base_lr * math.sqrt(kappa), b1, b2, EPS / math.sqrt(kappa)


class ProbeModule(nn.Module):
    """The pre-BN linear probe: BatchNorm1d without affine terms, then Linear (a linear map at
    evaluation). Its parameters are frozen for the run's optimizer; `TrackingProbe` trains them."""

    def __init__(self, features: int, num_classes: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(features, affine=False)
        self.fc = nn.Linear(features, num_classes)
        for p in self.fc.parameters():
            p.requires_grad_(False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(h))

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """Logits normalized with the running statistics, whatever the module's mode."""
        x = (h.float() - self.bn.running_mean) / torch.sqrt(self.bn.running_var + self.bn.eps)
        return self.fc(x)


class TrackingProbe:
    """A `ProbeModule` and its own Adam (module docstring). `base_lr` is `probe.lr`, an Adam
    learning rate at the base batch; `shape(epoch)` is the run's learning-rate schedule over its
    peak (1 throughout when None)."""

    def __init__(self, features: int, num_classes: int, base_lr: float, shape: Callable[[float], float] | None = None):
        self.module = ProbeModule(features, num_classes)
        self.base_lr = float(base_lr)
        self.shape = shape or (lambda epoch: 1.0)
        self.steps = 0
        self.exp_avg: dict = {}
        self.exp_avg_sq: dict = {}

    @classmethod
    def from_spec(cls, cfg: Config | dict, features: int, num_classes: int, dataset_size: float) -> "TrackingProbe":
        """`probe.lr` and the run's schedule shape (`schedule.*`, over `dataset_size` per epoch), from the typed
        config (or the spec)."""
        cfg = config_of(cfg)
        sched = schedules.from_spec(cfg, dataset_size)
        return cls(features, num_classes, float(cfg.probe.lr), lambda e: sched.shape(e, 1.0))

    def describe(self) -> str:
        fc = self.module.fc
        return (f"pre-BN linear probe on the StopGrad teacher representation ({fc.in_features} → "
                f"{fc.out_features}), its own Adam outside the run's optimizer: lr √κ·{self.base_lr:g} × the "
                f"run's schedule shape, β̂ = 1 − κ(1 − β) (emarule/vision/probe.py)")

    def train_metrics(self, h: torch.Tensor, y: torch.Tensor) -> dict:
        """The probe's loss on one micro-batch of teacher features `h` (no gradient reaches them),
        and, as tensor metrics for `step`, its gradient and the features' first two moments.

        BatchNorm in training mode normalizes with this micro-batch's statistics, as the model's
        own unsynchronized BatchNorm layers do. The cross-entropy's gradient is written out:
        d/dlogits = (softmax − onehot) / n, then d/dW = d/dlogitsᵀ x̂ and d/db = Σ d/dlogits.
        """
        fc = self.module.fc
        with torch.no_grad(), torch.autocast(device_type=h.device.type, enabled=False):
            x = h.detach().float()
            mean, sq = x.mean(0), (x * x).mean(0)
            xn = (x - mean) / torch.sqrt((sq - mean * mean).clamp_min(0.0) + self.module.bn.eps)
            logits = fc(xn)
            loss = torch.nn.functional.cross_entropy(logits, y)
            d = torch.softmax(logits, 1)
            d[torch.arange(len(y), device=y.device), y] -= 1.0
            d /= len(y)
            top1 = (logits.argmax(1) == y).float().mean()
        return {"probe_loss": loss.item(), "probe_train_top1": 100.0 * top1.item(),
                "probe_grad/weight": d.T @ xn, "probe_grad/bias": d.sum(0),
                "probe_stat/mean": mean, "probe_stat/sq": sq}

    def lr(self, epoch: float, kappa: float) -> float:
        return adam_hyperparameters(self.base_lr, kappa)[0] * self.shape(epoch)

    @torch.no_grad()
    def step(self, now, reduced: dict) -> None:
        """One Adam step from the global batch's mean gradient (`reduced`, as `on_step` gets it),
        and the BatchNorm running statistics from the global batch's moments."""
        _, b1, b2, eps = adam_hyperparameters(self.base_lr, now.kappa)
        lr = self.lr(now.epoch, now.kappa)
        self.steps += 1
        t = self.steps
        fc = self.module.fc
        for name, p in zip(GRADS, (fc.weight, fc.bias), strict=True):
            g = reduced[name].to(p.dtype)
            m = self.exp_avg.setdefault(name, torch.zeros_like(p))
            v = self.exp_avg_sq.setdefault(name, torch.zeros_like(p))
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            # bias corrections with the β in force, as torch's Adam computes them
            p.addcdiv_(m, (v / (1.0 - b2**t)).sqrt_().add_(eps), value=-lr / (1.0 - b1**t))
        if "probe_stat/mean" in reduced:
            bn = self.module.bn
            mean = reduced["probe_stat/mean"].to(bn.running_mean.dtype)
            var = (reduced["probe_stat/sq"].to(bn.running_var.dtype) - mean * mean).clamp_min(0.0)
            keep = BN_RHO**now.kappa  # the EMA Scaling Rule: the same data averaged at every κ
            bn.running_mean.mul_(keep).add_(mean, alpha=1.0 - keep)
            bn.running_var.mul_(keep).add_(var, alpha=1.0 - keep)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "exp_avg": dict(self.exp_avg), "exp_avg_sq": dict(self.exp_avg_sq)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.exp_avg = {k: v.clone() for k, v in state["exp_avg"].items()}
        self.exp_avg_sq = {k: v.clone() for k, v in state["exp_avg_sq"].items()}


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


def probe_evaluation(module: ProbeModule, represent: Callable, source, image_size: int,
                     every_epochs: float | None = 1.0, every_base_steps: float | None = None,
                     batch_size: int = 256) -> Evaluation:
    """`probe_top1` on `source`'s evaluation views: the teacher's representation
    `represent(teacher, x)` through the probe. It measures the teacher, so only the teacher is
    evaluated."""

    def score(teacher: nn.Module, batch, now):
        x, y = batch
        h = represent(teacher, x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            correct = (module.predict(h).argmax(1) == y).sum()
        return {"correct": correct, "count": len(y)}

    return Evaluation(data=EvalImages(source, image_size), score=score, models="teacher", batch_size=batch_size,
                      finish=lambda s: {"probe_top1": 100.0 * s["correct"] / max(1.0, s["count"])},
                      every_epochs=every_epochs, every_base_steps=every_base_steps)
