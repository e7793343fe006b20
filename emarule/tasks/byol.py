"""BYOL (§3.4, App. H): an online network learns to predict an EMA teacher's projection.

The parts handed to the shared loop (`emarule.engine.loop.train`):

- `model` = `BYOL`: the online network (`online` = backbone + projector) and the `predictor`,
  trained by the run's optimizer, and the tracking `probe` (`emarule.vision.probe.TrackingProbe`: a
  pre-BN linear probe with its own Adam, stepped in `on_step`, outside the run's optimizer).
- `ema_source` = `model.online`: the loop keeps its EMA (the teacher ζ, updated from θ_{t+1} as
  the spec's `ema.update_from: post` says) and passes it to `loss` as the teacher.
- `loss`: the paper's Definition (BYOL Update),
      L = ½ cos[q(z(x1)), StopGrad(z_ζ(x2))] + ½ cos[q(z(x2)), StopGrad(z_ζ(x1))],
  cos(a, b) = 1 − a·b / (|a||b|). The probe's cross-entropy on the StopGrad teacher
  representation of both views (Definition: Tracking Probe, "a probe for the teacher") is
  computed alongside and trains only the probe. The teacher computes with batch statistics, as
  BYOL's target network does, without touching its running statistics.
- one evaluation, `probe_top1`: the probe's top-1 on the test split through the teacher (eval
  mode), at the cadence `eval.every_epochs`.

Data (`data.source`): CIFAR-10 from `--data DIR` (torchvision layout), ImageNet folders at
`--data DIR/{train,val}`, scikit-learn's digits (bundled, the `cpu`/`tiny` presets), or
synthetic images; each training item (view1, view2, label) is a pure function of
(seed, epoch, index) — see `emarule.vision.augment`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule.vision.probe import TrackingProbe, probe_evaluation
from emarule.engine.interface import TaskParts
from emarule.vision import models as M
from emarule.vision.data import load_sources
from emarule.vision.device_views import training_set


class Online(nn.Module):
    """Backbone f(·; θ) followed by projector; returns (representation h, projection z)."""

    def __init__(self, backbone: nn.Module, projector: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x):
        h = self.backbone(x)
        return h, self.projector(h)


class BYOL(nn.Module):
    def __init__(self, backbone: nn.Module, proj_hidden: int, proj_out: int, pred_hidden: int,
                 probe: TrackingProbe, head_norm: str = "batchnorm", out_bias: bool = True):
        super().__init__()
        feat = backbone.num_features
        self.online = Online(backbone, M.mlp(feat, proj_hidden, proj_out, head_norm, out_bias))
        self.predictor = M.mlp(proj_out, pred_hidden, proj_out, head_norm, out_bias)
        self.probe = probe.module  # frozen here: trained by its own Adam (emarule.vision.probe)
        self.num_features = feat


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 − a·b / (|a||b|), per row, computed in float32."""
    return 1.0 - F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)


def byol_loss(p1, p2, t1, t2, scale: float = 1.0) -> torch.Tensor:
    """Symmetrized BYOL loss: ½cos(p1, sg t2) + ½cos(p2, sg t1), averaged over the batch, times `scale`
    (1: the paper's Definition; 4: BYOL's own, ‖p̂ − t̂‖² = 2 − 2 cos similarity per view, summed over both,
    whose scale a LARS step sees through the layers it does not adapt and through the weight decay)."""
    return scale * (0.5 * cosine_distance(p1, t2.detach()) + 0.5 * cosine_distance(p2, t1.detach())).mean()


@contextlib.contextmanager
def batch_statistics(module: nn.Module):
    """Forward `module` with its BatchNorm layers in train mode (they normalize with the batch's statistics,
    as BYOL's target network does) while their running statistics stay untouched (momentum 0 for the
    duration). Everything else is in eval mode: a ViT teacher built with stochastic depth or dropout gives
    its targets without them, since BYOL's target network has no stochastic layers."""
    was = {m: m.training for m in module.modules()}
    saved = []
    module.train(False)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            saved.append((m, m.momentum))
            m.momentum = 0.0
            m.train(True)
    try:
        yield module
    finally:
        for m, mom in saved:
            m.momentum = mom
        for m, training in was.items():
            m.training = training


def make_loss(probe: TrackingProbe, scale: float = 1.0):
    def loss(model: BYOL, teacher: nn.Module, batch, now=None):
        x1, x2, y = batch
        # Each view through the online network separately (BatchNorm per view, as in BYOL).
        _, z1 = model.online(x1)
        _, z2 = model.online(x2)
        p1, p2 = model.predictor(z1), model.predictor(z2)
        with torch.no_grad(), batch_statistics(teacher):
            th1, t1 = teacher(x1)
            th2, t2 = teacher(x2)
        l_byol = byol_loss(p1, p2, t1, t2, scale)
        # The tracking probe on the StopGrad teacher representation of both views: its gradient
        # goes to `on_step` as a tensor metric, never into this loss.
        metrics = probe.train_metrics(torch.cat([th1, th2]), torch.cat([y, y]))
        return l_byol, {"byol_loss": l_byol.item(), **metrics}

    return loss


def build(ctx: RunContext) -> TaskParts:
    cfg = ctx.cfg
    data, m = cfg.data, cfg.model
    arch, image_size, source = m.arch, int(data.image_size), data.source
    root = ctx.data if ctx.data is not None else (Path(data.path) if data.path else None)
    train_src, test_src = load_sources(source, root, image_size, data.train_samples, data.eval_samples,
                                       int(data.num_classes))
    num_classes = max(int(data.num_classes), train_src.num_classes)
    augmentation = data.augmentation
    train_set, staged = training_set("two_views", data.augment_on, train_src, augmentation, image_size, ctx.seed)

    # Same initial weights for every κ and rule at a given seed (the loop seeds the rest).
    torch.manual_seed(ctx.seed)
    init = m.init
    dims = {"embed_dim": m.embed_dim, "depth": m.depth, "num_heads": m.heads}
    bb = M.backbone(arch, width=m.width, cifar_stem=bool(m.cifar_stem), image_size=image_size,
                    patch_size=m.patch_size, stochastic_depth=m.stochastic_depth, init=init, vit_dims=dims,
                    layers=m.layers)
    if cfg.probe.kind != "pre-bn":
        raise UserError(f"probe.kind {cfg.probe.kind!r}: only the pre-bn linear probe (the paper's) is "
                        f"implemented; drop probe.kind")
    probe = TrackingProbe.from_spec(cfg, bb.num_features, num_classes, len(train_src))
    model = BYOL(bb, int(m.projector_hidden), int(m.projector_out), int(m.predictor_hidden), probe, m.head_norm,
                 bool(m.head_out_bias))
    # Projector and predictor get the recipe's init too.
    M.init_weights(model.online.projector, init)
    M.init_weights(model.predictor, init)

    no_decay = M.no_weight_decay_names(model) if cfg.optimizer.weight_decay_skip_bias else set()
    scale = float(cfg.byol.loss_scale)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {
        "task": "byol",
        "arch": arch,
        "width": m.width,
        "layers": None if m.layers is None else list(m.layers),
        "cifar_stem": bool(m.cifar_stem),
        "feature_dim": model.num_features,
        "parameters": n_params,
        "backbone_parameters": sum(p.numel() for p in bb.parameters()),
        "dataset": train_src.name,
        "train_size": len(train_src),
        "test_size": len(test_src),
        "image_size": image_size,
        "augmentation": augmentation,
        "head_norm": m.head_norm,
        "probe": probe.describe(),
        "head_out_bias": bool(m.head_out_bias),
        "loss": (f"{scale:g} × " if scale != 1 else "") + "(½cos(q(z1), sg z'2) + ½cos(q(z2), sg z'1)); the probe's "
                "cross-entropy trains the probe only",
    }
    evaluation = probe_evaluation(probe.module, lambda teacher, x: teacher(x)[0], test_src, image_size,
                                  float(cfg.eval.every_epochs), cfg.eval.every_base_steps)
    loss = staged(make_loss(probe, scale))
    return TaskParts(model=model, ema_source=model.online, train_set=train_set, loss=loss,
                     evaluations=[evaluation], on_step=probe.step, state=probe, progress_metric="byol_loss",
                     no_decay=no_decay, info=info)
