"""One measure of training time: the clock of data seen, in the batch's unit, samples or seconds of audio.

The unit is decided once, when the run is set up (`measure_for(spec's batch.unit)`); the loop then asks its
`Measure` what differs between the two (an item's duration, how a count reads, which fields a row logs) and
never branches on the unit itself. Everything the loop schedules (epochs, evaluation cadence, checkpoints,
Progressive Scaling stages) is a point on `Clock.seen`: an epoch is the training set's measure in that unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from emarule.errors import UserError

SAMPLES, SECONDS = "samples", "seconds"


@dataclass
class Clock:
    seen: float = 0.0  # data seen in the batch unit (an epoch's dropped remainder counts at its end)
    samples: int = 0  # training items seen
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # the epoch in progress
    pos: int = 0  # items of the epoch's order consumed
    batch: int = 0  # global batches done in the epoch
    skipped: int = 0  # training items skipped because they failed to decode (data.skip_bad_items), all ranks


class Measure:
    """The batch unit samples: an item measures 1, so data seen and items seen are one count."""

    unit = SAMPLES

    def durations(self, parts, n: int, experiment: str) -> list[float] | None:
        return None

    def training_set(self, batcher) -> str:
        return f"{batcher.n} samples"

    def seen(self, c: Clock) -> str:
        return f"{c.samples} samples"

    def steps_per_epoch(self, n: int, global_batch: float) -> int | None:
        return n // int(global_batch)

    def end_epoch(self, c: Clock) -> None:
        c.samples = int(round(c.seen))

    def items_after_step(self, c: Clock, seen_after: float, count: int) -> int:
        # the clock counts an epoch's dropped remainder at its end, as it always has
        return int(round(seen_after))

    def fields(self, c: Clock) -> dict:
        return {}


class Seconds(Measure):
    """The batch unit seconds of audio: the clock counts seconds, items are counted beside it."""

    unit = SECONDS

    def durations(self, parts, n: int, experiment: str) -> list[float]:
        if parts.duration is None:
            raise UserError(f"{experiment}: batch.unit seconds needs a task that gives each item's duration")
        return [float(parts.duration(i)) for i in range(n)]

    def training_set(self, batcher) -> str:
        return f"{batcher.epoch_measure:.6g} s of audio"

    def seen(self, c: Clock) -> str:
        return f"{c.samples} samples ({c.seen:.1f} s of audio)"

    def steps_per_epoch(self, n: int, global_batch: float) -> None:
        return None

    def end_epoch(self, c: Clock) -> None:
        pass

    def items_after_step(self, c: Clock, seen_after: float, count: int) -> int:
        return c.samples + count

    def fields(self, c: Clock) -> dict:
        return {"seconds_seen": c.seen}


def measure_for(unit: str) -> Measure:
    return Seconds() if unit == SECONDS else Measure()
