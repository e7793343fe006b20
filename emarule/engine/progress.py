"""The progress bar on rank 0 and the window of steps averaged into each logged row."""

from __future__ import annotations

import math
import time


class Window:
    """Mean loss and task metrics over the steps since the last logged row."""

    def __init__(self):
        self.n = 0
        self.sums: dict[str, float] = {}

    def add(self, loss: float, metrics: dict) -> None:
        self.n += 1
        for k, v in {"loss": loss, **metrics}.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def mean(self) -> dict:
        return {k: v / max(1, self.n) for k, v in self.sums.items()}


class Progress:
    """A rich progress bar (data seen, rate, the task's own loss, ETA); silent when disabled."""

    def __init__(self, total: float, start: float, unit: str = "samples", enabled: bool = True):
        self.total, self.start_seen, self.unit, self.enabled = total, start, unit, enabled
        self.t0 = time.monotonic()
        self.seen = start
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            u = "s audio" if self.unit == "seconds" else "samples"
            self._bar = RichProgress(TextColumn("[bold]train"), BarColumn(),
                                     TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {u}"),
                                     TextColumn(f"{{task.fields[rate]:,.0f}} {u}/s"),
                                     TextColumn("{task.fields[loss]}"), TimeRemainingColumn(),
                                     console=Console(stderr=True), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start_seen, rate=0.0,
                                            loss="loss —")
        return self

    def advance(self, seen: float, loss: float) -> None:
        self.seen = seen
        # A run ends at the first batch boundary at or past its length: with seconds-of-audio batches
        # (or a length in steps) the last batch may carry it past the planned total, which then grows
        # to what was seen, so the bar never reads more than 100 %.
        self.total = max(self.total, seen)
        if self._bar is not None:
            shown = f"loss {loss:.4g}" if math.isfinite(loss) else "loss —"
            self._bar.update(self._task, total=self.total, completed=seen, rate=self.rate(), loss=shown)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def rate(self) -> float:
        dt = self.elapsed()
        return (self.seen - self.start_seen) / dt if dt > 0 else 0.0

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __exit__(self, *exc):
        self.stop()
        return False
