"""Progressive Scaling in a run: the stage axis, the EMA's start, base_step's range, ramps on several processes."""

import json
import subprocess
import sys

import pytest

from emarule.errors import UserError
from engine_util import ROOT, env, load_checkpoint, make_ctx, run_toy, toy_spec, write_spec


def train_rows(run_dir) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def test_the_specs_own_base_step_switches_on_the_base_step_axis(tmp_path):
    """The context names no schedule (progressive=None): the plan's stages are the spec's own, in base steps, and
    the switch is read on that axis: 4 base steps = 64 samples at B = 16, the 5th step starts there."""
    spec = toy_spec(**{"schedule.epochs": 4, "progressive": {"kind": "step", "base_step": 4}})
    _, ctx = run_toy(tmp_path, spec, kappa=2.0, log_every_steps=1)
    assert ctx.progressive is None and ctx.plan.stages[0][0].axis == "base_steps"
    rows = train_rows(ctx.out)
    assert [r["kappa"] for r in rows[:6]] == [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    assert [r["samples_seen"] for r in rows[:6]] == [16, 32, 48, 64, 96, 128]


@pytest.mark.parametrize("kappa,start_steps,copies", [(1.0, 3, 3), (2.0, 3, 1), (2.0, 5, 2), (4.0, 3, 0),
                                                       (4.0, 5, 1)])
def test_ema_start_steps_is_n_base_batches_of_data(tmp_path, kappa, start_steps, copies):
    """ema.start_steps = N: the EMA copies the model while the data seen stays within N × B (compared in samples,
    as every step-counted value is), so N = 3 and 5 start at different steps at κ = 2 (3/κ and 5/κ both round
    to 2)."""
    spec = toy_spec(**{"schedule.epochs": 1, "ema.start_steps": start_steps})
    _, ctx = run_toy(tmp_path, spec, kappa=kappa, log_every_steps=1)
    rhos = [r["ema_momentum"] for r in train_rows(ctx.out)]
    assert rhos[:copies] == [0.0] * copies and rhos[copies] == pytest.approx(0.9**kappa)


@pytest.mark.parametrize("prog", [{"kind": "step", "epoch": 1}, {"kind": "step", "epoch": 1, "from_kappa": 2}])
def test_ema_start_is_the_same_data_whatever_the_first_stage(tmp_path, prog):
    """Under Progressive Scaling the start is N × B of data too, whatever κ the first stage runs at."""
    spec = toy_spec(**{"schedule.epochs": 2, "ema.start_steps": 3})
    _, ctx = run_toy(tmp_path, spec, kappa=4.0, progressive=prog, log_every_steps=1)
    rows = train_rows(ctx.out)
    copied = [r["samples_seen"] for r in rows if r["ema_momentum"] == 0.0]
    assert copied == [s for s in (16, 32, 48) if s in [r["samples_seen"] for r in rows]]
    first = next(r for r in rows if r["ema_momentum"] != 0.0)
    assert first["samples_seen"] > 48


def test_a_base_step_after_the_end_of_an_epoch_counted_run_is_refused_before_anything_is_written(tmp_path):
    """2 epochs of 128 samples at B = 16 are 16 base steps: a base_step of 1000 would keep the run at B for good
    while it is planned and named at κ. Refused as `epoch: 1000` is."""
    spec = toy_spec(**{"schedule.epochs": 2, "progressive": {"kind": "step", "base_step": 1000}})
    with pytest.raises(UserError, match=r"base_step 1000 is not before the end of training \(16 base steps"):
        run_toy(tmp_path, spec, kappa=4.0)
    assert not (tmp_path / "run").exists()
    ok = toy_spec(**{"schedule.epochs": 2, "progressive": {"kind": "step", "base_step": 15}})
    final, ctx = run_toy(tmp_path, ok, kappa=4.0, out="ok")
    assert final["kappa"] == 4.0


def test_a_smooth_ramp_trains_on_two_processes(tmp_path):
    """κ=3 from B = 16, smooth over epochs 1–4: on one process the ramp holds 27 and 37 samples, which two
    processes cannot split; on two, every ramp batch is a multiple of 2 (26, 38) and the run records it."""
    spec = toy_spec(**{"schedule.epochs": 5, "toy.samples": 128})
    path = write_spec(tmp_path, spec, "s.yaml")
    one = make_ctx(tmp_path, spec, kappa=3.0, progressive={"kind": "smooth", "start_epoch": 1, "end_epoch": 4})
    assert [st.batch_size for st, _ in one.plan.stages] == [16, 27, 37, 48]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "emarule", "run", "--spec", str(path), "--kappa", "3", "--progressive", "smooth:1-4",
           "--out", str(tmp_path / "two")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    h = json.loads((tmp_path / "two" / "hparams.json").read_text())
    assert [s["batch_size"] for s in h["layout"]] == [16, 26, 38, 48] and h["world_size"] == 2
    assert [s["kappa"] for s in h["stages"]] == [1.0, 1.625, 2.375, 3.0]
    assert h["progressive"]["batch_multiple"] == 2 and load_checkpoint(tmp_path / "two")["finished"]


def test_a_base_step_is_checked_only_where_its_schedule_is_in_force(tmp_path):
    """At κ < 1 the plan skips the spec's own schedule, and `--progressive constant` replaces it: a base_step
    past the end then names nothing the run does, so it is not refused."""
    spec = toy_spec(**{"schedule.epochs": 2, "progressive": {"kind": "step", "base_step": 1000}})
    final, _ = run_toy(tmp_path, spec, kappa=0.5, out="half")
    assert final["kappa"] == 0.5
    final, _ = run_toy(tmp_path, spec, kappa=2.0, out="constant", progressive={"kind": "constant"})
    assert final["kappa"] == 2.0


def test_resume_leaves_the_world_sizes_ramp_multiple_out():
    """A smooth ramp planned for 2 processes records batch_multiple 2; one resumed on 1 process (or a run
    recorded before the multiple existed) has the same settings: the world size is not compared."""
    from emarule.engine import preflight

    ramp = {"kind": "smooth", "start_epoch": 1, "end_epoch": 2}
    assert preflight.without_world({**ramp, "batch_multiple": 2}) == ramp
    ctx = make_ctx_for_resume(ramp)
    preflight.check_same_settings(ctx, {**preflight.fingerprint(ctx), "progressive": {**ramp, "batch_multiple": 2}})
    with pytest.raises(UserError, match="progressive.end_epoch differ"):
        preflight.check_same_settings(ctx, {**preflight.fingerprint(ctx), "progressive": {**ramp, "end_epoch": 3}})


def make_ctx_for_resume(progressive):
    from types import SimpleNamespace

    spec = {"name": "toy", "batch": {"size": 16}}
    return SimpleNamespace(spec=spec, kappa=2.0, ema_rule="exponential", seed=0, progressive=progressive,
                           experiment="toy", resume_hint=None, out="run")


def test_a_reproductions_ramps_split_over_its_processes(monkeypatch, tmp_path):
    """`emarule reproduce` under torchrun plans its runs as `run` does: byol-r50-lars's slower-ramp arm at
    κ=4 on 2 processes gets even ramp batches (109 samples would not split)."""
    from emarule.analysis.reproduce import command
    from emarule.analysis.reproduce.claims import FAMILIES
    from emarule.cli.main import app
    from typer.testing import CliRunner

    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    got = {}
    monkeypatch.setattr(command, "reproduce", lambda console, family, **kw: got.update(kw))
    result = CliRunner().invoke(app, ["reproduce", "byol-r50-lars", "--preset", "tiny", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    family = FAMILIES["byol-r50-lars"]
    *_, p = got["resolver"](family.experiment, "tiny")(4.0, "exponential", False, family.arms[0])
    batches = [st.batch_size for st, _ in p.stages]
    assert len(batches) > 2 and all(b % 2 == 0 for b in batches), batches
