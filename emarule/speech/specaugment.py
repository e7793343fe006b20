"""SpecAugment (Park et al. 2019) as the paper configures it (App. G): frequency and time masks, no time warp.

`freq_masks` masks of width f ~ U{0..F} on the filter axis and `time_masks` masks of width
t ~ U{0..min(T, p·frames)} on the frame axis (p the maximum time-mask ratio), each at a uniform
start, set to 0 (the mean of normalized features). Every draw comes from the generator passed in,
so a mask is a pure function of the seed the caller derives: (seed, epoch, item) in training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpecAugment:
    freq_masks: int = 2
    freq_param: int = 30
    time_masks: int = 10
    time_param: int = 50
    time_ratio: float = 0.1

    def __call__(self, feats: torch.Tensor, frames: int, gen: torch.Generator) -> torch.Tensor:
        """Masks applied to the first `frames` rows of (frames_padded, n_mels) features; returns a copy."""
        out = feats.clone()
        n_mels = feats.shape[1]
        for _ in range(self.freq_masks):
            width = int(torch.randint(0, min(self.freq_param, n_mels) + 1, (1,), generator=gen))
            start = int(torch.randint(0, n_mels - width + 1, (1,), generator=gen))
            out[:frames, start:start + width] = 0.0
        limit = min(self.time_param, int(self.time_ratio * frames))
        for _ in range(self.time_masks):
            width = int(torch.randint(0, limit + 1, (1,), generator=gen))
            start = int(torch.randint(0, frames - width + 1, (1,), generator=gen))
            out[start:start + width] = 0.0
        return out
