"""What a spec's keys must agree on beyond each key's own range (schema.py checks those one at a time).

A schedule gives its length and its warm-up one way each, and milestones only where they are read; a model's
shape is one that can be built (a ViT's width splits over its heads, its patches tile every crop; a CTC
transformer's width splits over its heads). `load_spec` checks these on the resolved spec, so `plan`, `run`
and `sweep` refuse alike before anything is written, instead of a value silently winning over another or a
model failing to build once the run directory exists. Torch-free.
"""

from __future__ import annotations

import re
from typing import Callable

from emarule.config.typed import Section, typed

# timm's ViT widths and heads by size name (vit_base_patch16_224: 768 wide, 12 heads), for a spec that leaves
# model.embed_dim or model.heads to the architecture.
VIT_SIZES = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12), "large": (1024, 16), "huge": (1280, 16)}


def check(spec: dict) -> str | None:
    """The first disagreement among the spec's keys, as a message naming the keys and the fix, else None."""
    cfg = typed(spec)
    for rule in (_one_length, _one_warmup, _milestones, *TASK_RULES.get(spec.get("task"), ())):
        err = rule(cfg)
        if err:
            return err
    return None


def _both(first: str, second: str, v1, v2) -> str | None:
    if v1 is None or v2 is None:
        return None
    return (f"schedule.{first} and schedule.{second} are both set ({v1} and {v2}) and only one is read; give one "
            f"(e.g. --set schedule.{second}=null)")


def _one_length(cfg: Section) -> str | None:
    s = cfg.schedule
    return _both("total_steps", "epochs", s.total_steps, s.epochs)


def _one_warmup(cfg: Section) -> str | None:
    s = cfg.schedule
    return _both("warmup_steps", "warmup_epochs", s.warmup_steps, s.warmup_epochs)


def _milestones(cfg: Section) -> str | None:
    s = cfg.schedule
    m = list(s.milestones_epochs)
    if m and s.kind != "multistep":
        return (f"schedule.milestones_epochs {m} is read only by schedule.kind multistep (this spec's is "
                f"{s.kind}); drop it (--set schedule.milestones_epochs=[]) or set schedule.kind=multistep")
    if any(b <= a for a, b in zip(m, m[1:], strict=False)):
        return (f"schedule.milestones_epochs {m}: the epochs must increase; write them in order, once each, "
                f"e.g. {sorted(set(m))}")
    return None


def _divisor_below(n: int, k: int) -> int:
    """The largest divisor of n that is at most k, for a message's example."""
    return max((d for d in range(1, min(k, n) + 1) if n % d == 0), default=1)


def _heads(width_key: str, width, heads, arch_width: str = "") -> str | None:
    if width is None or heads is None or width % heads == 0:
        return None
    what = f"{width_key} {width}" if not arch_width else f"{arch_width} width {width}"
    return (f"{what} is not divisible by model.heads {heads} (each head takes width / heads channels); pick "
            f"heads dividing {width} (e.g. --set model.heads={_divisor_below(width, heads)}), or a "
            f"{width_key} divisible by {heads}")


def _vit(cfg: Section) -> tuple[int | None, int | None, int | None, str]:
    """(width, heads, patch size, where the width comes from) of a ViT spec's model; Nones where unknown."""
    m = cfg.model
    size = re.match(r"vit_([a-z]+)_", m.arch or "")
    width, heads = VIT_SIZES.get(size.group(1), (None, None)) if size else (None, None)
    patch = re.search(r"patch(\d+)", m.arch or "")
    from_arch = f"model.arch {m.arch}'s" if m.embed_dim is None and width is not None else ""
    return (m.embed_dim if m.embed_dim is not None else width, m.heads if m.heads is not None else heads,
            m.patch_size if m.patch_size is not None else (int(patch.group(1)) if patch else None), from_arch)


def _tiles(key: str, size: int, patch: int | None, what: str) -> str | None:
    if patch is None or size % patch == 0:
        return None
    return (f"{key} {size} is not divisible by model.patch_size {patch}, so {what} cannot be cut into patches; "
            f"pick a patch size dividing {size} (e.g. --set model.patch_size={_divisor_below(size, patch)})"
            f" or a {key} divisible by {patch}")


def _vit_shape(cfg: Section) -> str | None:
    if not str(cfg.model.arch or "").startswith("vit"):
        return None
    width, heads, patch, from_arch = _vit(cfg)
    err = _heads("model.embed_dim", width, heads, from_arch)
    err = err or _tiles("data.image_size", cfg.data.image_size, patch, "the image")
    if err is None and "local_size" in cfg.data and cfg.data.local_crops:
        err = _tiles("data.local_size", cfg.data.local_size, patch, "a local crop")
    return err


def _ctc_shape(cfg: Section) -> str | None:
    return _heads("model.dim", cfg.model.dim, cfg.model.heads)


TASK_RULES: dict[str, tuple[Callable[[Section], str | None], ...]] = {
    "byol": (_vit_shape,), "dino": (_vit_shape,), "ctc": (_ctc_shape,),
}
