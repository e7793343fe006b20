"""Something the loop does every so often: evaluate, checkpoint, log a row. One object for all of them.

    c = Cadence(every, unit)      # unit: epochs, seconds (wall clock) or batches (of the epoch)
    c.start(now)                  # the next point is the first multiple of `every` past `now`
    if c.due(now): ...; c.start(now)

A cadence on the run's clock (epochs, batches) falls on multiples of `every`, so where it falls depends on the
clock alone: a resumed run starts it at the checkpoint's position and it falls where the uninterrupted run's
did. A wall-clock cadence (seconds) counts from its start instead, `every` seconds after it; `every` 0 is due
at every look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EPOCHS, SECONDS, BATCHES = "epochs", "seconds", "batches"
TOLERANCE = 1e-9  # epochs are sums of fractions: 2.9999999999 epochs is epoch 3


@dataclass
class Cadence:
    every: float
    unit: str
    next: float = math.inf  # nothing is due before `start`

    def start(self, now: float) -> Cadence:
        """Schedule the next point after `now` (also after each time the thing was done)."""
        if self.unit == SECONDS:
            self.next = now + self.every
        else:
            self.next = (math.floor(now / self.every + TOLERANCE) + 1) * self.every
        return self

    def due(self, now: float) -> bool:
        if self.unit == SECONDS:
            return now > self.next or self.every <= 0  # what `elapsed > every` said, on a clock that can stand still
        return now + TOLERANCE >= self.next
