"""Global batches measured in samples or in seconds of audio, and their split over ranks and micro-batches.

Data order depends only on (seed, epoch, position), never on the world size or the micro-batching:

- Each epoch has one order of the training items: a permutation drawn from (seed, epoch). For a
  batch measured in seconds the permutation is then sorted by duration inside windows of
  `sort_window` items, so that a batch holds utterances of similar length and little padding.
- A global batch is taken from the current position in that order. In samples it is the next κB
  items. In seconds it is the longest run of next items whose padded cost, items × longest item,
  stays within κB seconds (padding counted, as the paper's dynamic batches do); an item longer
  than the whole budget makes a batch of its own. When the rest of an epoch cannot fill a batch,
  it is dropped and the epoch ends; a rest whose padded cost is the budget exactly is a full batch,
  and is kept (`full`).
- The global batch is cut into W × A contiguous parts (W ranks, A micro-batches each): equal
  counts in samples, equal seconds of audio in seconds. Rank r computes parts rA … rA + A − 1.

A micro-batch's loss is weighted by its measure over the global batch's measure (samples: its
size; seconds: its seconds of audio), so every step sees the gradient of the global batch's mean
loss per unit of measure however the parts are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from emarule.errors import UserError
from emarule.engine.seeding import mix

SAMPLES, SECONDS = "samples", "seconds"


@dataclass(frozen=True)
class BatchLayout:
    """How one global batch is computed: W ranks × A micro-batches."""

    global_batch: float  # in the batch unit (samples: an integer)
    world_size: int
    accumulation: int  # micro-batches per rank per optimizer step
    unit: str = SAMPLES

    @property
    def per_rank(self) -> float:
        return self.global_batch / self.world_size

    @property
    def micro_sizes(self) -> list[int]:
        """Sizes of a rank's micro-batches in samples (they differ by at most one)."""
        q, r = divmod(int(self.per_rank), self.accumulation)
        return [q + 1 if i < r else q for i in range(self.accumulation)]

    @property
    def max_micro(self) -> float:
        return max(self.micro_sizes) if self.unit == SAMPLES else self.per_rank / self.accumulation


def layout(global_batch: float, world: int, max_device_batch: float | None, unit: str = SAMPLES) -> BatchLayout:
    """The accumulation needed to fit `global_batch` on `world` devices of `max_device_batch` (batch unit)."""
    if unit == SECONDS:
        if not global_batch > 0:
            raise UserError(f"the scaled batch κB = {global_batch:g} s must be positive")
        per_rank = global_batch / world
        acc = 1 if not max_device_batch else math.ceil(per_rank / max_device_batch - 1e-9)
        return BatchLayout(float(global_batch), world, acc, unit)
    if abs(global_batch - round(global_batch)) > 1e-6 or round(global_batch) < 1:
        raise UserError(f"the scaled batch κB = {global_batch:g} is not a whole number of samples; "
                        f"choose κ so that κ × batch.size is an integer (or pass --batch-size)")
    b = int(round(global_batch))
    if b % world:
        raise UserError(f"the global batch {b} does not split over {world} processes; use a world size "
                        f"that divides it (or a κ whose batch is a multiple of {world})")
    acc = 1 if not max_device_batch else math.ceil(b // world / max_device_batch)
    return BatchLayout(b, world, acc, unit)


def full(padded: float, size: float) -> bool:
    """Whether an epoch's rest of this padded cost fills the budget. Only an exact fit counts: a rest with
    room for one more item of its longest length is still dropped, so that the batches of every run made
    before this rule are the same (their epochs' rests never fit exactly)."""
    return padded >= size * (1 - 1e-9)


class Batcher:
    """The epoch's order and the global batch at any position in it (see the module docstring)."""

    def __init__(self, n: int, seed: int, durations: list[float] | None = None, sort_window: int = 1024):
        if durations is not None and len(durations) != n:
            raise UserError(f"task error: {len(durations)} durations for {n} training items")
        self.n, self.seed, self.durations, self.window = n, seed, durations, max(1, int(sort_window))
        self.unit = SAMPLES if durations is None else SECONDS
        self._epoch: int | None = None
        self._order: list[int] = []

    @property
    def epoch_measure(self) -> float:
        """One epoch in the batch unit: items, or seconds of audio."""
        return float(self.n) if self.durations is None else float(sum(self.durations))

    def order(self, epoch: int) -> list[int]:
        if self._epoch != epoch:
            g = torch.Generator().manual_seed(mix(self.seed, epoch, 0xDA7A))
            perm = torch.randperm(self.n, generator=g).tolist()
            if self.durations is not None:
                d, w = self.durations, self.window
                perm = [i for s in range(0, self.n, w) for i in sorted(perm[s:s + w], key=d.__getitem__)]
            self._epoch, self._order = epoch, perm
        return self._order

    def take(self, epoch: int, pos: int, size: float) -> tuple[list[int], float] | None:
        """(items, measure) of the global batch of `size` at `pos`, or None when the epoch is done."""
        order = self.order(epoch)
        if self.durations is None:
            b = int(round(size))
            return (order[pos:pos + b], float(b)) if pos + b <= self.n else None
        d, items, longest = self.durations, [], 0.0
        for i in order[pos:]:
            longer = max(longest, d[i])
            if items and (len(items) + 1) * longer > size:
                return items, float(sum(d[j] for j in items))
            items.append(i)
            longest = longer
            if len(items) == 1 and d[i] > size:
                return items, float(d[i])
        return (items, float(sum(d[j] for j in items))) if items and full(len(items) * longest, size) else None

    def measure(self, items: list[int]) -> float:
        return float(len(items)) if self.durations is None else float(sum(self.durations[i] for i in items))

    def parts(self, items: list[int], lay: BatchLayout) -> list[list[int]]:
        """The W × A contiguous parts of a global batch, rank-major; a part may be empty in seconds."""
        count = lay.world_size * lay.accumulation
        if self.durations is None:
            out, i = [], 0
            share = len(items) // lay.world_size
            for r in range(lay.world_size):
                start = r * share
                for size in lay.micro_sizes:
                    out.append(items[start + i:start + i + size])
                    i += size
                i = 0
            return out
        d = self.durations
        total = sum(d[i] for i in items) or 1.0
        out = [[] for _ in range(count)]
        cum = 0.0
        for i in items:
            k = min(count - 1, int((cum + d[i] / 2) / total * count))
            out[k].append(i)
            cum += d[i]
        return out
