"""DINO's projection head and the student network that runs multi-crop batches (Caron et al. 2021).

`DINOHead` follows facebookresearch/dino's `DINOHead` with its defaults: an MLP of `layers`
Linear layers (in → hidden → … → bottleneck, GELU between, no BatchNorm), trunc-normal(.02)
weights and zero biases, an L2 normalization, then a weight-normalized Linear without bias to
`out_dim` outputs whose row norms are fixed at 1 (`norm_last_layer`, DINO's default; with it off
the norms are learned). `DinoNet` is DINO's `MultiCropWrapper`: crops of one resolution go
through the backbone together, the features of all crops through the head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class WeightNormLinear(nn.Module):
    """y = x Wᵀ with W's rows v_k / |v_k| (× g_k when `learn_norm`): torch's weight_norm (dim 0),
    without the deprecated hook, so a frozen step can read `weight_v` without a gradient."""

    def __init__(self, cin: int, cout: int, learn_norm: bool = False):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(cout, cin))
        # nn.Linear's own init: DINO builds its last layer after its trunc-normal pass.
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))
        self.weight_g = nn.Parameter(torch.ones(cout, 1)) if learn_norm else None

    def forward(self, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        v = self.weight_v.detach() if frozen else self.weight_v
        w = v / v.norm(dim=1, keepdim=True).clamp_min(1e-12)
        if self.weight_g is not None:
            w = w * (self.weight_g.detach() if frozen else self.weight_g)
        return F.linear(x, w)


class DINOHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, hidden: int = 2048, bottleneck: int = 256, layers: int = 3,
                 norm_last_layer: bool = True):
        super().__init__()
        if layers == 1:
            mlp: list[nn.Module] = [nn.Linear(in_dim, bottleneck)]
        else:
            mlp = [nn.Linear(in_dim, hidden), nn.GELU()]
            for _ in range(layers - 2):
                mlp += [nn.Linear(hidden, hidden), nn.GELU()]
            mlp.append(nn.Linear(hidden, bottleneck))
        self.mlp = nn.Sequential(*mlp)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck, out_dim, learn_norm=not norm_last_layer)

    def forward(self, x: torch.Tensor, freeze_last_layer: bool = False) -> torch.Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x, frozen=freeze_last_layer)


class DinoNet(nn.Module):
    """Backbone + DINO head. `forward(groups)` takes a list of crop batches, one per resolution
    (crop-major: all images' crop 1, then crop 2, …), and returns the backbone's [CLS] features and
    the head's outputs for every crop, concatenated in that order."""

    def __init__(self, backbone: nn.Module, head: DINOHead):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, groups: list, freeze_last_layer: bool = False):
        feats = torch.cat([self.backbone(x) for x in groups if x.shape[0]])
        return feats, self.head(feats, freeze_last_layer)
