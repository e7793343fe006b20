"""The one seed mixer: every random stream in a run is drawn from a generator seeded by a tuple.

Data order (seed, epoch), augmentation (seed, epoch, index), in-model randomness (seed, rank) and
generated data sets all go through `mix`, so that no two streams collide trivially and none
depends on the world size or the micro-batching. Pure Python (no torch).
"""

from __future__ import annotations

_M64 = 0xFFFFFFFFFFFFFFFF


def mix(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 finalizer folded over the parts)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & _M64)) * 0xBF58476D1CE4E5B9 & _M64
        x ^= x >> 31
        x = x * 0x94D049BB133111EB & _M64
        x ^= x >> 29
    return x & 0x7FFFFFFFFFFFFFFF
