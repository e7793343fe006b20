"""The training data feed: this rank's share of the next global batch, and the items that failed to decode.

    feed = Feed(batcher, parts, dist, seed, workers, skip_bad)
    batch = feed.next_batch(clock, layout)      # a Batch, or None at the epoch's end
    feed.sync_skipped(clock)                    # every rank's skipped items into clock.skipped (a collective)

A segment is the epoch's global batches from the clock's position to the epoch's end at one batch size, with
a DataLoader over this rank's micro-batches of them; it is opened again when the epoch or the batch size
changes (`Feed.reset` at a stage change). Order and the split over ranks are `emarule.engine.batching`'s.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from emarule.engine import batching, distributed
from emarule.engine.baditems import SKIP_KEY, Guarded, guarded_collate
from emarule.engine.clock import Clock
from emarule.engine.interface import TaskParts
from emarule.engine.seeding import mix
from emarule.errors import UserError

SHOWN_BAD = 10  # skipped items named on stderr; the count goes on


@dataclass
class Batch:
    """One optimizer step's data, as this rank sees it."""

    micro: list  # this rank's micro-batches
    measures: list  # each micro-batch's share of the step, in what the loss is a mean over
    measure: float  # the step's total over ranks: micro-batch k weighs measures[k] / measure
    items: int  # items in the global batch
    seen_after: float  # the clock's data seen once the step is taken
    idle: bool  # some rank has no item in this step (it still joins every collective)
    opens_segment: bool  # the first batch of a new segment (an epoch, a stage's batch size, a resume)
    first: int  # the epoch's batch index at which the segment starts
    starts_rows: bool  # the segment's first step logs a row (not the rest of one a checkpoint cut short)
    ends_epoch: bool  # the epoch's last batch
    per_epoch: int  # global batches in the epoch at this batch size


@dataclass
class Segment:
    """The global batches from the segment's start to the epoch's end, with this rank's DataLoader over them."""

    epoch: int
    size: float
    first: int  # the epoch's batch index at which the segment starts
    batches: list  # (items, measure, this rank's micro-batch index lists, whether some rank is idle)
    loader: object
    next: int = 0
    starts_rows: bool = True

    @property
    def per_epoch(self) -> int:
        return self.first + len(self.batches)


@dataclass
class Feed:
    batcher: batching.Batcher
    parts: TaskParts
    dist: distributed.Dist
    seed: int
    workers: int
    skip_bad: bool  # data.skip_bad_items
    segment: Segment | None = None
    new_skipped: int = 0  # this rank's skipped items not yet added to clock.skipped
    wait_s: float = 0.0  # time this invocation spent getting training batches (logged as data_wait_s)
    # the next segment goes on with one a checkpoint cut short: its first step is no row of its own
    continues: bool = False

    def reset(self) -> None:
        """Open a new segment at the next batch (a stage change, an epoch's end)."""
        self.segment = None

    def next_batch(self, clock: Clock, layout: batching.BatchLayout) -> Batch | None:
        """The step's batch, or None at an epoch's end. The time spent here, starting the loader's workers
        included, is the time the loop waited for data. On a GPU the previous step's optimizer and EMA kernels
        may still run meanwhile (the loop syncs once a step, after backward), so it can overstate the stall."""
        t0 = time.monotonic()  # the clock of Progress, which gives the row's wall_s
        try:
            return self._next_batch(clock, layout)
        finally:
            self.wait_s += time.monotonic() - t0

    def _next_batch(self, clock: Clock, layout: batching.BatchLayout) -> Batch | None:
        seg, opens = self.segment, False
        if seg is None or seg.epoch != clock.epoch or seg.size != layout.global_batch:
            seg, opens = self.open_segment(clock, layout), True
            self.segment = seg
        if seg.next >= len(seg.batches):
            return None
        items, planned, rank_lists, idle = seg.batches[seg.next]
        measure = planned
        seg.next += 1
        several = self.dist.world_size > 1
        micro, measures, skipped, loaded = [], [], False, None
        for m in rank_lists:
            loaded = next(seg.loader)
            bad = {b.index for b in loaded.bad}
            if bad:
                self.count_bad_items(loaded.bad, clock)
                skipped = True
            if loaded.batch is not None:
                micro.append(loaded.batch)
                # one process: the skipped items' share goes to the others (below); several: the step's total
                # is summed over ranks from the plan, so each micro-batch keeps its planned share of it
                measures.append(self.batcher.measure(m if several else [i for i in m if i not in bad]))
        if rank_lists and not micro:
            raise UserError(f"every item of a batch failed to decode (the first: {loaded.bad[0].path}); the data set "
                            f"is too damaged to train on: check it")
        if len(micro) < len(rank_lists) and several:
            raise UserError(f"every item of a micro-batch failed to decode (the first: {loaded.bad[0].path}); with "
                            f"several processes a rank cannot sit a micro-batch out: check the data set")
        if skipped and not several:
            measure = sum(measures)  # the skipped items' share of the step goes to the others
        if self.parts.loss_measure is not None:
            measures, measure = self.loss_measures(micro)
        last = seg.next == len(seg.batches)
        seen_after = (clock.epoch + 1) * self.batcher.epoch_measure if last else clock.seen + planned
        return Batch(micro, measures, measure, len(items), seen_after, idle, opens_segment=opens, first=seg.first,
                     starts_rows=opens and seg.starts_rows, ends_epoch=last, per_epoch=seg.per_epoch)

    def open_segment(self, clock: Clock, layout: batching.BatchLayout) -> Segment:
        """This rank's batches from the clock's position to the epoch's end, and a DataLoader over them."""
        from torch.utils.data import DataLoader, default_collate

        d, parts = self.dist, self.parts
        if hasattr(parts.train_set, "set_epoch"):
            parts.train_set.set_epoch(clock.epoch)
        rows, pos, lists = [], clock.pos, []
        a = layout.accumulation
        while (taken := self.batcher.take(clock.epoch, pos, layout.global_batch)) is not None:
            items, measure = taken
            split = self.batcher.parts(items, layout)
            this_rank = [p for p in split[d.rank * a:(d.rank + 1) * a] if p]
            # a rank left without an item (a seconds batch of fewer utterances than ranks) still joins the
            # reduction
            idle = layout.world_size > 1 and any(not any(split[r * a:(r + 1) * a]) for r in range(layout.world_size))
            rows.append((items, measure, this_rank, idle))
            lists.extend(this_rank)
            pos += len(items)
        # Its own generator: a DataLoader iterator otherwise draws its worker seed from the global RNG,
        # and a resumed run (one more iterator, made mid-epoch) would shift dropout's random stream.
        gen = torch.Generator().manual_seed(mix(self.seed, clock.epoch, d.rank))
        loader = DataLoader(Guarded(parts.train_set), batch_sampler=lists,
                            collate_fn=guarded_collate(parts.collate or default_collate),
                            num_workers=self.workers if lists else 0, pin_memory=d.device.type == "cuda",
                            generator=gen)
        starts_rows, self.continues = not self.continues, False
        return Segment(clock.epoch, layout.global_batch, clock.batch, rows, iter(loader), starts_rows=starts_rows)

    def loss_measures(self, micro: list) -> tuple[list[float], float]:
        """Each micro-batch's weight and the step's total, in what the task's loss is a mean over (a collective:
        every rank calls it each step, an idle one with no micro-batch)."""
        measures = [float(self.parts.loss_measure(b)) for b in micro]
        if self.dist.world_size == 1:
            return measures, sum(measures)  # one micro-batch: its weight is exactly 1.0
        total = torch.tensor([sum(measures)], dtype=torch.float64, device=self.dist.device)
        distributed.all_reduce_sum_(total)
        return measures, float(total.item())

    def count_bad_items(self, bad: list, clock: Clock) -> None:
        """An item that failed to decode stops the run, naming the file, or is skipped and counted."""
        if not self.skip_bad:
            raise bad[0].error()
        for b in bad:
            self.new_skipped += 1
            shown = clock.skipped + self.new_skipped
            if shown <= SHOWN_BAD:
                print(f"warning: skipped {b.path} ({b.why}) ({SKIP_KEY}: true)"
                      + ("; further skips are counted, not named" if shown == SHOWN_BAD else ""), file=sys.stderr)

    def sync_skipped(self, clock: Clock) -> None:
        """Every rank's newly skipped items into clock.skipped (a collective: all ranks call it together)."""
        if not self.skip_bad:
            return
        new = self.new_skipped
        if self.dist.world_size > 1:
            new = sum(distributed.gather_objects(new))
        clock.skipped += new
        self.new_skipped = 0

