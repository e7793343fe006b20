"""Where the scaled momentum ρ̂ = ρ^κ and the EMA update stay meaningful in a floating-point format.

For a format with p significand bits (implicit bit included), numbers just below 1 are spaced
2^-p apart, so (round to nearest, ties to even):

- ρ̂ rounds to 1.0, and the EMA never moves, when 1 − ρ̂ < 2^-(p+1):
      κ_min = log(1 − 2^-(p+1)) / log ρ
- the increment (1 − ρ̂)(θ − ζ) is below half an ulp of ζ, and is lost, when
  (1 − ρ̂)·r < 2^-p for a relative gap r = |θ − ζ| / |ζ| (worst case over ζ's binade):
      κ_update = log(1 − 2^-p / r) / log ρ
- 1 − ρ̂ rounds to 1.0, and the EMA is a plain copy of θ, when ρ̂ < 2^-(p+1):
      κ_max = log(2^-(p+1)) / log ρ
- ρ̂ itself underflows to 0 below half the smallest subnormal 2^-s:
      κ_underflow = log(2^-(s+1)) / log ρ

The paper's numerical-stability appendix (ρ_B = 0.996 at B = 4096, FP32) writes the two κ
formulas the other way round, log ρ / log ε; its magnitudes (≈1/32K and ≈4K) come from
log(1 − ε) / log ρ and log ε / log ρ with ε = 2^-23, one binary digit looser than the thresholds of
round-to-nearest above (docs/cli.md), and 4K × 4096 is ≈16M samples, not the ≈8M it quotes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

# name: (significand bits p incl. implicit, exponent of the smallest subnormal s, machine epsilon)
FORMATS = {
    "float32": (24, 149),
    "bfloat16": (8, 133),
    "float16": (11, 24),
}
ALIASES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def canonical(dtype: str) -> str:
    d = ALIASES.get(dtype, dtype)
    if d not in FORMATS:
        raise ValueError(dtype)
    return d


def round_to(x: float, dtype: str) -> float:
    """`x` rounded to the nearest value of `dtype` (ties to even), without torch or numpy."""
    d = canonical(dtype)
    if d == "float16":
        try:
            return struct.unpack("<e", struct.pack("<e", x))[0]
        except OverflowError:
            return math.copysign(math.inf, x)
    f32 = struct.unpack("<f", struct.pack("<f", x))[0] if abs(x) < 3.4e38 else math.copysign(math.inf, x)
    if d == "float32":
        return f32
    # bfloat16 keeps the top 16 bits of float32; round the dropped 16 to nearest even.
    # Double rounding (float64 → float32 → bfloat16) is exact enough for momenta in [0, 1].
    bits = struct.unpack("<I", struct.pack("<f", f32))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@dataclass(frozen=True)
class Limits:
    dtype: str
    momentum: float
    batch_size: float
    relative_gap: float
    kappa_min: float
    kappa_update: float
    kappa_max: float
    kappa_underflow: float

    @property
    def kappa_low(self) -> float:
        return max(self.kappa_min, self.kappa_update)

    @property
    def meaningful(self) -> bool:
        """Whether some κ is meaningful: the lower bound lies below kappa_max."""
        return self.kappa_low < self.kappa_max

    def as_dict(self) -> dict:
        p, s = FORMATS[self.dtype]
        b = self.batch_size
        rows = {
            "kappa_min": (self.kappa_min, f"log(1 - 2^-{p + 1}) / log(rho)", "below it rho^kappa rounds to 1.0"),
            "kappa_update": (self.kappa_update, f"log(1 - 2^-{p} / r) / log(rho)",
                             "below it the EMA increment is under half an ulp and is lost"),
            "kappa_max": (self.kappa_max, f"log(2^-{p + 1}) / log(rho)",
                          "above it 1 - rho^kappa rounds to 1.0: the EMA copies theta"),
            "kappa_underflow": (self.kappa_underflow, f"log(2^-{s + 1}) / log(rho)",
                                "above it rho^kappa underflows to 0"),
        }
        return {
            "dtype": self.dtype,
            "momentum": self.momentum,
            "batch_size": b,
            "relative_gap": self.relative_gap,
            "significand_bits": p,
            # null where the range is empty (kappa_low ≥ kappa_max): no κ keeps both the update and ρ^κ
            "meaningful_kappa": [self.kappa_low, self.kappa_max] if self.meaningful else None,
            "meaningful_batch_size": [self.kappa_low * b, self.kappa_max * b] if self.meaningful else None,
            "bounds": {
                k: {"kappa": v, "batch_size": v * b, "formula": f, "meaning": m} for k, (v, f, m) in rows.items()
            },
        }


def _kappa_for(target: float, rho: float) -> float:
    """κ with ρ^κ = target (ρ in (0, 1), target in (0, 1))."""
    return math.log(target) / math.log(rho)


def limits(momentum: float, batch_size: float, dtype: str = "float32", relative_gap: float = 1.0) -> Limits:
    d = canonical(dtype)
    p, s = FORMATS[d]
    rho = momentum
    if not (0.0 < rho < 1.0):
        raise ValueError("momentum must be in (0, 1)")
    k_min = _kappa_for(1.0 - 2.0 ** -(p + 1), rho)
    step = 2.0**-p / relative_gap
    k_update = _kappa_for(1.0 - step, rho) if step < 1.0 else math.inf
    k_max = _kappa_for(2.0 ** -(p + 1), rho)
    k_under = _kappa_for(2.0 ** -(s + 1), rho)
    return Limits(d, rho, batch_size, relative_gap, k_min, k_update, k_max, k_under)
