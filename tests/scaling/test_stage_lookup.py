"""One stage lookup (`Plan.at`): the loop and `emarule.plan_at` read the stage in force from it, and it agrees
with the batch schedule it was built from at every point of the clock, stage edges and float noise included."""

import math

import pytest

import emarule
from emarule.scaling import BatchSchedule, plan
from emarule.config.load import load_spec

SCHEDULES = [
    ("byol-r18", 8, "step:30"),
    ("byol-r50-lars", 4, "smooth:60-180"),
    ("byol-vit", 6, "incremental:60,3072,60"),
    ("byol-r18", 4, {"kind": "step", "base_step": 100.0, "from_kappa": 2.0}),
    ("polyak-r50", 2, None),
]


@pytest.mark.parametrize("experiment,kappa,text", SCHEDULES)
def test_the_stage_in_force_is_the_schedules_batch(experiment, kappa, text):
    from emarule.scaling.progressive import parse

    spec = load_spec(experiment)
    prog = parse(text) if isinstance(text, str) else text
    p = plan(spec, kappa, "exponential", prog)
    epochs = spec["schedule"]["epochs"]
    sched = BatchSchedule(p.progressive, spec["batch"]["size"], kappa, epochs, spec["schedule"].get("total_steps"))
    for i in range(int(epochs * 8) + 1):
        for t in (i / 8, i / 8 - 1e-12, math.nextafter(i / 8, 0.0)):
            if t < 0:
                continue
            assert p.at(t).kappa == pytest.approx(sched.kappa_at(t)), (experiment, t)


def test_plan_at_reads_the_same_stage():
    p = emarule.scale("byol-r18", 8, progressive="step:3")
    per_epoch = 1000.0
    for seen in (0, 2999.999999999, 3000, 3000.5, 1e9):
        t = seen / per_epoch
        assert emarule.plan_at(p, seen, per_epoch) is p.at(t)
    assert emarule.plan_at(p, 2999.0, per_epoch)["batch_size"] == p.stages[0][1]["batch_size"]
    assert emarule.plan_at(p, 3000.0, per_epoch)["batch_size"] == p.stages[-1][1]["batch_size"]
