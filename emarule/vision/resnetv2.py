"""Pre-activation ResNets (ResNetv2, He et al. 2016) from timm, for supervised classification.

- `model.arch`: a timm ResNetv2 name; the paper's is ``resnetv2_50`` (layers 3-4-6-3, bottleneck
  channels 256-512-1024-2048, BatchNorm, 25.5M parameters with 1000 classes).
- `model.width` narrows the family: stem `width` channels, stage outputs 4·width … 32·width (64 is
  the full model); `model.layers` overrides the blocks per stage. Same blocks, same pre-activation
  order, same head: the `cpu`/`tiny` presets train a narrow member of the paper's family.
- `model.stem`: ``imagenet`` (timm's 7×7 stride-2 conv and 3×3 max-pool, for 224-px images) or
  ``small`` (one 3×3 stride-2 conv, no pool: a 16-px image keeps 8×8 for the first stage).
- `model.output_stride`: 32 (the paper's); 16 dilates the last stage instead of striding it, so that
  a 16-px image still has 2×2 positions there and BatchNorm there averages over more than one value
  per image.
- `model.init`: ``kaiming_normal_relu``, the paper's (He et al. 2015 normal, ReLU gain, fan-out as
  timm's and torchvision's ResNets use it; the classifier N(0, 0.01) and zero bias as timm's ResNetv2;
  norms 1 and 0), or ``default`` (whatever timm does).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from emarule.errors import UserError

STEMS = ("imagenet", "small")
FULL_WIDTH = 64


def kaiming_normal_relu_(model: nn.Module) -> None:
    for name, m in model.named_modules():
        if name.endswith("head.fc") and isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, mean=0.0, std=0.01)
            nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def resnetv2(arch: str, num_classes: int, *, width: int | None = None, layers: list | None = None,
             stem: str = "imagenet", output_stride: int = 32, init: str | None = "kaiming_normal_relu") -> nn.Module:
    """A timm ResNetv2 with BatchNorm (never synchronised here: the engine decides)."""
    import timm

    if not arch.startswith("resnetv2"):
        raise UserError(f"model.arch {arch!r}: the polyak task trains timm's pre-activation ResNets, e.g. resnetv2_50")
    if stem not in STEMS:
        raise UserError(f"model.stem {stem!r}: use imagenet (7×7 conv and max-pool) or small (3×3 stride-2 conv)")
    if output_stride not in (8, 16, 32):
        raise UserError(f"model.output_stride {output_stride}: use 32 (the paper's), 16 or 8")
    kw: dict = {"num_classes": int(num_classes), "output_stride": int(output_stride)}
    if width is not None and width != FULL_WIDTH:
        kw["channels"] = tuple(4 * width * 2**i for i in range(4))
        kw["stem_chs"] = int(width)
    if layers is not None:
        kw["layers"] = [int(n) for n in layers]
    try:
        net = timm.create_model(arch, pretrained=False, **kw)
    except (RuntimeError, ValueError, TypeError) as e:
        raise UserError(f"model.arch {arch!r}: timm cannot build it ({' '.join(str(e).split())})") from None
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        raise UserError(f"model.arch {arch!r} has no BatchNorm (timm's BiT models use GroupNorm); "
                        f"use resnetv2_50, resnetv2_101 or another BatchNorm ResNetv2")
    if stem == "small":
        conv = net.stem.conv
        net.stem = nn.Sequential(OrderedDict(conv=nn.Conv2d(conv.in_channels, conv.out_channels, 3, 2, 1, bias=False)))
    if init == "kaiming_normal_relu":
        kaiming_normal_relu_(net)
    elif init not in (None, "default"):
        raise UserError(f"model.init {init!r}: use kaiming_normal_relu (the paper's) or default (timm's)")
    return net


def batchnorms(model: nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
