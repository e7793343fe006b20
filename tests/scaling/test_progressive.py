"""Progressive Scaling schedules and per-stage re-derivation from the base values."""

import pytest

from emarule.errors import UserError
from emarule.scaling import BatchSchedule, plan
from emarule.scaling.progressive import parse
from emarule.config.load import load_spec


def test_step():
    s = BatchSchedule({"kind": "step", "epoch": 10}, 1024, 8, 100)
    assert [s.batch_at(e) for e in (0, 9, 9.99, 10, 99)] == [1024, 1024, 1024, 8192, 8192]
    st = s.stages()
    assert [(x.start_epoch, x.end_epoch, x.kappa) for x in st] == [(0, 10, 1), (10, 100, 8)]


def test_smooth_is_linear_in_epochs():
    s = BatchSchedule({"kind": "smooth", "start_epoch": 60, "end_epoch": 120}, 4096, 8, 300)
    assert s.batch_at(59) == 4096 and s.batch_at(120) == 32768
    assert s.batch_at(90) == pytest.approx(4096 + (32768 - 4096) / 2)
    assert len(s.stages()) == 61  # [0, 61) at B (epoch 60 is the ramp's first, still B), 59 ramp epochs, after


def test_incremental_caps_at_kappa():
    s = BatchSchedule({"kind": "incremental", "start_epoch": 10, "delta_batch": 1024, "every_epochs": 5},
                      1024, 4, 60)
    assert [s.batch_at(e) for e in (9, 10, 14, 15, 20, 25, 59)] == [1024, 2048, 2048, 3072, 4096, 4096, 4096]


def test_constant_is_kappa_throughout():
    s = BatchSchedule(None, 256, 2, 10)
    assert s.batch_at(0) == 512 and len(s.stages()) == 1


@pytest.mark.parametrize("text,expected", [
    ("step:30", {"kind": "step", "epoch": 30.0}),
    ("smooth:120-180", {"kind": "smooth", "start_epoch": 120.0, "end_epoch": 180.0}),
    ("incremental:60,4096,20", {"kind": "incremental", "start_epoch": 60.0, "delta_batch": 4096.0,
                                "every_epochs": 20.0}),
    ("constant", {"kind": "constant"}),
])
def test_parse(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("bad", ["step", "step:x", "smooth:5", "ramp:3", "incremental:1,2"])
def test_parse_errors(bad):
    with pytest.raises(UserError, match="--progressive"):
        parse(bad)


@pytest.mark.parametrize("prog,msg", [
    ({"kind": "step", "epoch": 200}, "not before the end"),
    ({"kind": "smooth", "start_epoch": 50, "end_epoch": 40}, "after start_epoch"),
    ({"kind": "step"}, "missing epoch"),
])
def test_schedule_errors(prog, msg):
    with pytest.raises(UserError, match=msg):
        BatchSchedule(prog, 1024, 8, 100)


def test_step_counted_spec_cannot_progress():
    with pytest.raises(UserError, match="schedule.epochs"):
        plan(load_spec("ctc-polyak"), 4, progressive={"kind": "step", "epoch": 3})


def test_every_stage_rederived_from_base_values():
    s = load_spec("byol-r18")
    p = plan(s, 8, progressive={"kind": "step", "epoch": 30})
    (s0, p0), (s1, p1) = p.stages
    assert (s0.kappa, s1.kappa) == (1, 8)
    assert p0["optimizer.lr"] == pytest.approx(0.02) and p1["optimizer.lr"] == pytest.approx(0.16)
    assert p0["ema.momentum"] == pytest.approx(0.992) and p1["ema.momentum"] == pytest.approx(0.992**8)
    assert p1["batch_size"] == 8192
    # the same stage without the EMA rule keeps ρ_B
    q = plan(s, 8, None, {"kind": "step", "epoch": 30})
    assert q.stages[1][1]["ema.momentum"] == 0.992


def test_incremental_from_kappa_is_the_papers_waterfall():
    """App. H: from 3072 = 0.75 × 4096, +3072 every 60 epochs, to 24,576 at epoch 420."""
    prog = parse("incremental:60,3072,60,0.75")
    assert prog["from_kappa"] == 0.75
    b = BatchSchedule(prog, 4096, 6, 480)
    assert [b.batch_at(e) for e in (0, 59, 60, 120, 419, 420, 479)] == [3072, 3072, 6144, 9216, 21504, 24576, 24576]
    assert [s.kappa for s in b.stages()] == [0.75, 1.5, 2.25, 3.0, 3.75, 4.5, 5.25, 6.0]
    with pytest.raises(UserError, match="from_kappa"):
        BatchSchedule({**prog, "from_kappa": 7}, 4096, 6, 480)
    with pytest.raises(UserError, match="--progressive"):
        parse("incremental:60,3072,60,0.75,2")
