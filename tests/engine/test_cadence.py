"""One Cadence for every periodic thing the loop does: on the run's clock it falls on multiples of its period
(so a run started again at any position falls where an uninterrupted one did); on the wall clock it counts from
its start."""

from emarule.engine.cadence import BATCHES, EPOCHS, SECONDS, Cadence


def due_points(cadence: Cadence, points: list[float]) -> list[float]:
    """The points at which `cadence` is due, started again after each (as the loop does)."""
    out = []
    for now in points:
        if cadence.due(now):
            out.append(now)
            cadence.start(now)
    return out


def test_on_the_runs_clock_it_falls_on_multiples_of_its_period():
    points = [i / 4 for i in range(1, 17)]  # quarter epochs up to 4
    assert due_points(Cadence(1.5, EPOCHS).start(0.0), points) == [1.5, 3.0]
    # started again mid-way (a resumed run), it falls where the uninterrupted run's did
    assert due_points(Cadence(1.5, EPOCHS).start(2.25), [p for p in points if p > 2.25]) == [3.0]
    # an epoch summed from fractions a hair under a whole number is that whole number
    assert Cadence(1.0, EPOCHS).start(0.0).due(0.1 + 0.2 + 0.7 - 1e-12)


def test_a_row_cadence_counts_the_epochs_batches():
    rows = Cadence(3, BATCHES).start(0)
    assert due_points(rows, list(range(1, 11))) == [3, 6, 9]
    assert not Cadence(3, BATCHES).start(4).due(5) and Cadence(3, BATCHES).start(4).due(6)


def test_on_the_wall_clock_it_counts_from_its_start():
    c = Cadence(60.0, SECONDS).start(1000.0)
    assert not c.due(1059.0) and not c.due(1060.0) and c.due(1060.5)
    c.start(1060.5)
    assert not c.due(1100.0) and c.due(1121.0)
    assert Cadence(0.0, SECONDS).start(5.0).due(5.0)  # every 0 s: due at every look


def test_nothing_is_due_before_it_starts():
    assert not Cadence(1.0, EPOCHS).due(100.0)
