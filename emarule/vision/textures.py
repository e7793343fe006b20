"""A generated image set that a small network learns slowly: textures told apart by their spectrum.

Why not the digits: a narrow ResNet reaches ~98 % on them in a few epochs, after which an EMA that
lags the target by several epochs scores the same, and the EMA Scaling Rule has nothing to show.
Here every image is Gaussian noise filtered by its class's power spectrum, plus white noise: the
class is a property of the whole image's statistics, never of one pixel pattern, so no image is
learnt by heart and the best a network can do stays well below 100 % (two images of neighbouring
classes can look alike). Accuracy then climbs over many epochs and SGD's noise stays large, which is
the regime where a Polyak-Ruppert average helps and where its horizon matters.

Ten classes: two radial frequencies (0.16 and 0.30 cycles per pixel) × five orientation patterns
(0°, ±30°, ±60°, 90°, isotropic). Every spectrum is symmetric under a horizontal flip, so flipping
keeps the class; a rescale would move the frequencies, so the training crop never resizes
(`data.augmentation: translate`). Images are one channel, standardised per image (the total power
tells nothing), `round(image_size / 0.875)` pixels wide so that the evaluation's resize-then-centre-
crop is a pure centre crop. Deterministic in (data seed, split): every run seed sees the same images.
"""

from __future__ import annotations

import math

import torch

from emarule.engine.seeding import mix
from emarule.vision.data import TensorSource

FREQUENCIES = (0.16, 0.30)
BANDWIDTH = 0.06  # radial std of each class's ring, cycles per pixel
ORIENTATIONS = (0.0, math.pi / 6, math.pi / 3, math.pi / 2, None)  # None: isotropic
SHARPNESS = 2.0  # von Mises concentration of the orientation lobes (on the doubled angle)
NUM_CLASSES = len(FREQUENCIES) * len(ORIENTATIONS)


def spectra(size: int) -> torch.Tensor:
    """(classes, size, size) power spectra on the FFT grid, each symmetric under kx → −kx."""
    f = torch.fft.fftfreq(size, dtype=torch.float64)
    ky, kx = torch.meshgrid(f, f, indexing="ij")
    r = torch.sqrt(kx**2 + ky**2)
    angle = torch.atan2(ky, kx)
    out = []
    for freq in FREQUENCIES:
        ring = torch.exp(-0.5 * ((r - freq) / BANDWIDTH) ** 2)
        for o in ORIENTATIONS:
            if o is None:
                lobes = torch.ones_like(r)
            else:  # a lobe at +o and one at −o: a horizontal flip swaps them
                lobes = (torch.exp(SHARPNESS * torch.cos(2 * (angle - o)))
                         + torch.exp(SHARPNESS * torch.cos(2 * (angle + o))))
            out.append(ring * lobes)
    return torch.stack(out)


def generate(n: int, size: int, noise: float, seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n images (n × 1 × size × size float32) and balanced labels, a pure function of the arguments."""
    g = torch.Generator().manual_seed(mix(seed, split, 0x7E7))
    labels = torch.arange(n) % NUM_CLASSES
    labels = labels[torch.randperm(n, generator=g)]
    white = torch.randn(n, size, size, generator=g, dtype=torch.float64)
    field = torch.fft.ifft2(torch.fft.fft2(white) * spectra(size)[labels].sqrt()).real
    x = standardise(field) + noise * torch.randn(n, size, size, generator=g, dtype=torch.float64)
    return standardise(x).float()[:, None].contiguous(), labels


def standardise(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(dim=(1, 2), keepdim=True)) / x.std(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def stored_size(image_size: int) -> int:
    return int(round(image_size / 0.875))


def textures(train: bool, n: int, image_size: int, noise: float, seed: int) -> TensorSource:
    x, y = generate(n, stored_size(image_size), noise, seed, 0 if train else 1)
    return TensorSource(x, y, "textures", (0.0,) * 3, (1.0,) * 3, NUM_CLASSES)
