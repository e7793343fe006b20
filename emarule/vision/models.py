"""Backbones and heads for BYOL.

- ``resnet18`` / ``resnet34``: our ResNet with a `width` (base channels, 64 in He et al.) and,
  with `cifar_stem`, the 32×32 adaptation: a 3×3 stride-1 stem and no max-pool.
- ``resnet50``: torchvision's ResNet-50 (ImageNet stem), classifier removed (2048 features); with a
  `width` other than 64 or `cifar_stem`, our ResNet with the same bottleneck blocks (3, 4, 6, 3)
  and 32 × width features (the narrow ResNet-50 of byol-r50-lars's cpu/tiny presets).
- ``vit_*``: timm's Vision Transformers (e.g. ``vit_base_patch16_224``), classifier removed,
  stochastic depth from `model.stochastic_depth`, timm's trunc-normal(0.02) initialization.
- ``mlp``: Linear → BatchNorm1d → ReLU → Linear, BYOL's projector and predictor.
- ``LinearProbe``: the pre-BN tracking probe, BatchNorm1d without affine terms then Linear.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from emarule.errors import UserError


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1×1 → 3×3 (the stride, as torchvision's v1.5) → 1×1, `cout` = 4 × inner."""

    expansion = 4

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        mid = cout // self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18/34 (basic blocks, 8 × width features) or ResNet-50 (bottlenecks, 32 × width),
    returning the pooled features."""

    def __init__(self, blocks=(2, 2, 2, 2), width: int = 64, cifar_stem: bool = True, in_channels: int = 3,
                 block: type = BasicBlock):
        super().__init__()
        if cifar_stem:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True))
        else:
            self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for stage, n in enumerate(blocks):
            cout = width * 2**stage * getattr(block, "expansion", 1)
            for b in range(n):
                layers.append(block(cin, cout, 2 if (stage > 0 and b == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = cin

    def forward(self, x):
        return torch.flatten(self.pool(self.layers(self.stem(x))), 1)


def mlp(cin: int, hidden: int, cout: int, norm: str = "batchnorm", out_bias: bool = True) -> nn.Sequential:
    if norm == "batchnorm":
        n = nn.BatchNorm1d(hidden)
    elif norm == "layernorm":
        n = nn.LayerNorm(hidden)
    elif norm == "none":
        n = nn.Identity()
    else:
        raise UserError(f"model.head_norm {norm!r}: use batchnorm, layernorm or none")
    return nn.Sequential(nn.Linear(cin, hidden), n, nn.ReLU(inplace=True), nn.Linear(hidden, cout, bias=out_bias))


class LinearProbe(nn.Module):
    """Pre-BN linear probe: BatchNorm1d(affine=False) then Linear (still linear at test time)."""

    def __init__(self, features: int, num_classes: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(features, affine=False)
        self.fc = nn.Linear(features, num_classes)

    def forward(self, h):
        return self.fc(self.bn(h))


def _init_layers(module: nn.Module, weight: Callable[[torch.Tensor], None]) -> None:
    """`weight(w)` for every conv and linear weight; zero biases; BatchNorm/LayerNorm/GroupNorm scale 1, shift 0."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            weight(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
            if getattr(m, "weight", None) is not None:
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def kaiming_uniform_(module: nn.Module) -> None:
    """He et al. (2015) uniform init (fan-in, ReLU gain) for every conv and linear weight."""
    _init_layers(module, lambda w: nn.init.kaiming_uniform_(w, a=0.0, mode="fan_in", nonlinearity="relu"))


def fan_in_trunc_normal_(module: nn.Module) -> None:
    """Haiku's default, which BYOL's official ResNets and heads keep (they pass no `w_init`): every conv and
    linear weight from a normal of std 1/√fan_in truncated at ±2 std."""
    def weight(w: torch.Tensor) -> None:
        std = w[0].numel() ** -0.5  # fan-in: in_channels / groups × kernel area, or in_features
        nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)

    _init_layers(module, weight)


def trunc_normal_(module: nn.Module, std: float = 0.02) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def init_weights(module: nn.Module, init: str | None) -> None:
    """`kaiming_uniform`, `fan_in_trunc_normal` (BYOL's), `trunc_normal_<std>` (e.g. trunc_normal_.02) or
    `default` (the library's)."""
    if not init or init == "default":
        return
    if init == "kaiming_uniform":
        kaiming_uniform_(module)
    elif init == "fan_in_trunc_normal":
        fan_in_trunc_normal_(module)
    elif init.startswith("trunc_normal"):
        tail = init[len("trunc_normal"):].lstrip("_")
        try:
            std = float(tail) if tail else 0.02
        except ValueError:
            raise UserError(f"model.init {init!r}: write trunc_normal_<std>, e.g. trunc_normal_.02") from None
        trunc_normal_(module, std)
    else:
        raise UserError(f"model.init {init!r}: use kaiming_uniform, fan_in_trunc_normal, trunc_normal_.02 or default")


BASIC_BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}  # blocks per stage of each basic-block ResNet


def backbone(arch: str, *, width: int | None = None, cifar_stem: bool = False, image_size: int = 224,
             patch_size: int | None = None, stochastic_depth: float = 0.0, init: str | None = None,
             vit_dims: dict | None = None, dynamic_img_size: bool = False,
             layers: list | None = None) -> nn.Module:
    """A feature extractor with `.num_features`: pooled features, no classifier.

    ViTs only: `vit_dims` overrides timm's embed_dim / depth / num_heads (narrow ViTs for the
    cpu presets); `dynamic_img_size` accepts inputs of other sizes than `image_size`, with the
    position embedding interpolated (DINO's 96 px local crops next to 224 px global crops). `layers`
    (resnet18/resnet34 only): basic blocks per stage in place of the arch's own."""
    if layers is not None and arch not in BASIC_BLOCKS:
        raise UserError(f"model.layers applies to resnet18 and resnet34, not {arch!r}: drop model.layers")
    if arch in BASIC_BLOCKS:
        net = ResNet(tuple(layers or BASIC_BLOCKS[arch]), width or 64, cifar_stem)
        init_weights(net, init)
        return net
    if arch == "resnet50":
        if cifar_stem or (width not in (None, 64)):  # a narrow or small-image ResNet-50
            net = ResNet((3, 4, 6, 3), width or 64, cifar_stem, block=Bottleneck)
            init_weights(net, init)
            return net
        from torchvision.models import resnet50

        net = resnet50(weights=None)
        net.num_features = net.fc.in_features
        net.fc = nn.Identity()
        init_weights(net, init)
        return net
    if arch.startswith("vit"):
        import timm

        kw = dict(pretrained=False, num_classes=0, drop_path_rate=float(stochastic_depth or 0.0), img_size=image_size)
        if patch_size is not None:
            kw["patch_size"] = patch_size
        kw.update({k: int(v) for k, v in (vit_dims or {}).items() if v is not None})
        if dynamic_img_size:
            kw["dynamic_img_size"] = True
        try:
            net = timm.create_model(arch, **kw)
        except (RuntimeError, ValueError, TypeError) as e:
            raise UserError(f"model.arch {arch!r}: timm cannot build it ({' '.join(str(e).split())})") from None
        if init and init != "default" and not init.startswith("trunc_normal"):
            init_weights(net, init)
        elif init and init.startswith("trunc_normal"):
            tail = init[len("trunc_normal"):].lstrip("_")
            if tail and abs(float(tail) - 0.02) > 1e-12:
                init_weights(net, init)  # timm's own init is trunc_normal(.02) already
        return net
    raise UserError(f"model.arch {arch!r}: use resnet18, resnet34, resnet50 or a timm ViT such as "
                    f"vit_base_patch16_224")


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Biases and norm parameters (every parameter with ≤ 1 dimension), plus a timm model's own
    `no_weight_decay()` names (ViT position embedding and class token)."""
    params = dict(model.named_parameters())
    names = {n for n, p in params.items() if p.ndim <= 1}
    for prefix, m in model.named_modules():
        fn = getattr(m, "no_weight_decay", None)
        if callable(fn) and not isinstance(m, nn.ModuleList):
            try:
                extra = fn()
            except TypeError:
                continue
            for n in extra:
                full = f"{prefix}.{n}" if prefix else n
                if full in params:
                    names.add(full)
    return names
