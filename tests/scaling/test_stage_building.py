"""Stages are found by searching the schedule's (monotone) batch, not by visiting every epoch: the same
stages as the epoch-by-epoch merge, and a schedule of 1e9 epochs plans at once."""

import math
import time

import pytest

from emarule.errors import UserError
from emarule.scaling import BatchSchedule
from emarule.scaling.progressive import Stage


def epoch_by_epoch(sched: BatchSchedule) -> list[Stage]:
    """The merge the stages were built with before: one batch_at per epoch."""
    out: list[Stage] = []
    for e in range(int(math.ceil(sched.epochs))):
        b = sched.batch_at(e)
        if out and out[-1].batch_size == b:
            out[-1] = Stage(out[-1].start_epoch, float(min(e + 1, sched.epochs)), b, b / sched.base)
        else:
            out.append(Stage(float(e), float(min(e + 1, sched.epochs)), b, b / sched.base))
    return out


SCHEDULES = [
    ({"kind": "step", "epoch": 30}, 1024, 8, 100),
    ({"kind": "step", "epoch": 2.5, "from_kappa": 0.5}, 256, 4, 7.5),
    ({"kind": "smooth", "start_epoch": 60, "end_epoch": 180}, 4096, 8, 300),
    ({"kind": "smooth", "start_epoch": 1.5, "end_epoch": 97.3}, 96, 3.7, 120.2),
    ({"kind": "smooth", "start_epoch": 0, "end_epoch": 50, "batch_multiple": 7}, 100, 2, 51),
    ({"kind": "smooth", "start_epoch": 0, "end_epoch": 400}, 64, 2, 500),  # more epochs than batches
    ({"kind": "incremental", "start_epoch": 60, "delta_batch": 3072, "every_epochs": 60, "from_kappa": 0.75},
     4096, 6, 480),
    ({"kind": "incremental", "start_epoch": 0, "delta_batch": 10, "every_epochs": 1.5, "batch_multiple": 4},
     64, 3, 40),
]


@pytest.mark.parametrize("prog,base,kappa,epochs", SCHEDULES)
def test_the_stages_are_the_epoch_by_epoch_merge(prog, base, kappa, epochs):
    sched = BatchSchedule(prog, base, kappa, epochs)
    assert sched.stages() == epoch_by_epoch(sched)


def test_a_billion_epochs_plan_at_once():
    t0 = time.perf_counter()
    stages = BatchSchedule({"kind": "step", "epoch": 1}, 1024, 2, 1e9).stages()
    assert time.perf_counter() - t0 < 1.0
    assert [(s.start_epoch, s.end_epoch, s.kappa) for s in stages] == [(0.0, 1.0, 1.0), (1.0, 1e9, 2.0)]


def test_a_ramp_of_more_stages_than_a_plan_holds_is_refused():
    sched = BatchSchedule({"kind": "smooth", "start_epoch": 0, "end_epoch": 1e6}, 256, 1000, 2e6)
    with pytest.raises(UserError, match="more than 10,000 stages"):
        sched.stages()


def test_a_ramp_from_a_fractional_base_batch_stays_between_its_ends():
    # round(0.5) is 0 and round(2.5) is 2: a base batch of 0.5 or 1.5 samples rounded outside the ramp's ends
    s = BatchSchedule({"kind": "smooth", "start_epoch": 1, "end_epoch": 5}, 0.5, 2.0, 8)
    assert [s.batch_at(e) for e in range(8)] == sorted(s.batch_at(e) for e in range(8))
    assert min(s.batch_at(e) for e in range(8)) == 0.5
    flat = BatchSchedule({"kind": "smooth", "start_epoch": 655, "end_epoch": 716}, 1.5, 1.0, 1000)
    assert [(st.start_epoch, st.end_epoch, st.batch_size) for st in flat.stages()] == [(0.0, 1000.0, 1.5)]
