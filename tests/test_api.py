"""The public Python API (`emarule.__all__`) and the example script, through public names only."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import emarule

ROOT = Path(__file__).resolve().parent.parent

# The practitioner recipe: no name, task or title.
ADAMW = {"batch": {"size": 256},
         "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.05},
         "ema": {"momentum": 0.9998}}


def python(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def cli_error(*args: str) -> str:
    """The one line `emarule` prints for bad input, without its `error: ` prefix."""
    r = subprocess.run([sys.executable, "-m", "emarule", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    return line[len("error: "):]


def api_error(*args, **kwargs) -> str:
    with pytest.raises(emarule.UserError) as e:
        emarule.scale(*args, **kwargs)
    return str(e.value)


# -- the surface ------------------------------------------------------------------------------


def test_public_names_and_import_without_torch():
    assert sorted(emarule.__all__) == ["ModelEma", "Plan", "PowerEma", "Scaled", "ScalingError", "UserError",
                                       "plan_at", "scale"]
    out = python(
        "import json, sys, emarule\n"
        f"p = emarule.scale({ADAMW!r}, 4)\n"
        "torch_after_scale = 'torch' in sys.modules\n"
        "from emarule import ModelEma\n"
        "print(json.dumps({'torch_after_scale': torch_after_scale, 'torch_after_ModelEma': 'torch' in sys.modules,\n"
        "  'ModelEma': ModelEma.__name__, 'in_dir': 'ModelEma' in dir(emarule),\n"
        "  'lr': p['optimizer.lr'], 'betas': p['optimizer.betas'], 'rho': p['ema.momentum']}))\n")
    got = json.loads(out)
    assert got["torch_after_scale"] is False
    assert got["torch_after_ModelEma"] is True and got["ModelEma"] == "ModelEma" and got["in_dir"]
    # the acceptance numbers, computed in a process that never imported torch
    assert got["lr"] == 2e-3
    assert got["betas"] == pytest.approx([0.6, 0.996], abs=1e-15)
    assert got["rho"] == 0.9998**4


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        emarule.NoSuchThing  # noqa: B018


# -- scale ------------------------------------------------------------------------------------


def test_practitioner_dict_at_kappa_4_every_value_with_its_rule():
    p = emarule.scale(ADAMW, 4)
    assert isinstance(p, emarule.Plan) and p.kappa == 4.0 and p.ema_rule == "exponential"
    assert p["batch_size"] == 1024
    assert p["optimizer.lr"] == 2e-3
    assert p["optimizer.betas"] == pytest.approx([0.6, 0.996], abs=1e-15)
    assert p["optimizer.eps"] == 5e-9
    assert p["optimizer.weight_decay"] == 0.05
    assert p["ema.momentum"] == 0.9998**4
    lr = p.values["optimizer.lr"]
    assert isinstance(lr, emarule.Scaled) and (lr.base, lr.unit) == (1e-3, "learning rate")
    assert lr.rule == "Adam Scaling Rule: η̂ = √κ η"
    assert p.values["ema.momentum"].rule == "EMA Scaling Rule: ρ̂ = ρ^κ"
    assert p.values["batch_size"].rule == "B̂ = κB"
    assert p.values["optimizer.betas"].rule == "Adam/RMSProp Scaling Rule: β̂ = 1 − κ(1 − β)"
    assert p.values["optimizer.weight_decay"].rule == "none: λ̂ = λ (as the recipe states)"


def test_batch_size_instead_of_kappa_and_the_default_kappa_1():
    assert emarule.scale(ADAMW, batch_size=1024)["ema.momentum"] == 0.9998**4
    one = emarule.scale(ADAMW)
    assert one.kappa == 1.0 and one["optimizer.lr"] == 1e-3 and one["ema.momentum"] == 0.9998


def test_ema_rule_linear_and_none():
    assert emarule.scale(ADAMW, 4, ema_rule="linear")["ema.momentum"] == pytest.approx(1 - 4 * 0.0002, abs=1e-15)
    base = emarule.scale(ADAMW, 4, ema_rule=None)
    assert base["ema.momentum"] == 0.9998 and base["optimizer.lr"] == 2e-3  # the paper's baseline
    assert base.values["ema.momentum"].rule == "no EMA rule (baseline): ρ̂ = ρ"


def test_smallest_dict_tuples_and_the_callers_dict_left_alone():
    assert dict(emarule.scale({"batch": {"size": 64}}, 2).values) == {
        "batch_size": emarule.Scaled(64, 128.0, "samples", "B̂ = κB")}
    recipe = {"batch": {"size": 256}, "optimizer": {"name": "adam", "lr": 1e-3, "betas": (0.9, 0.999)}}
    p = emarule.scale(recipe, 2)
    assert p["optimizer.betas"] == pytest.approx([0.8, 0.998], abs=1e-15)
    assert recipe["optimizer"]["betas"] == (0.9, 0.999)


def test_sgd_keeps_heavy_ball_momentum_and_auto_weight_decay():
    p = emarule.scale({"batch": {"size": 256}, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9,
                                                             "weight_decay": 1e-4, "weight_decay_rule": "auto"}}, 8)
    assert p["optimizer.lr"] == pytest.approx(0.8) and p["optimizer.momentum"] == 0.9
    assert p["optimizer.weight_decay"] == pytest.approx(1e-4)  # κηλ/η̂ = λ under the SGD rule
    adam = emarule.scale({"batch": {"size": 256}, "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.05,
                                                                "weight_decay_rule": "auto"}}, 4)
    assert adam["optimizer.weight_decay"] == pytest.approx(0.1)  # √κ λ under Adam's


def test_named_experiment_and_yaml_path_match_the_cli_json():
    by_name = emarule.scale("byol-vit", 6)
    by_path = emarule.scale(ROOT / "emarule" / "experiments" / "byol-vit.yaml", 6)
    by_text = emarule.scale(str(ROOT / "emarule" / "experiments" / "byol-vit.yaml"), 6)
    r = subprocess.run([sys.executable, "-m", "emarule", "plan", "byol-vit", "--kappa", "6", "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    for p in (by_name, by_path, by_text):
        assert p.as_dict()["hyperparameters"] == cli["hyperparameters"]
    assert by_name["ema.momentum"] == pytest.approx(0.99**6)


# -- errors: one class, the CLI's messages ---------------------------------------------------------


def test_rule_and_experiment_errors_read_as_the_cli_prints_them():
    assert api_error("byol-vit", 11) == cli_error("plan", "byol-vit", "--kappa", "11")
    # the same message, naming the argument where the CLI names its option
    assert api_error("byol-r18", 300, ema_rule="linear") == cli_error(
        "plan", "byol-r18", "--kappa", "300", "--ema-rule", "linear").replace("--ema-rule exponential",
                                                                              "ema_rule='exponential'")
    assert api_error("no-such-recipe", 2) == cli_error("plan", "no-such-recipe", "--kappa", "2")
    missing = str(ROOT / "no-such.yaml")
    assert api_error(missing, 2) == cli_error("plan", "--spec", missing, "--kappa", "2")
    with pytest.raises(emarule.ScalingError):  # the subclass for a rule that breaks
        emarule.scale("byol-vit", 11)


def test_dict_errors_are_the_cli_messages_without_the_file_name(tmp_path):
    bad = {"name": "mine", "task": "toy", "batch": {"size": 256},
           "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 1.5]}, "ema": {"momentum": 0.99}}
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(bad))  # JSON is YAML
    from_file = cli_error("plan", "--spec", str(path), "--kappa", "2")
    assert from_file == f"{path}: optimizer.betas[1]: must be < 1.0, got 1.5"
    assert api_error(str(path), 2) == from_file
    assert api_error(bad, 2) == "optimizer.betas[1]: must be < 1.0, got 1.5"
    assert api_error({"batch": {"size": 256}, "optimiser": {}}).startswith("optimiser: unknown key (known here:")
    assert api_error({"ema": {"momentum": 0.99}}).startswith("batch.size: missing")


@pytest.mark.parametrize("kwargs, message", [
    ({"kappa": float("nan")}, "kappa must be finite and > 0, got nan"),
    ({"kappa": 0}, "kappa must be finite and > 0, got 0"),
    ({"kappa": "four"}, "kappa must be a number, got 'four' (a str)"),
    ({"batch_size": -1}, "batch_size must be finite and > 0, got -1"),
    ({"kappa": 2, "batch_size": 512}, "give kappa or batch_size, not both"),
    ({"kappa": 2, "ema_rule": "cubic"}, "unknown EMA rule 'cubic'; use exponential or linear"),
    ({"kappa": 2, "progressive": "step"}, "progressive 'step': cannot parse"),
])
def test_bad_arguments_are_user_errors(kwargs, message):
    assert api_error(ADAMW, **kwargs).startswith(message)


def test_not_a_spec():
    assert api_error(42, 2) == "spec must be an experiment name, a YAML path or a dict, got int"


# -- Progressive Scaling from your own loop -------------------------------------------------------


RAMP = {**ADAMW, "schedule": {"epochs": 10}}
EPOCH = 5000  # samples in the caller's training set


@pytest.mark.parametrize("progressive", ["step:4", {"kind": "step", "epoch": 4}])
def test_plan_in_force_follows_the_samples_seen(progressive):
    plan = emarule.scale(RAMP, 4, progressive=progressive)
    before = emarule.plan_at(plan, 4 * EPOCH - 1, EPOCH)
    after = emarule.plan_at(plan, 4 * EPOCH, EPOCH)
    assert (before["batch_size"], before["optimizer.lr"], before["ema.momentum"]) == (256, 1e-3, 0.9998)
    assert (after["batch_size"], after["optimizer.lr"], after["ema.momentum"]) == (1024, 2e-3, 0.9998**4)
    assert emarule.plan_at(plan, 0, EPOCH) is before
    assert emarule.plan_at(plan, 50 * EPOCH, EPOCH) is after  # past the end: the final κ
    assert after.values["optimizer.betas"].scaled == pytest.approx([0.6, 0.996], abs=1e-15)


def test_the_dicts_own_schedule_smooth_ramp_and_constant_plans():
    plan = emarule.scale({**RAMP, "progressive": {"kind": "smooth", "start_epoch": 2, "end_epoch": 6}}, 4)
    batches = [emarule.plan_at(plan, e * EPOCH + 1, EPOCH)["batch_size"] for e in range(10)]
    assert batches == [256, 256, 256, 448, 640, 832, 1024, 1024, 1024, 1024]
    constant = emarule.scale(ADAMW, 4)
    assert emarule.plan_at(constant, 123) is constant  # no schedule: no epoch size needed
    assert emarule.plan_at(emarule.scale(RAMP, 4, progressive="constant"), 0) is not None


def test_a_schedule_in_base_steps_needs_no_epoch_size():
    recipe = {**ADAMW, "schedule": {"total_steps": 1000}}
    plan = emarule.scale(recipe, 2, progressive={"kind": "step", "base_step": 100})
    batches = [emarule.plan_at(plan, seen)["batch_size"] for seen in (0, 100 * 256 - 1, 100 * 256, 10**7)]
    assert batches == [256, 256, 512, 512]


def test_plan_at_errors():
    plan = emarule.scale(RAMP, 4, progressive="step:4")
    with pytest.raises(emarule.UserError, match="scheduled in epochs; pass samples_per_epoch"):
        emarule.plan_at(plan, 10)
    with pytest.raises(emarule.UserError, match="samples_seen must be finite and ≥ 0"):
        emarule.plan_at(plan, -1, EPOCH)
    with pytest.raises(emarule.UserError, match="samples_per_epoch must be finite and > 0"):
        emarule.plan_at(plan, 0, 0)
    assert api_error(RAMP, 0.5, progressive="step:4").startswith("progressive step grows the batch")
    assert api_error(ADAMW, 4, progressive="step:4").startswith("progressive scaling is scheduled in epochs")


# -- ModelEma -------------------------------------------------------------------------------------


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def nudge(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape).to(p.device))  # drawn on the CPU: the same nudge on any device


def test_update_at_twice_the_base_batch_applies_rho_squared():
    model = net()
    ema = emarule.ModelEma(model, 0.9, base_batch_size=32)
    before = [p.clone() for p in ema.module.parameters()]
    nudge(model)
    assert ema.update(model, batch_size=64) == 0.81
    for b, e, p in zip(before, ema.module.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(e, 0.81 * b + 0.19 * p)
    assert ema.update(model, batch_size=32) == 0.9
    assert ema.update(model, batch_size=8) == pytest.approx(0.9**0.25)


def test_the_rule_in_modelema_is_the_plans_rho_at_every_stage():
    plan = emarule.scale(RAMP, 4, progressive="smooth:2-6")
    model = net()
    ema = emarule.ModelEma(model, RAMP["ema"]["momentum"], base_batch_size=RAMP["batch"]["size"])
    for seen in range(0, 10 * EPOCH, EPOCH):
        now = emarule.plan_at(plan, seen, EPOCH)
        assert ema.update(model, batch_size=now["batch_size"]) == pytest.approx(now["ema.momentum"], rel=1e-15)


def test_without_base_batch_size_a_plain_ema():
    model = net()
    ema = emarule.ModelEma(model, 0.9)
    assert ema.update(model) == 0.9
    assert ema.update(model, batch_size=4096) == 0.9  # no base batch: the momentum as given


def test_a_scaling_ema_needs_the_batch_size_and_valid_values():
    model = net()
    ema = emarule.ModelEma(model, 0.9, base_batch_size=32)
    with pytest.raises(ValueError, match="pass update\\(model, samples_seen=S\\)"):
        ema.update(model)
    with pytest.raises(ValueError, match="batch_size must be a finite number > 0"):
        ema.update(model, batch_size=0)
    with pytest.raises(ValueError, match="base_batch_size must be a finite number > 0"):
        emarule.ModelEma(model, 0.9, base_batch_size=-32)
    with pytest.raises(ValueError, match="not a usable EMA momentum"):
        emarule.ModelEma(model, 1.5)


def test_bf16_model_fp32_shadow_with_the_rule():
    model = net().to(torch.bfloat16)
    ema = emarule.ModelEma(model, 0.999, base_batch_size=256)
    assert all(p.dtype == torch.float32 for p in ema.module.parameters())
    ref = [p.detach().double() for p in model.parameters()]
    rho = 0.999**4
    for _ in range(10):
        nudge(model)
        assert ema.update(model, batch_size=1024) == rho
        ref = [rho * r + (1 - rho) * p.double() for r, p in zip(ref, model.parameters(), strict=True)]
    for e, r in zip(ema.module.parameters(), ref, strict=True):
        torch.testing.assert_close(e.double(), r, rtol=0, atol=1e-6)


def test_state_dict_round_trip_and_old_dicts():
    model = net()
    ema = emarule.ModelEma(model, 0.99, base_batch_size=128)
    nudge(model)
    ema.update(model, batch_size=512)
    state = ema.state_dict()
    assert state["_extra_state"]["base_batch_size"] == 128 and state["_extra_state"]["samples_seen"] == 512
    other = emarule.ModelEma(net(), 0.5)
    other.load_state_dict(state)
    assert other.momentum == 0.99 and other.base_batch_size == 128
    assert other.momentum_at(batch_size=512) == 0.99**4
    for a, b in zip(other.module.state_dict().values(), ema.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    old = {"module": ema.module.state_dict(), "momentum": 0.9, "buffers": "copy", "start_samples": 0.0, "updates": 17}
    plain = emarule.ModelEma(net(), 0.5)
    plain.load_state_dict(old)  # a checkpoint written before base_batch_size existed
    assert plain.momentum == 0.9 and plain.base_batch_size is None and plain.update(model) == 0.9


def test_wrapped_models_are_unwrapped(tmp_path):
    """DDP (one gloo process), DataParallel and torch.compile: the EMA holds and reads the inner module."""
    import torch.distributed as dist

    plain = net()
    reference = emarule.ModelEma(plain, 0.9, base_batch_size=32)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        gpu = "cuda" if torch.cuda.is_available() else "cpu"  # DataParallel on a GPU machine wants cuda:0
        wrapped = [nn.parallel.DistributedDataParallel(net()), nn.DataParallel(net().to(gpu)), torch.compile(net())]
        emas = [emarule.ModelEma(w, 0.9, base_batch_size=32) for w in wrapped]
        for e in emas:
            assert isinstance(e.module, nn.Sequential)
            assert list(e.module.state_dict()) == list(plain.state_dict())  # no `module.` prefix
        torch.manual_seed(1)
        nudge(plain)
        for w in wrapped:
            torch.manual_seed(1)
            nudge(w)
        assert reference.update(plain, batch_size=128) == 0.9**4
        for w, e in zip(wrapped, emas, strict=True):
            assert e.update(w, batch_size=128) == 0.9**4
            for a, b in zip(e.module.state_dict().values(), reference.module.state_dict().values(), strict=True):
                if a.is_cuda:  # CUDA's lerp rounds differently from the CPU's (fused multiply-add)
                    torch.testing.assert_close(a.cpu(), b, rtol=1e-6, atol=1e-7)
                else:
                    assert torch.equal(a, b)
    finally:
        dist.destroy_process_group()


# -- the example ----------------------------------------------------------------------------------


def test_example_script_runs_and_the_rule_keeps_the_emas_close():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ema_in_your_loop.py")], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "κ=4: batch 128, lr 0.2 (SGD Scaling Rule: η̂ = κη), EMA ρ 0.960596 (EMA Scaling Rule: ρ̂ = ρ^κ)" in out

    def row(label):
        m = re.search(rf"^{re.escape(label)}\s+EMA accuracy ([\d.]+)(?:\s+distance ([\d.]+))?$", out, re.M)
        assert m, out
        return float(m.group(1)), float(m.group(2) or "nan")

    (acc1, _), (acc_rule, d_rule), (acc_none, d_none) = row("κ=1"), row("κ=4 with the EMA rule"), row("κ=4 without it")
    assert min(acc1, acc_rule) > 0.8 and abs(acc1 - acc_rule) < min(0.03, abs(acc1 - acc_none))
    assert d_rule < 0.1 and d_none > 4 * d_rule and not math.isnan(d_none)


def test_scale_refuses_a_string_or_a_bool_kappa_in_api_words():
    for kwargs in ({"kappa": "2"}, {"kappa": True}, {"batch_size": "64"}, {"kappa": 2, "batch_size": 64}):
        with pytest.raises(emarule.UserError) as err:
            emarule.scale(ADAMW, **kwargs)
        assert "--" not in str(err.value) and ("kappa" in str(err.value) or "batch_size" in str(err.value))


def test_linear_rules_give_the_readmes_values_not_float_noise():
    recipe = {"batch": {"size": 256}, "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999]},
              "ema": {"momentum": 0.9998}}
    assert emarule.scale(recipe, 4)["optimizer.betas"] == [0.6, 0.996]
    assert emarule.scale(recipe, 4, ema_rule="linear")["ema.momentum"] == 0.9992


# -- numbers from NumPy and torch, warnings, missing names ----------------------------------------


@pytest.mark.parametrize("k", [__import__("numpy").int64(4), __import__("numpy").float32(4.0), torch.tensor(4),
                               torch.tensor([4.0])])
def test_numpy_and_tensor_numbers_are_numbers(k):
    assert emarule.scale(ADAMW, k)["optimizer.lr"] == emarule.scale(ADAMW, 4)["optimizer.lr"]
    plan = emarule.scale(RAMP, 4, progressive="step:4")
    assert emarule.plan_at(plan, torch.tensor(4 * EPOCH), EPOCH)["batch_size"] == 1024


def test_a_non_number_is_refused_by_its_type():
    assert api_error(ADAMW, torch.tensor([1.0, 2.0])).startswith("kappa must be a number, got tensor")
    assert api_error(ADAMW, [4]).startswith("kappa must be a number, got [4] (a list)")


def test_plan_at_takes_the_callers_epoch_when_an_epoch_drops_its_last_batch():
    plan = emarule.scale(RAMP, 4, progressive="step:4")
    seen = 4 * (EPOCH - EPOCH % 256)  # four epochs of a loader with drop_last=True: short of 4 × EPOCH
    assert emarule.plan_at(plan, seen, EPOCH)["batch_size"] == 256  # the quotient lags behind the loop
    assert emarule.plan_at(plan, seen, epoch=4)["batch_size"] == 1024
    assert emarule.plan_at(plan, seen, EPOCH, epoch=3)["batch_size"] == 256  # the loop's epoch wins
    with pytest.raises(emarule.UserError, match="epoch must be finite and ≥ 0"):
        emarule.plan_at(plan, 0, epoch=-1)


def test_a_plans_warnings_are_python_warnings_in_the_apis_words():
    with pytest.warns(UserWarning, match=r"pass batch_size=N") as caught:
        plan = emarule.scale({"batch": {"size": 32}}, 1.3)
    assert plan.warnings == [str(w.message) for w in caught] and "--" not in plan.warnings[0]


def test_a_missing_name_lists_what_the_plan_holds():
    plan = emarule.scale(ADAMW, 2)
    with pytest.raises(KeyError, match="'optimizer.momentum' is not in this plan; it holds batch_size, "):
        plan["optimizer.momentum"]
    assert plan.get("optimizer.momentum") is None


# -- every argument checked where it enters: a named ValueError or TypeError, never Python's or torch's own ------


@pytest.mark.parametrize("call, kind, message", [
    (lambda: emarule.scale(ADAMW, 10**400), ValueError, "kappa must be finite, got an integer of 401 digits"),
    (lambda: emarule.scale(ADAMW, batch_size=-(10**400)), ValueError, "batch_size must be finite"),
    (lambda: emarule.plan_at({"stages": []}, 0), TypeError, "plan must be the Plan that emarule.scale returns"),
    (lambda: emarule.plan_at(emarule.scale(ADAMW, 2), [1, 2]), TypeError, "samples_seen must be a number"),
    (lambda: emarule.scale(ADAMW, 2, progressive=3), TypeError, "progressive must be a string"),
])
def test_bad_api_arguments_raise_named_value_or_type_errors(call, kind, message):
    with pytest.raises(kind, match=re.escape(message)) as e:
        call()
    assert isinstance(e.value, emarule.UserError)


def test_user_error_is_a_value_error():
    with pytest.raises(ValueError, match="kappa must be finite and > 0"):
        emarule.scale(ADAMW, -1)


def test_a_spec_that_holds_itself_is_refused_by_its_key():
    spec = {"batch": {"size": 256}, "optimizer": {"name": "sgd", "lr": 0.1}}
    spec["optimizer"]["again"] = spec
    assert api_error(spec, 2).startswith("spec key optimizer.again holds a dict or list it is itself inside")


def test_numpy_numbers_inside_a_dict_spec_are_numbers():
    np = pytest.importorskip("numpy")
    spec = {"batch": {"size": np.int64(256)}, "optimizer": {"name": "sgd", "lr": np.float32(0.5)}}
    assert emarule.scale(spec, batch_size=np.int64(512))["optimizer.lr"] == pytest.approx(1.0)


@pytest.mark.parametrize("call, kind, message", [
    (lambda m: emarule.ModelEma(m, 0.99, device="nonsense"), ValueError, "device 'nonsense' is not a device"),
    (lambda m: emarule.ModelEma(m, 0.99, device=[0]), TypeError, "device must be a torch.device"),
    (lambda m: emarule.ModelEma(m, 0.99).update(m.state_dict()), TypeError, "got OrderedDict (a state_dict"),
    (lambda m: emarule.ModelEma(m, 0.99).copy_from(None), TypeError, "model must be the nn.Module"),
    (lambda m: emarule.PowerEma(m, snapshot_every=10).update({}, batch_size=2), TypeError, "model must be"),
    (lambda m: emarule.PowerEma(m, snapshot_every=10, snapshot_dir=3), TypeError, "snapshot_dir must be"),
])
def test_bad_ema_arguments_are_refused_by_name(call, kind, message):
    with pytest.raises(kind, match=re.escape(message)):
        call(nn.Linear(2, 2))


def test_auto_weight_decay_follows_the_lr_rule_without_an_lr():
    """λ̂ = κηλ/η̂ depends only on the lr rule's ratio: a spec with no lr (or lr 0) scales its decay all the same,
    and SGD leaves λ exactly."""
    def wd(name, **opt):
        spec = {"batch": {"size": 256},
                "optimizer": {"name": name, "weight_decay": 0.05, "weight_decay_rule": "auto", **opt}}
        return emarule.scale(spec, 4)["optimizer.weight_decay"]

    assert wd("adamw") == pytest.approx(0.1) == wd("adamw", lr=1e-3) == pytest.approx(wd("adamw", lr=0.0))
    assert wd("lamb") == pytest.approx(0.1)
    assert wd("sgd") == 0.05 and wd("sgd", lr=0.1) == 0.05


@pytest.mark.parametrize("base,target", [(100, 232), (60, 168), (100, 2552)])
def test_scaling_to_a_batch_size_gives_that_batch_exactly(base, target, recwarn):
    plan = emarule.scale({"batch": {"size": base}}, batch_size=target)
    assert plan["batch_size"] == target and isinstance(plan["batch_size"], float)
    assert not [w for w in recwarn if "whole number" in str(w.message)]


def test_a_number_beyond_float_range_is_a_user_error():
    with pytest.raises(emarule.UserError, match=r"optimizer\.lr: must be finite"):
        emarule.scale({"batch": {"size": 256}, "optimizer": {"lr": 10**400}}, 2)


def test_stage_plans_warn_in_the_apis_words():
    spec = {"batch": {"size": 3}, "schedule": {"epochs": 10}}
    with pytest.warns(UserWarning):
        plan = emarule.scale(spec, 2.5, progressive="step:5")
    words = [w for _, p in plan.stages for w in p.warnings] + plan.warnings
    assert words and not [w for w in words if "--" in w]
