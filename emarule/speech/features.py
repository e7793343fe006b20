"""80 log-mel filterbanks of 16 kHz audio, 25 ms windows every 10 ms, each utterance normalized (App. G).

torch.stft with a periodic Hann window and an HTK mel filterbank without area normalization: the
same power spectrogram and filters as torchaudio.transforms.MelSpectrogram's defaults (its values
are held in tests/speech/test_speech_features.py), without importing torchaudio, whose wheels pin other
torch releases. The log is taken of the power plus 1e-6, so digital silence stays finite.
"""

from __future__ import annotations

import math

import torch

LOG_FLOOR = 1e-6


def hz_to_mel(f: float) -> float:
    return 2595.0 * math.log10(1.0 + f / 700.0)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None):
    """(n_freqs, n_mels) triangular filters equally spaced on the HTK mel scale."""
    f_max = sample_rate / 2 if f_max is None else f_max
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs, dtype=torch.float64)
    m_pts = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64)
    f_pts = mel_to_hz(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)  # (n_freqs, n_mels + 2)
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.clamp(torch.minimum(down, up), min=0.0).float()


class LogMel:
    """Waveform (samples,) → normalized log-mel features (frames, n_mels)."""

    def __init__(self, sample_rate: int = 16000, n_mels: int = 80, window_ms: float = 25.0, stride_ms: float = 10.0):
        self.sample_rate = sample_rate
        self.win = int(round(sample_rate * window_ms / 1000))
        self.hop = int(round(sample_rate * stride_ms / 1000))
        self.n_fft = self.win
        self.window = torch.hann_window(self.win, periodic=True)
        self.fbank = mel_filterbank(self.n_fft // 2 + 1, n_mels, sample_rate)
        self.key = ("logmel", sample_rate, self.win, self.hop, n_mels)  # what the features depend on

    def power_mel(self, wave: torch.Tensor) -> torch.Tensor:
        """(n_mels, frames) mel power, as torchaudio.transforms.MelSpectrogram computes it."""
        spec = torch.stft(wave.float(), self.n_fft, self.hop, self.win, self.window, center=True,
                          pad_mode="reflect", return_complex=True)
        power = spec.abs().pow(2.0)
        return (power.transpose(-1, -2) @ self.fbank).transpose(-1, -2)

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        feats = torch.log(self.power_mel(wave) + LOG_FLOOR).transpose(0, 1)  # (frames, n_mels)
        return normalize(feats)

    def frames(self, samples: int) -> int:
        return samples // self.hop + 1

    @property
    def min_samples(self) -> int:
        """The shortest waveform it featurizes: the centred STFT reflects half a window at each end, and a
        reflection needs more samples than it copies."""
        return self.n_fft // 2 + 1


def normalize(feats: torch.Tensor) -> torch.Tensor:
    """Zero mean and unit variance over the whole utterance (every frame and filter)."""
    return (feats - feats.mean()) / (feats.std() + 1e-5)
