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


@pytest.mark.parametrize("experiment,kappa,multiple", [("dino-vit", 2, 8), ("dino-vit", 3, 8), ("byol-r50-lars", 8, 8),
                                                       ("byol-r50-lars", 8, 64)])
def test_ramp_batches_split_over_the_runs_processes(experiment, kappa, multiple):
    """A run on N processes rounds each ramp batch to a multiple of N (every stage then splits over them); each
    stage's κ is its batch / B and its values are re-derived for that κ; the schedule in force records N."""
    s = load_spec(experiment)
    p = plan(s, kappa, batch_multiple=multiple)
    base = s["batch"]["size"]
    assert all(st.batch_size % multiple == 0 for st, _ in p.stages)
    for st, sp in p.stages:
        assert st.kappa == st.batch_size / base and sp.kappa == st.kappa and sp["batch_size"] == st.batch_size
        assert sp["ema.momentum"] == pytest.approx(s["ema"]["momentum"] ** st.kappa)
    assert (p.stages[0][0].batch_size, p.stages[-1][0].batch_size) == (base, base * kappa)
    assert p.progressive["batch_multiple"] == multiple
    one = plan(s, kappa)  # one process: whole samples, as without the option
    assert "batch_multiple" not in one.progressive and one.as_dict() == plan(s, kappa, batch_multiple=1).as_dict()
    assert [st.batch_size for st, _ in one.stages] != [st.batch_size for st, _ in p.stages]
    # the recorded schedule plans the same stages again, on one process or on N
    again = plan(s, kappa, progressive=p.progressive)
    assert [st for st, _ in again.stages] == [st for st, _ in p.stages]


def test_incremental_ramp_batches_are_multiples_too():
    prog = {"kind": "incremental", "start_epoch": 1, "delta_batch": 100, "every_epochs": 1, "batch_multiple": 8}
    b = BatchSchedule(prog, 256, 2, 6)
    # 356 → 352 (44.5 multiples of 8, to even), 456, then κB
    assert [b.batch_at(e) for e in range(6)] == [256, 352, 456, 512, 512, 512]
    plain = BatchSchedule({**prog, "batch_multiple": 1}, 256, 2, 6)
    assert [plain.batch_at(e) for e in range(6)] == [256, 356, 456, 512, 512, 512]


def test_a_batch_in_seconds_is_not_rounded_to_the_processes():
    s = load_spec("ctc-polyak")
    s["schedule"] = {**s["schedule"], "epochs": 10, "total_steps": None}
    p = plan(s, 4, progressive={"kind": "smooth", "start_epoch": 2, "end_epoch": 6}, batch_multiple=8)
    assert "batch_multiple" not in p.progressive
    assert [st for st, _ in p.stages] == [st for st, _ in plan(s, 4, progressive=p.progressive).stages]


@pytest.mark.parametrize("bad", [0, 2.5, True])
def test_batch_multiple_is_a_whole_number(bad):
    with pytest.raises(UserError, match="batch_multiple must be a whole number"):
        BatchSchedule({"kind": "smooth", "start_epoch": 1, "end_epoch": 2, "batch_multiple": bad}, 256, 2, 6)


def test_incremental_that_never_reaches_kappa_is_refused():
    """The waterfall to κ=6 reaches κB at epoch 420: in 300 epochs the run would never train at the κ it is
    planned and named at."""
    prog = parse("incremental:60,3072,60,0.75")
    with pytest.raises(UserError, match=r"reaches κB = 24576 only at epoch 420, not before the end of training "
                                        r"\(300 epochs\).*schedule.epochs above 420"):
        BatchSchedule(prog, 4096, 6, 300)
    with pytest.raises(UserError, match="only at epoch 420"):
        BatchSchedule(prog, 4096, 6, 420)  # epoch 419 is the last one: still 21504
    assert BatchSchedule(prog, 4096, 6, 421).stages()[-1].kappa == 6
    s = load_spec("byol-vit")
    s["schedule"]["epochs"] = 300
    with pytest.raises(UserError, match="only at epoch 420"):
        plan(s, 6, progressive=prog)


def test_from_kappa_is_refused_for_smooth():
    with pytest.raises(UserError, match="from_kappa applies to step and incremental only"):
        BatchSchedule({"kind": "smooth", "start_epoch": 1, "end_epoch": 3, "from_kappa": 2}, 256, 4, 6)


def test_a_base_step_after_the_end_of_an_epoch_counted_run_is_refused():
    """Only the training set's size gives an epoch-counted run's end in base steps: 2 epochs of 256 samples at
    B = 16 are 32 base steps."""
    def step_at(base_step):
        return BatchSchedule({"kind": "step", "base_step": base_step}, 16, 4, 2)

    with pytest.raises(UserError, match=r"base_step 32 is not before the end of training \(32 base steps: 2 epochs "
                                        r"of 256 at batch.size 16\)"):
        step_at(32).check_base_step_in_run(256)
    step_at(32).check_base_step_in_run(264)  # 33 base steps
    step_at(31).check_base_step_in_run(256)
    with pytest.raises(UserError, match="base_step 1000"):
        step_at(1000).check_base_step_in_run(256)


def test_incremental_ramp_batches_are_whole_samples_on_one_process():
    """A fractional increment still gives whole-sample batches, as smooth's ramp does; the cap stays κB."""
    s = BatchSchedule({"kind": "incremental", "start_epoch": 10, "delta_batch": 300.5, "every_epochs": 10},
                      256, 8, 100)
    ramp = [s.batch_at(e) for e in range(10, 100, 10)]
    assert all(float(b).is_integer() for b in ramp)
    assert ramp[0] == round(256 + 300.5) and ramp[-1] == 2048
    assert ramp == sorted(ramp)
