"""Polyak-Ruppert averaging of a supervised ResNetv2 (§3.2 Fig. 2, App. F.2 and F.3).

The parts handed to the shared loop (`emarule.engine.loop.train`):

- `model`: timm's pre-activation ResNet (`emarule.vision.resnetv2`), BatchNorm, trained with the
  label-smoothed cross-entropy. The loop keeps its EMA ζ (the Polyak-Ruppert average) in float32,
  from θ_t when the spec says `ema.update_from: pre` (the paper's Definition) and with the BatchNorm
  running statistics copied or averaged as `ema.buffers` says. Nothing feeds the EMA back into
  training: `teacher` is None.
- `loss`: cross-entropy with `data.label_smoothing`, in float32 on the logits; it also reports the
  training top-1 and ρ_BN, read from the model's BatchNorm layers (1 − torch's momentum: the
  paper's convention, 0.9 in the recipe, ρ_BN^κ with `norm.bn_scale`).
- one evaluation of the target and the EMA on the validation split: `top1` / `ema_top1` (percent)
  and `val_loss` / `ema_val_loss` (cross-entropy without smoothing), every `eval.every_epochs`.

Data (`data.source`): ImageNet folders from `--data DIR`, or generated textures
(`emarule.vision.textures`) for the `cpu` and `tiny` presets; see `emarule.vision.supervised`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.engine.seeding import mix
from emarule.engine.interface import Evaluation, TaskParts
from emarule.vision import data as D
from emarule.vision import resnetv2 as R
from emarule.vision import supervised as S
from emarule.vision.device_views import training_set
from emarule.vision.models import no_weight_decay_names
from emarule.vision.textures import textures

SOURCES = ("imagenet", "textures")


def load_sources(ctx: RunContext):
    data = ctx.cfg.data
    source, size = data.source, int(data.image_size)
    if source == "imagenet":
        root = ctx.data if ctx.data is not None else (Path(data.path) if data.path else None)
        return D.imagenet(root, size)
    if source == "textures":
        if ctx.data is not None:
            raise UserError(f"--data: {ctx.experiment} with data.source textures generates its images; drop --data, "
                            f"or set data.source=imagenet")
        n_train, n_eval = data.train_samples, data.eval_samples
        noise, seed = float(data.noise), int(data.seed)
        return textures(True, n_train, size, noise, seed), textures(False, n_eval, size, noise, seed)
    raise UserError(f"data.source {source!r}: use {' or '.join(SOURCES)}")


def bn_rho(bns: list) -> float | None:
    """ρ_BN in force (the paper's convention: 1 − torch's BatchNorm momentum), from the model's BatchNorm layers."""
    return None if not bns or bns[0].momentum is None else 1.0 - float(bns[0].momentum)


def make_loss(label_smoothing: float):
    found: list = [None, []]  # (model, its BatchNorm layers): the module walk done once per model, not per step

    def loss(model, teacher, batch, now):
        x, y = batch
        logits = model(x).float()
        value = F.cross_entropy(logits, y, label_smoothing=label_smoothing)
        with torch.no_grad():
            top1 = (logits.argmax(1) == y).float().mean().item() * 100.0
        metrics = {"train_top1": top1}
        if found[0] is not model:
            found[:] = [model, R.batchnorms(model)]
        rho = bn_rho(found[1])
        if rho is not None:
            metrics["bn_momentum"] = rho
        return value, metrics

    return loss


def score(net, batch, now) -> dict:
    x, y = batch
    logits = net(x).float()
    return {"correct": (logits.argmax(1) == y).sum(), "count": len(y),
            "loss_sum": F.cross_entropy(logits, y, reduction="sum")}


def finish(sums: dict) -> dict:
    n = max(1.0, sums["count"])
    return {"top1": 100.0 * sums["correct"] / n, "val_loss": sums["loss_sum"] / n}


def build(ctx: RunContext) -> TaskParts:
    cfg = ctx.cfg
    m = cfg.model
    size = int(cfg.data.image_size)
    train_src, val_src = load_sources(ctx)
    num_classes = int(m.num_classes)
    if train_src.num_classes > num_classes:
        raise UserError(f"the data set has {train_src.num_classes} classes but model.num_classes is {num_classes}; "
                        f"--set model.num_classes={train_src.num_classes}")
    # The same initial weights for every κ and rule at a given seed (the loop seeds the rest).
    torch.manual_seed(mix(ctx.seed, 0x50A))
    arch = m.arch
    model = R.resnetv2(arch, num_classes, width=m.width, layers=m.layers, stem=m.stem,
                       output_stride=int(m.output_stride), init=m.init)
    augmentation = cfg.data.augmentation
    train_set, staged = training_set("supervised", cfg.data.augment_on, train_src, augmentation, size, ctx.seed)
    no_decay = no_weight_decay_names(model) if cfg.optimizer.weight_decay_skip_bias else set()
    evaluation = Evaluation(data=S.EvalViews(val_src, size), score=score, finish=finish,
                            every_epochs=float(cfg.eval.every_epochs), every_base_steps=cfg.eval.every_base_steps)
    info = {
        "task": "polyak",
        "arch": arch,
        "width": m.width,
        "layers": None if m.layers is None else list(m.layers),
        "stem": m.stem,
        "output_stride": int(m.output_stride),
        "parameters": R.parameter_count(model),
        "num_classes": num_classes,
        "dataset": train_src.name,
        "train_size": len(train_src),
        "val_size": len(val_src),
        "image_size": size,
        "augmentation": augmentation,
        "loss": f"cross-entropy, label smoothing {cfg.data.label_smoothing}",
        "ema_buffers": cfg.ema.buffers,
    }
    loss = staged(make_loss(float(cfg.data.label_smoothing)))
    return TaskParts(model=model, train_set=train_set, loss=loss,
                     teacher=None, evaluations=[evaluation], no_decay=no_decay, info=info)
