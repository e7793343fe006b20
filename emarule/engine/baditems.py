"""Training items that cannot be decoded (a truncated JPEG, a corrupt or cut FLAC): an error naming
the file, or, with `data.skip_bad_items: true`, skipped, counted and reported.

A loader raises `ItemError` for an item it cannot decode. The loop reads the training set through
`Guarded`, which turns that error into a `BadItem` marker, and `guarded_collate`, which takes the
markers out of a micro-batch: so the decision is made in the main process whatever the DataLoader's
worker count, and a worker never carries a traceback back. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from emarule.errors import UserError

SKIP_KEY = "data.skip_bad_items"
FIX = f"fix or remove the file, or set {SKIP_KEY}: true to skip such items (counted in the run summary)"


class ItemError(UserError):
    """An item whose file cannot be decoded; `path` names it."""

    def __init__(self, path, why: str):
        self.path, self.why = str(path), " ".join(str(why).split())
        super().__init__(f"cannot decode {self.path} ({self.why}); {FIX}")


@dataclass(frozen=True)
class BadItem:
    index: int
    path: str
    why: str

    def error(self) -> ItemError:
        return ItemError(self.path, self.why)


class Guarded:
    """A map-style data set whose items that raise `ItemError` come back as `BadItem` markers."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        try:
            return self.data[i]
        except ItemError as e:
            return BadItem(int(i), e.path, e.why)

    def __getitems__(self, indices: list) -> list:
        """A micro-batch at once where the data set makes batches (the DataLoader asks for them); one item at
        a time where it does not, or where an item in the batch cannot be decoded, to mark just that one."""
        batched = getattr(self.data, "__getitems__", None)
        if batched is not None:
            try:
                return batched(indices)
            except ItemError:
                pass
        return [self[i] for i in indices]


@dataclass
class Collated:
    batch: Any  # the collated good items; None when every item was bad
    bad: list  # BadItem markers


def guarded_collate(collate: Callable[[list], Any]) -> Callable[[list], Collated]:
    def collate_good(items: list) -> Collated:
        good = [x for x in items if not isinstance(x, BadItem)]
        bad = [x for x in items if isinstance(x, BadItem)]
        return Collated(collate(good) if good else None, bad)

    return collate_good
