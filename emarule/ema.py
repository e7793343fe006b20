"""The model EMA ζ ← ρ ζ + (1 − ρ) θ (the paper's Definition 1.1), fast and scaling-aware.

- Shadow weights are kept in float32 (spec `ema.dtype`) even when the model holds bfloat16
  weights: 1 − ρ̂ is far below bfloat16's resolution for the momenta the paper uses.
- The update is one `torch._foreach_lerp_` per (device, dtype) group: ζ.lerp_(θ, 1 − ρ).
  lerp keeps ζ's rounding error proportional to the step (1 − ρ)(θ − ζ), whereas
  ζ·ρ + θ·(1 − ρ) adds an error of order eps·|ζ| at every update, which with ρ near 1 is
  of the same size as the update itself.
- The momentum can change during training (`set_momentum`, or passed per update), which is
  what Progressive Scaling needs: ρ̂ = ρ^κ is re-derived each time κ changes.
- Or the EMA scales itself: built with `base_batch_size` B (the batch at which ρ was tuned),
  `update(model, batch_size=B̂)` applies ρ^(B̂/B), the EMA Scaling Rule, whatever the batch is
  now. Without `base_batch_size` it is a plain EMA at the momentum given (the training engine's
  use: it passes the plan's ρ̂ itself).
- A model wrapped in DistributedDataParallel, DataParallel or torch.compile is unwrapped: the
  shadow and the pairing are built from the inner module, which holds the same tensors.
- Accumulation starts after `start_samples` samples seen (the training loop passes the plan's
  `ema.start_steps`, N/κ steps, times the batch κB): before that the EMA is a copy of θ, as
  Polyak averaging and pseudo-labeling recipes do. `momentum_at` returns 0 there; `update` then copies.
- Buffers (BatchNorm running statistics) are copied (default) or averaged with the same momentum.

Which θ is averaged (spec `ema.update_from`) is the training loop's choice, not this class's:
"post" (BYOL, DINO) calls `update` after `optimizer.step()`, averaging θ_{t+1}; "pre" (the
paper's Definition, ζ_{t+1} = ρ ζ_t + (1 − ρ) θ_t) calls it before the step, once the gradients
are computed, which averages θ_t without a snapshot copy.

The split into `momentum_at` (what ρ to use now) and `update` (apply it) follows timm's
ModelEmaV3 `get_decay` / `apply_update_`; the formula is lightly's `update_momentum`.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def unwrap(model: nn.Module) -> nn.Module:
    """The module that owns the parameters: a wrapper's state_dict keys carry a `module.` prefix
    and a deep copy of DDP would copy its process group along."""
    while True:
        # torch.compile's wrapper holds the original as the submodule `_orig_mod`; looking it up in
        # _modules avoids nn.Module.__getattr__'s exception on every update of a plain model.
        inner = model.module if isinstance(model, WRAPPERS) else model._modules.get("_orig_mod")
        if inner is None:
            return model
        model = inner


def _check_momentum(momentum: float) -> float:
    m = float(momentum)
    if not 0.0 <= m <= 1.0:  # NaN fails too
        raise ValueError(f"EMA momentum must be in [0, 1], got {momentum}")
    return m


class ModelEma:
    """EMA copy of `source`. `ema.module` is an nn.Module with the averaged weights (the teacher).

    `momentum` is ρ at `base_batch_size` when that is given (then every update passes its
    batch_size and applies ρ^(batch_size / base_batch_size)); otherwise it is used as is.
    """

    def __init__(self, source: nn.Module, momentum: float, *, base_batch_size: float | None = None,
                 buffers: str = "copy", start_samples: float = 0, dtype: torch.dtype | str = torch.float32):
        if buffers not in ("copy", "average"):
            raise ValueError(f"buffers must be copy or average, got {buffers!r}")
        if base_batch_size is not None and not 0.0 < float(base_batch_size) < math.inf:
            raise ValueError(f"base_batch_size must be finite and > 0, got {base_batch_size!r}")
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        self.module = copy.deepcopy(unwrap(source))
        for p in self.module.parameters():
            p.requires_grad_(False)
        # Floating-point parameters (and averaged buffers) are held in self.dtype; integer buffers
        # (BatchNorm's num_batches_tracked) are always copied.
        with torch.no_grad():
            for p in self.module.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(self.dtype)
            if buffers == "average":
                for b in self.module.buffers():
                    if b.is_floating_point():
                        b.data = b.data.to(self.dtype)
        self.momentum = _check_momentum(momentum)
        self.base_batch_size = None if base_batch_size is None else float(base_batch_size)
        self.buffers = buffers
        self.start_samples = float(start_samples)
        self._pairs_for: int | None = None
        self._groups: list = []
        self._copies: list = []

    # -- the schedule (what ρ now) -----------------------------------------------------------

    def set_momentum(self, momentum: float) -> None:
        """ρ̂ for the current κ (Progressive Scaling calls this whenever κ changes); with
        base_batch_size, the base ρ that updates raise to batch_size / base_batch_size."""
        self.momentum = _check_momentum(momentum)

    def momentum_at(self, samples_seen: float | None = None, batch_size: float | None = None) -> float:
        """0 (copy θ) until accumulation starts, then the momentum for this batch.

        `samples_seen` counts samples including the batch of the step just taken, so with
        start_samples = S·B the first S base steps copy and step S+1 is the first average.
        """
        if samples_seen is not None and samples_seen <= self.start_samples:
            return 0.0
        if self.base_batch_size is None:
            return self.momentum  # a plain EMA: batch_size does not enter
        if batch_size is None:
            raise ValueError(f"this EMA scales ρ with the batch (base_batch_size={self.base_batch_size:g}); "
                             f"pass update(model, batch_size=B)")
        if not 0.0 < float(batch_size) < math.inf:
            raise ValueError(f"batch_size must be finite and > 0, got {batch_size!r}")
        return self.momentum ** (float(batch_size) / self.base_batch_size)

    # -- the update --------------------------------------------------------------------------

    def _build(self, source: nn.Module) -> None:  # source already unwrapped
        """Pair shadow and source tensors once, grouped by (device, shadow dtype, source dtype)."""
        ema_p = list(self.module.parameters())
        src_p = list(source.parameters())
        if len(ema_p) != len(src_p):
            raise ValueError("EMA source has a different set of parameters than the EMA copy")
        lerp_pairs = list(zip(ema_p, src_p, strict=True))
        copies = []
        ema_b = list(self.module.buffers())
        src_b = list(source.buffers())
        if len(ema_b) != len(src_b):
            raise ValueError("EMA source has a different set of buffers than the EMA copy")
        for e, s in zip(ema_b, src_b, strict=True):
            if self.buffers == "average" and e.is_floating_point():
                lerp_pairs.append((e, s))
            else:
                copies.append((e, s))
        groups: dict = {}
        for e, s in lerp_pairs:
            if not e.is_floating_point():
                copies.append((e, s))
                continue
            groups.setdefault((e.device, e.dtype, s.dtype), ([], []))
            groups[(e.device, e.dtype, s.dtype)][0].append(e)
            groups[(e.device, e.dtype, s.dtype)][1].append(s)
        self._groups = [(key, es, ss) for key, (es, ss) in groups.items()]
        self._copies = copies
        self._pairs_for = id(source)

    @torch.no_grad()
    def update(self, source: nn.Module, samples_seen: float | None = None, momentum: float | None = None, *,
               batch_size: float | None = None) -> float:
        """One EMA step from `source`; returns the momentum used (0 means a copy).

        `momentum`, when given, is used as is for this step (no scaling, no start delay).
        """
        source = unwrap(source)
        if self._pairs_for != id(source):
            self._build(source)
        rho = self.momentum_at(samples_seen, batch_size) if momentum is None else _check_momentum(momentum)
        if rho == 0.0:
            self.copy_from(source)
            return 0.0
        weight = 1.0 - rho
        for (_, ema_dtype, src_dtype), es, ss in self._groups:
            if src_dtype != ema_dtype:
                # lerp needs one dtype; a temporary cast of a bf16 model is cheaper than losing
                # the update to bf16 rounding in the shadow.
                ss = [s.to(ema_dtype) for s in ss]
            torch._foreach_lerp_(es, ss, weight)
        for e, s in self._copies:
            e.copy_(s)
        return rho

    @torch.no_grad()
    def copy_from(self, source: nn.Module) -> None:
        """ζ ← θ (before accumulation starts, or to reset)."""
        source = unwrap(source)
        if self._pairs_for != id(source):
            self._build(source)
        for _, es, ss in self._groups:
            for e, s in zip(es, ss, strict=True):
                e.copy_(s)
        for e, s in self._copies:
            e.copy_(s)

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "momentum": self.momentum, "base_batch_size": self.base_batch_size,
                "buffers": self.buffers, "start_samples": self.start_samples}

    def load_state_dict(self, state: dict) -> None:
        """Also reads older dicts (no base_batch_size; an `updates` counter, ignored)."""
        self.module.load_state_dict(state["module"])
        self.momentum = float(state["momentum"])
        base = state.get("base_batch_size", self.base_batch_size)
        self.base_batch_size = None if base is None else float(base)
        self.start_samples = float(state.get("start_samples", self.start_samples))
