"""DINO (App. H.11, Caron et al. 2021): a student matches its EMA teacher's distribution over K emergent classes.

The parts handed to the shared loop (`emarule.engine.loop.train`):

- `model` = `DINO`: the `student` (`DinoNet`: ViT backbone + DINO head) and the tracking `probe`.
- `ema_source` = `model.student`: the loop keeps its EMA, the teacher ζ ← ρ^κ ζ + (1 − ρ^κ) θ_{t+1}
  (`ema.update_from: post`), and passes it to `loss`.
- `loss`, the paper's Definition (DINO Update) with multi-crop: the teacher sees the G global crops,
  the student every crop; for each teacher crop a and each student crop v ≠ a,
      H(P_t(a), P_s(v)) = − Σ_k P_t(a)_k log P_s(v)_k,
      P_t = softmax((z_ζ − c) / τ_t),  P_s = softmax(z_θ / τ_s),
  averaged over the pairs and the batch. The paper writes H(student, teacher − c) with
  H(a, b) = − Σ p(a) log p(b), which read literally makes the student's distribution the target;
  DINO's own loss (main_dino.py `DINOLoss`) puts the teacher's distribution first, and so does this.
- `on_step`, the center: c ← ρ_c c + (1 − ρ_c) mean(z_ζ), once per optimizer step, the mean over
  the teacher outputs of the whole global batch (every micro-batch, every rank: the loss returns
  its micro-batch mean as a tensor metric, which the loop averages with the batch weights).
  ρ_c = `dino.center_momentum` from the plan of the stage in force: 0.9 unscaled as in the paper,
  ρ_c^κ with `dino.center_scale: true`. The center is the task state (checkpointed, resumed).
- τ_t warms up linearly from `dino.warmup_teacher_temp` over `dino.warmup_teacher_temp_epochs`
  whole epochs (DINO's schedule, indexed by the integer epoch); the head's last layer takes no
  gradient before `dino.freeze_last_layer_epochs` (DINO's `cancel_gradients_last_layer`).
- the teacher runs in eval mode: DINO builds its teacher without stochastic depth.
- the tracking probe (`emarule.vision.probe`) reads the teacher's [CLS] features of the global crops;
  `probe_top1` is evaluated on the teacher only.

Data (`data.source`): CIFAR-10 from `--data DIR` (torchvision's pickled layout), ImageNet folders,
scikit-learn's digits (the `cpu`/`tiny` presets) or synthetic images; each item is a pure function
of (seed, epoch, index) — see `emarule.vision.multicrop`.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from emarule.vision import probe as P
from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.config.typed import Config
from emarule.engine.interface import TaskParts
from emarule.vision import models as M
from emarule.vision.data import load_sources
from emarule.vision.dino_head import DINOHead, DinoNet
from emarule.vision.device_views import training_set


class DINO(nn.Module):
    """The trained model: the student, and the tracking probe's module (trained by its own Adam)."""

    def __init__(self, student: DinoNet, probe: nn.Module):
        super().__init__()
        self.student = student
        self.probe = probe


def dino_cross_entropy(student_logits: torch.Tensor, teacher_probs: torch.Tensor, n_global: int,
                       n_crops: int) -> torch.Tensor:
    """Mean over pairs (teacher crop a, student crop v ≠ a) of the batch mean of
    −Σ_k q_a,k log softmax(s_v)_k. Rows are crop-major: crop 1 of every image, then crop 2, …;
    `student_logits` are already divided by the student temperature."""
    s = student_logits.float().chunk(n_crops)
    q = teacher_probs.float().chunk(n_global)
    total, terms = student_logits.new_zeros((), dtype=torch.float32), 0
    for a, qa in enumerate(q):
        for v, sv in enumerate(s):
            if v == a:
                continue
            total = total + torch.sum(-qa * F.log_softmax(sv, dim=-1), dim=-1).mean()
            terms += 1
    if terms == 0:
        raise UserError("dino: no (teacher crop, other student crop) pair; use data.global_crops ≥ 2 or local crops")
    return total / terms


def teacher_temperature(epoch: float, warmup_temp: float, temp: float, warmup_epochs: int) -> float:
    """DINO's schedule: np.linspace(warmup_temp, temp, W)[e] for the integer epoch e < W, then temp."""
    e, w = int(math.floor(epoch + 1e-9)), int(warmup_epochs)
    if e >= w:
        return float(temp)
    return float(warmup_temp) if w == 1 else float(warmup_temp + (temp - warmup_temp) * e / (w - 1))


class Center:
    """The EMA of the teacher's mean output, moved once per optimizer step: the task state."""

    def __init__(self, dim: int):
        self.value = torch.zeros(dim)
        self.updates = 0

    def on(self, device: torch.device) -> torch.Tensor:
        if self.value.device != device:
            self.value = self.value.to(device)
        return self.value

    def step(self, batch_mean: torch.Tensor, momentum: float) -> None:
        c = self.on(batch_mean.device)
        self.value = (momentum * c.double() + (1.0 - momentum) * batch_mean.double()).float()
        self.updates += 1

    def state_dict(self) -> dict:
        return {"value": self.value.detach().cpu().clone(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.updates = state["value"].clone().float(), int(state["updates"])


class TaskState:
    """What a resume needs besides the weights: the center and the probe's Adam moments."""

    def __init__(self, center: Center, probe: P.TrackingProbe):
        self.center, self.probe = center, probe

    def state_dict(self) -> dict:
        return {"center": self.center.state_dict(), "probe": self.probe.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.center.load_state_dict(state["center"])
        self.probe.load_state_dict(state["probe"])


@contextlib.contextmanager
def eval_mode(module: nn.Module):
    was = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was)


def crop_major(x: torch.Tensor) -> torch.Tensor:
    """B×C×… (C crops per image) → (C·B)×…: crop 1 of every image, then crop 2, …"""
    return x.transpose(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def make_loss(cfg: Config, center: Center, probe: P.TrackingProbe, n_global: int, n_local: int):
    d = cfg.dino
    student_temp = float(d.student_temp)
    temps = (float(d.warmup_teacher_temp), float(d.teacher_temp), int(d.warmup_teacher_temp_epochs))
    freeze_epochs = float(d.freeze_last_layer_epochs)
    n_crops = n_global + n_local

    def loss(model: DINO, teacher: DinoNet, batch, now):
        glob, loc, y = batch
        g = crop_major(glob)
        groups = [g, crop_major(loc)] if n_local else [g]
        tau = teacher_temperature(now.epoch, *temps)
        with torch.no_grad(), eval_mode(teacher):
            t_feat, t_out = teacher([g])
        _, s_out = model.student(groups, freeze_last_layer=now.epoch + 1e-9 < freeze_epochs)
        t_out = t_out.float()
        q = F.softmax((t_out - center.on(t_out.device)) / tau, dim=-1)
        l_dino = dino_cross_entropy(s_out.float() / student_temp, q, n_global, n_crops)
        with torch.no_grad():
            entropy = -(q * q.clamp_min(1e-30).log()).sum(-1).mean()
        metrics = {"dino_loss": l_dino.item(), "teacher_temp": tau,
                   "center_momentum": float(now.plan["dino.center_momentum"]),
                   "teacher_entropy": entropy.item(),
                   "teacher_mean": t_out.mean(0).detach()}  # a tensor: averaged over the global batch
        metrics.update(probe.train_metrics(t_feat, y.repeat(n_global)))
        return l_dino, metrics

    return loss


def build(ctx: RunContext) -> TaskParts:
    cfg = ctx.cfg
    data, m = cfg.data, cfg.model
    arch = m.arch
    size, local_size = int(data.image_size), int(data.local_size)
    n_global, n_local = int(data.global_crops), int(data.local_crops)
    if n_global < 2 and n_local == 0:
        raise UserError("dino: one global crop and no local crops leave no pair to compare; "
                        "use data.global_crops=2 or data.local_crops ≥ 1")
    root = ctx.data if ctx.data is not None else (Path(data.path) if data.path else None)
    train_src, test_src = load_sources(data.source, root, size, data.train_samples, data.eval_samples,
                                       int(data.num_classes))
    num_classes = max(int(data.num_classes), train_src.num_classes)
    augmentation = data.augmentation
    train_set, staged = training_set("multi_crop", data.augment_on, train_src, augmentation, size, local_size,
                                     ctx.seed, n_global, n_local, data.global_scale, data.local_scale)

    torch.manual_seed(ctx.seed)  # the same initial weights for every κ and rule at a given seed
    dims = {"embed_dim": m.embed_dim, "depth": m.depth, "num_heads": m.heads}
    bb = M.backbone(arch, image_size=size, patch_size=m.patch_size, stochastic_depth=m.stochastic_depth,
                    init=m.init, vit_dims=dims, dynamic_img_size=n_local > 0 and local_size != size)
    head = DINOHead(bb.num_features, int(m.out_dim), int(m.head_hidden), int(m.bottleneck), int(m.head_layers),
                    bool(m.norm_last_layer))
    probe = P.TrackingProbe.from_spec(cfg, bb.num_features, num_classes, len(train_src))
    model = DINO(DinoNet(bb, head), probe.module)
    center = Center(head.last_layer.weight_v.shape[0])

    def on_step(now, reduced):
        center.step(reduced["teacher_mean"], float(now.plan["dino.center_momentum"]))
        probe.step(now, reduced)

    # DINO's get_params_groups: no decay on biases and norm parameters (ndim ≤ 1) only; its
    # [CLS] token and position embedding are decayed.
    params = dict(model.student.named_parameters(prefix="student"))
    no_decay = ({n for n, p in params.items() if p.ndim <= 1}
                if cfg.optimizer.weight_decay_skip_bias else set())
    info = {
        "task": "dino", "arch": arch, "embed_dim": bb.num_features,
        "depth": len(getattr(bb, "blocks", [])) or None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "backbone_parameters": sum(p.numel() for p in bb.parameters()),
        "head_parameters": sum(p.numel() for p in head.parameters()),
        "dataset": train_src.name, "train_size": len(train_src), "test_size": len(test_src),
        "global_crops": f"{n_global} × {size}px", "local_crops": f"{n_local} × {local_size}px",
        "augmentation": augmentation, "probe": probe.describe(),
        "loss": "mean over (teacher global crop a, student crop v ≠ a) of H(softmax((z_ζ(a) − c)/τ_t), "
                "softmax(z_θ(v)/τ_s)); the probe trains on its own (emarule/vision/probe.py)",
    }
    evaluation = P.probe_evaluation(model.probe, lambda teacher, x: teacher.backbone(x), test_src, size,
                                    float(cfg.eval.every_epochs), cfg.eval.every_base_steps)
    loss = staged(make_loss(cfg, center, probe, n_global, n_local))
    return TaskParts(model=model, ema_source=model.student, train_set=train_set, loss=loss, evaluations=[evaluation],
                     on_step=on_step, state=TaskState(center, probe), progress_metric="dino_loss",
                     no_decay=no_decay, info=info)
