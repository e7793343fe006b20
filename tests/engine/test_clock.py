"""The batch unit is decided once (emarule/engine/clock.py): what differs between samples and seconds of audio."""

import pytest

from emarule.engine.clock import Clock, Measure, Seconds, measure_for


class Parts:
    duration = None


class Batcher:
    n, epoch_measure = 100, 412.5


def test_samples_count_items_and_log_no_seconds():
    m = measure_for("samples")
    c = Clock(seen=127.6, samples=120)
    assert type(m) is Measure and m.durations(Parts(), 3, "x") is None
    assert m.items_after_step(c, 130.4, 7) == 130  # the clock's seen, rounded
    m.end_epoch(c)
    assert c.samples == 128
    assert m.fields(c) == {} and m.seen(c) == "128 samples" and m.training_set(Batcher()) == "100 samples"
    assert m.steps_per_epoch(100, 32.0) == 3


def test_seconds_count_items_beside_the_clock():
    m = measure_for("seconds")
    c = Clock(seen=127.6, samples=12)
    assert isinstance(m, Seconds) and m.items_after_step(c, 140.0, 3) == 15
    m.end_epoch(c)
    assert c.samples == 12  # items are counted as they are drawn, not from the seconds
    assert m.fields(c) == {"seconds_seen": 127.6} and m.seen(c) == "12 samples (127.6 s of audio)"
    assert m.training_set(Batcher()) == "412.5 s of audio" and m.steps_per_epoch(100, 32.0) is None
    p = Parts()
    with pytest.raises(Exception, match="needs a task that gives each item's duration"):
        m.durations(p, 2, "x")
    p.duration = lambda i: 1.5 * (i + 1)
    assert m.durations(p, 2, "x") == [1.5, 3.0]
