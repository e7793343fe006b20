"""A sweep's runs that leave κ=1 start from their seed's baseline's snapshot (emarule/engine/fork.py): each
ends bit for bit on the run trained from the start, and where no snapshot can be taken up the run trains from
the start."""

import json

import pytest
import torch

from emarule.analysis.reproduce.command import _logged_wall
from emarule.engine import fork
from emarule.engine.rundir import CHECKPOINT, HPARAMS, METRICS
from tests.cli_util import invoke

TIMING = ("wall_s", "samples_per_s", "data_wait_s")


def rows(run) -> list:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run / METRICS).read_text().splitlines()]


def same_run(a, b) -> None:
    """The two runs logged the same rows (timing aside) and ended with the same weights, bit for bit."""
    assert rows(a) == rows(b)
    ca, cb = (torch.load(r / CHECKPOINT, weights_only=False) for r in (a, b))
    assert ca["model"].keys() == cb["model"].keys()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    assert ca["final_metrics"] == cb["final_metrics"]


def sweep(root, experiment):
    res = invoke("sweep", experiment, "--preset", "tiny", "--kappas", "1,2", "--seeds", "1", "--jobs", "1",
                 "--out", root)
    assert res.exit_code == 0, res.output
    return res.output


def alone(root, experiment, rule_flag):
    res = invoke("run", experiment, "--preset", "tiny", "--kappa", "2", "--seed", "0", *rule_flag, "--out", root)
    assert res.exit_code == 0, res.output


# byol-vit's tiny spec steps to κ at epoch 1; byol-r50-lars's ramps smoothly from epoch 1
@pytest.mark.parametrize("experiment", ["byol-vit", "byol-r50-lars"])
def test_a_forked_run_is_the_run_trained_from_the_start(tmp_path, experiment):
    out = sweep(tmp_path / "sweep", experiment)
    runs = sorted((tmp_path / "sweep" / experiment).glob("tiny-k2-*"))
    base = next((tmp_path / "sweep" / experiment).glob("tiny-k1-*"))
    assert len(runs) == 2 and len(list(base.glob(f"{fork.PREFIX}*.pt"))) == 1  # one point, both rules
    assert out.count(" from its baseline ") == 2 and "training from the start" not in out
    for run in runs:
        flag = ["--no-ema-rule"] if "-norule-" in run.name else []
        alone(tmp_path / run.name, experiment, flag)
        same_run(run, tmp_path / run.name)
        h = json.loads((run / HPARAMS).read_text())
        assert h["forked_from"]["run"] == f"../{base.name}" and h["forked_from"]["samples"] > 0
        # the rows it copied are the baseline's, and their time is not this run's
        n, data = h["forked_from"]["log_bytes"], (run / METRICS).read_bytes()
        assert 0 < n < len(data) and data[:n] == (base / METRICS).read_bytes()[:n]
        own = [json.loads(line) for line in data[n:].decode().splitlines()]
        assert _logged_wall(run) == max(r["wall_s"] for r in own if "wall_s" in r)


def test_a_baseline_trained_before_keeps_no_snapshot_and_its_runs_train_from_the_start(tmp_path):
    root = tmp_path / "sweep" / "byol-vit"
    res = invoke("sweep", "byol-vit", "--preset", "tiny", "--kappas", "1", "--seeds", "1", "--out", tmp_path / "sweep")
    assert res.exit_code == 0, res.output  # the baseline alone: no run to keep a snapshot for
    out = sweep(tmp_path / "sweep", "byol-vit")
    assert out.count("(its baseline kept no snapshot of that step); training from the start") == 2
    assert "starting " + str(root) not in out  # no run took a snapshot up
    assert not list((root / "tiny-k1-rule-s0").glob(f"{fork.PREFIX}*"))
    run = root / "tiny-k2-rule-step1-s0"
    assert "forked_from" not in json.loads((run / HPARAMS).read_text())
    alone(tmp_path / "alone", "byol-vit", [])
    same_run(run, tmp_path / "alone")


@pytest.mark.parametrize("damage", ["snapshot", "log", "spec"])
def test_a_snapshot_that_does_not_fit_is_left_and_the_run_trains_from_the_start(tmp_path, damage, capsys):
    sweep(tmp_path / "first", "byol-vit")
    root = tmp_path / "first" / "byol-vit"
    base, run = root / "tiny-k1-rule-s0", root / "tiny-k2-rule-step1-s0"
    snap = next(base.glob(f"{fork.PREFIX}*.pt"))
    for r in root.glob("tiny-k2-*"):  # the runs go; the baseline (finished) and its snapshot stay
        import shutil

        shutil.rmtree(r)
    if damage == "snapshot":
        snap.write_bytes(b"not a checkpoint")
        why = "cannot be read"
    elif damage == "log":  # the baseline's log edited before the point
        text = (base / METRICS).read_text().replace('"kind": "train"', '"kind": "train" ', 1)
        (base / METRICS).write_text(text)
        why = "log changed"
    else:
        ck = torch.load(snap, weights_only=False)
        ck["fork"]["baseline"]["spec"]["optimizer"]["lr"] = 1.0
        torch.save(ck, snap)
        why = "another spec"
    if damage == "log":  # the baseline itself no longer resumes (its log fails its checkpoint), so run the arm alone
        from emarule.engine.context import RunContext
        from emarule.request.resolve import resolve
        from emarule.tasks import run_task

        s, k, rule, pr, p = resolve("byol-vit", None, "tiny", [], "2", None, False, None, None)
        run_task(RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=run, progressive=pr, preset="tiny",
                            seed=0, fork_from=base))
        err = capsys.readouterr().err
    else:
        err = sweep(tmp_path / "first", "byol-vit")
    assert "not starting from its baseline" in err and why in err, err
    assert "forked_from" not in json.loads((run / HPARAMS).read_text())
    alone(tmp_path / "alone", "byol-vit", [])
    same_run(run, tmp_path / "alone")


def test_only_runs_that_start_at_kappa_one_and_leave_it_are_offered():
    from emarule.config.load import load_spec
    from emarule.scaling.plan import plan

    spec = load_spec("byol-vit", None, "tiny", [])
    step = plan(spec, 2.0)  # the spec's own step at epoch 1
    constant = plan(spec, 2.0, progressive={"kind": "constant"})
    assert fork.leaves_kappa_one(step) and not fork.leaves_kappa_one(constant)
    assert not fork.leaves_kappa_one(plan(spec, 1.0))
    assert fork.first_leave(step) == 1.0
    # one offer per point: the rule does not move it, another κ or schedule may
    offers = fork.offers([step, plan(spec, 2.0, ema_rule=None), plan(spec, 4.0), constant])
    assert [o.key for o in offers] == [fork.key(step), fork.key(plan(spec, 4.0))]


def _toy_pair(tmp_path, stop_at: int | None, base_step: float = 12):
    """The toy's κ=1 baseline keeping the snapshot for a κ=2 run whose step lies mid-epoch on the base-step axis
    (base step 12 of 8 a epoch), stopped by SIGTERM at loss call `stop_at` and resumed; and that κ=2 run's
    context, to start from it."""
    from emarule.engine.loop import train
    from emarule.tasks import toy
    from tests.engine_util import make_ctx, toy_spec, train_until_sigterm

    torch.set_num_threads(1)
    spec = toy_spec(**{"progressive": {"kind": "step", "base_step": base_step}})
    run = make_ctx(tmp_path, spec, kappa=2.0, out="k2")
    base = make_ctx(tmp_path, spec, kappa=1.0, out="k1", forks=fork.offers([run.plan]))
    run.fork_from = base.out
    assert fork.first_leave(run.plan) == base_step and run.plan.stages[0][0].axis == "base_steps"
    if stop_at is not None:
        train_until_sigterm(base, toy.make_parts(base), stop_at)
        base.resume = True
    return base, run, lambda ctx: train(ctx, toy.make_parts(ctx))


def test_a_baseline_stopped_before_the_point_keeps_the_snapshot_on_the_base_step_axis(tmp_path):
    from tests.engine_util import run_toy, toy_spec

    base, run, train = _toy_pair(tmp_path, stop_at=5)
    train(base)
    assert fork.path(base.out, fork.key(run.plan)).is_file()
    train(run)
    assert json.loads((run.out / HPARAMS).read_text())["forked_from"]["at"].endswith("step 12")
    run_toy(tmp_path, toy_spec(**{"progressive": {"kind": "step", "base_step": 12}}), kappa=2.0, out="alone")
    same_run(run.out, tmp_path / "alone")


def test_a_stage_that_starts_between_two_steps_still_forks(tmp_path):
    """A base-step stage that starts between two steps (always so for batches in seconds of audio) is left at the
    first step at or after it; the snapshot is taken there, and the run starts from it as from a whole step."""
    from tests.engine_util import run_toy, toy_spec

    base, run, train = _toy_pair(tmp_path, stop_at=None, base_step=12.5)
    train(base)
    train(run)
    at = json.loads((run.out / HPARAMS).read_text())["forked_from"]["at"]
    assert at.endswith("step 13")
    run_toy(tmp_path, toy_spec(**{"progressive": {"kind": "step", "base_step": 12.5}}), kappa=2.0, out="alone")
    same_run(run.out, tmp_path / "alone")


def test_a_baseline_resumed_past_the_point_keeps_none(tmp_path):
    base, run, train = _toy_pair(tmp_path, stop_at=20)
    snap = fork.path(base.out, fork.key(run.plan))
    assert snap.is_file()  # taken before the stop
    snap.unlink()
    train(base)  # resumed at step 20: the state of step 12 is gone, so no snapshot is made of another step's
    assert not snap.exists()


def test_a_forked_run_stopped_and_resumed_keeps_its_record(tmp_path):
    """hparams.json keeps `forked_from` through a resume, so a later resume still matches the checkpoint's copy of
    the record, and the run's own time is still told from the baseline's."""
    from emarule.tasks import toy
    from tests.engine_util import train_until_sigterm

    base, run, train = _toy_pair(tmp_path, stop_at=None)
    train(base)
    train_until_sigterm(run, toy.make_parts(run), 3)  # the fork, then 3 steps at κ=2
    h = json.loads((run.out / HPARAMS).read_text())["forked_from"]
    run.resume = True
    train(run)
    assert json.loads((run.out / HPARAMS).read_text())["forked_from"] == h
    assert torch.load(run.out / CHECKPOINT, weights_only=False)["record"]["forked_from"] == h
    train(run)  # resumed once more, finished: the record still matches
    own = (run.out / METRICS).read_bytes()[h["log_bytes"]:].decode().splitlines()
    stretches = [json.loads(line)["wall_s"] for line in own if "wall_s" in json.loads(line)]
    cut = next(i for i in range(1, len(stretches)) if stretches[i] < stretches[i - 1])
    assert _logged_wall(run.out) == pytest.approx(stretches[cut - 1] + stretches[-1])


def test_refusal_names_what_does_not_fit(tmp_path):
    base, run, train = _toy_pair(tmp_path, stop_at=None)
    train(base)
    k = fork.key(run.plan)
    ck = torch.load(fork.path(base.out, k), weights_only=False)
    state = ck["fork"]["baseline"]["task_state"]
    assert fork.refusal(ck, run, k, state) == ""
    assert "another schedule" in fork.refusal(ck, run, "0" * 12, state)
    assert "another state" in fork.refusal(ck, run, k, {**(state or {}), "extra": torch.zeros(1)})
    moved = {**ck, "fork": {**ck["fork"], "at": ck["fork"]["at"] + 3}}
    assert "not taken where" in fork.refusal(moved, run, k, state)
    other_seed = {**ck, "fork": {**ck["fork"], "baseline": {**ck["fork"]["baseline"], "seed": 7}}}
    assert "seed's κ=1 run" in fork.refusal(other_seed, run, k, state)
    assert "not a baseline's snapshot" in fork.refusal({"model": {}}, run, k, state)


def test_runs_that_leave_kappa_one_at_one_step_share_one_snapshot_file(tmp_path):
    from tests.engine_util import make_ctx, toy_spec

    spec = toy_spec(**{"progressive": {"kind": "step", "base_step": 12}})
    two, four = (make_ctx(tmp_path, spec, kappa=k, out=f"k{k:g}") for k in (2.0, 4.0))
    base = make_ctx(tmp_path, spec, kappa=1.0, out="k1", forks=fork.offers([two.plan, four.plan]))
    from emarule.engine.loop import train
    from emarule.tasks import toy

    torch.set_num_threads(1)
    train(base, toy.make_parts(base))
    a, b = fork.path(base.out, fork.key(two.plan)), fork.path(base.out, fork.key(four.plan))
    assert a != b and a.stat().st_ino == b.stat().st_ino
    ck = torch.load(a, weights_only=False)
    assert sorted(ck["fork"]["keys"]) == sorted([fork.key(two.plan), fork.key(four.plan)])
