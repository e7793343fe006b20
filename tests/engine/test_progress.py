"""The progress bar: its total follows the data seen when the last batch carries the run past it."""

from emarule.engine.progress import Progress


def test_a_last_seconds_batch_past_the_planned_total_never_reads_over_100_percent():
    p = Progress(48.0, 0.0, unit="seconds", enabled=False)
    p.advance(25.7, 1.0)
    assert p.total == 48.0
    p.advance(50.3, 1.0)  # the 50/48 s audio: the epoch's last batch ends past the planned length
    assert p.total == 50.3 and p.seen <= p.total


def test_the_bar_shows_the_grown_total(capsys):
    with Progress(80.0, 0.0, unit="seconds") as p:
        p.advance(86.0, 0.5)
    err = capsys.readouterr().err
    assert "86/86 s audio" in err and "86/80" not in err
