"""The acoustic model of App. G: a strided 1-D convolution, a post-LayerNorm transformer encoder with
CAPE positions and layer drop, and a linear layer to the tokens (scores for CTC).

- Front end: Conv1d(n_mels → 2·dim, kernel 7, stride 3) and a GLU (→ dim), then dropout. The paper
  gives only the kernel and stride; the GLU after a doubled convolution is the wav2letter/slimIPL
  transformer front end that the paper's recipe is taken from.
- Encoder: `layers` × nn.TransformerEncoderLayer (post-LN, ReLU MLP, dropout), each skipped in training
  with probability `layer_drop` (LayerDrop, one draw per layer and batch, from the global RNG like dropout).
- CAPE (Likhomanenko et al. 2021): sinusoidal embeddings of positions in seconds (30 ms apart after
  the stride), centred on each sequence's middle; in training every sequence's positions get a global
  shift Δ ~ U(±60 s), a local shift ε ~ U(±½ frame) per position and a global scaling λ = e^U(±ln 1.1);
  at evaluation the plain sinusoids. The audio settings are those of the CAPE paper's ASR recipe
  (max global shift 60 s, local shift 1 frame, scaling 1.1, frequency scale 30), as the reference
  implementation (gcambara/cape) documents them; the paper says only "CAPE".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CAPE_GLOBAL_SHIFT_S = 60.0
CAPE_LOCAL_SHIFT = 1.0  # in frames: keeps neighbouring positions in order
CAPE_GLOBAL_SCALING = 1.1
CAPE_FREQ_SCALE = 30.0


class CAPE(nn.Module):
    """Continuous augmented positional embeddings for (batch, frames, dim) with valid lengths."""

    def __init__(self, dim: int, frame_seconds: float, augment: bool = True):
        super().__init__()
        k = torch.arange(dim)
        self.register_buffer("freq", CAPE_FREQ_SCALE * torch.exp(-2.0 * torch.floor(k / 2) * math.log(1e4) / dim),
                             persistent=False)
        self.register_buffer("phase", (math.pi / 2) * (k % 2), persistent=False)
        self.frame_seconds = frame_seconds
        self.augment = augment

    def positions(self, lengths: torch.Tensor, frames: int) -> torch.Tensor:
        t = torch.arange(frames, device=lengths.device, dtype=torch.float32).unsqueeze(0)
        pos = t * self.frame_seconds
        centre = (lengths.float().clamp(min=1) - 1).unsqueeze(1) * self.frame_seconds / 2
        pos = pos - centre
        if self.training and self.augment:
            b = lengths.shape[0]
            dev = lengths.device
            shift = (torch.rand(b, 1, device=dev) * 2 - 1) * CAPE_GLOBAL_SHIFT_S
            local = (torch.rand(b, frames, device=dev) - 0.5) * CAPE_LOCAL_SHIFT * self.frame_seconds
            scale = torch.exp((torch.rand(b, 1, device=dev) * 2 - 1) * math.log(CAPE_GLOBAL_SCALING))
            pos = (pos + shift + local) * scale
        return pos

    def forward(self, lengths: torch.Tensor, frames: int) -> torch.Tensor:
        pos = self.positions(lengths, frames).unsqueeze(-1)
        return torch.sin(pos * self.freq + self.phase)


class CTCTransformer(nn.Module):
    def __init__(self, n_mels: int, vocab: int, dim: int, layers: int, heads: int, mlp_dim: int, dropout: float,
                 layer_drop: float, conv_kernel: int = 7, conv_stride: int = 3, frame_seconds: float = 0.01,
                 positional: str = "cape"):
        super().__init__()
        if positional not in ("cape", "sinusoidal"):
            raise ValueError(f"model.positional {positional!r}: cape or sinusoidal")
        self.stride, self.kernel = conv_stride, conv_kernel
        self.conv = nn.Conv1d(n_mels, 2 * dim, conv_kernel, stride=conv_stride, padding=conv_kernel // 2)
        self.drop = nn.Dropout(dropout)
        self.pos = CAPE(dim, frame_seconds * conv_stride, augment=positional == "cape")
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, mlp_dim, dropout, activation="relu", batch_first=True,
                                       norm_first=False)
            for _ in range(layers))
        self.layer_drop = layer_drop
        self.out = nn.Linear(dim, vocab)
        self.dim = dim

    def out_lengths(self, frames: torch.Tensor) -> torch.Tensor:
        pad = self.kernel // 2
        return torch.div(frames + 2 * pad - self.kernel, self.stride, rounding_mode="floor") + 1

    def set_dropout(self, dropout: float, layer_drop: float) -> None:
        """Pseudo-labeling lowers both rates after pre-training (0.3 → 0.1), attention's dropout included
        (MultiheadAttention keeps it as a float, not as an nn.Dropout)."""
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = dropout
            elif isinstance(m, nn.MultiheadAttention):
                m.dropout = dropout
        self.layer_drop = layer_drop

    def forward(self, feats: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, frames, n_mels) and valid frame counts → ((batch, T', vocab) log-probabilities, T' lengths)."""
        x = F.glu(self.conv(feats.transpose(1, 2)), dim=1).transpose(1, 2)
        lengths = self.out_lengths(frames).clamp(max=x.shape[1])
        x = x + self.pos(lengths, x.shape[1]).to(x.dtype)
        x = self.drop(x)
        pad = torch.arange(x.shape[1], device=x.device).unsqueeze(0) >= lengths.unsqueeze(1)
        for layer in self.layers:
            if self.training and self.layer_drop > 0 and float(torch.rand(())) < self.layer_drop:
                continue
            x = layer(x, src_key_padding_mask=pad)
        return F.log_softmax(self.out(x).float(), dim=-1), lengths
