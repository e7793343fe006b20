"""`emarule plan --timm-args`: timm's args.yaml (written by timm's own parser, tests/data/timm/) scaled by the rules."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.errors import UserError
from emarule.scaling import timm_args

DATA = Path(__file__).parents[1] / "data" / "timm"
SGD, ADAMW, DEFAULTS = DATA / "sgd_resnet50.yaml", DATA / "adamw_vit.yaml", DATA / "defaults_ema.yaml"
runner = CliRunner()


def cli(*args, code=0):
    r = runner.invoke(app, ["plan", *map(str, args)])
    assert r.exit_code == code, r.output
    return r.output


def values(path, *args):
    plan = json.loads(cli("--timm-args", path, *args, "-f", "json"))
    return {k: v["scaled"] for k, v in plan["hyperparameters"].items()}


def test_sgd_with_an_explicit_lr():
    v = values(SGD, "--batch-size", "4096")  # 256 → 4096: κ = 16
    assert v["batch_size"] == 4096 and v["lr"] == pytest.approx(6.4)
    assert v["model_ema_decay"] == pytest.approx(0.9999 ** 16)
    assert v["weight_decay"] == pytest.approx(1e-4)  # coupled decay under SGD: κηλ/η̂ = λ
    assert v["momentum"] == 0.9 and v["warmup_epochs"] == 5 and v["epochs"] == 90
    assert v["log_interval"] == 3  # 50 batches / 16
    assert v["warmup_lr"] == pytest.approx(16e-5)


def test_adamw_with_lr_base_and_accumulation():
    v = values(ADAMW, "--batch-size", "1024")  # 128 × 2 accumulation = 256 → 1024: κ = 4
    assert v["global batch"] == 1024 and v["batch_size"] == 512
    assert v["lr_base"] == 5e-4 and v["lr (derived by timm)"] == pytest.approx(5e-4 * math.sqrt(1024 / 512))
    assert v["opt_betas"] == pytest.approx([0.6, 0.996]) and v["opt_eps"] == pytest.approx(5e-9)
    assert v["weight_decay"] == pytest.approx(0.1)  # decoupled: √κ λ
    assert v["model_ema_decay"] == pytest.approx(0.99996 ** 4)


def test_world_size_enters_the_global_batch():
    v = values(ADAMW, "--batch-size", "2048", "--world-size", "2")  # 128 × 2 × 2 = 512 → 2048
    assert v["batch_size"] == 512 and v["model_ema_decay"] == pytest.approx(0.99996 ** 4)


def test_defaults_file_derives_lr_linearly_for_sgd():
    v = values(DEFAULTS, "--kappa", "8")
    assert v["lr (derived by timm)"] == pytest.approx(0.1 * 1024 / 256)
    assert v["model_ema_decay"] == pytest.approx(0.9998 ** 8)


def test_adam_defaults_are_written_scaled():
    a = timm_args.load(SGD)
    a.update(opt="adam", opt_betas=None, opt_eps=None)
    p, out = timm_args.timm_plan(a, "x", kappa=4)
    assert out["opt_betas"] == pytest.approx([0.6, 0.996]) and out["opt_eps"] == pytest.approx(5e-9)
    assert out["weight_decay"] == a["weight_decay"]  # Adam's L2 is part of the loss
    assert out["lr"] == pytest.approx(0.8)


def test_rmsprop_writes_the_rules_lr_where_timm_would_scale_lr_base_linearly():
    a = timm_args.load(DEFAULTS)
    a.update(opt="rmsproptf")  # no "ada" in the name: timm derives 0.1 × (128/256)^1 = 0.05 at the base batch
    p, out = timm_args.timm_plan(a, "x", kappa=4)
    assert out["lr"] == pytest.approx(0.05 * 2) and p["lr"] == out["lr"]  # √κ, not timm's κ
    assert any("alpha=0.6" in w for w in p.warnings)


@pytest.mark.parametrize("opt,default", [("rmsprop", 1e-8), ("rmsproptf", 1e-10)])
def test_rmsprop_without_opt_eps_gets_its_default_scaled(opt, default):
    """torch's RMSprop and timm's RMSpropTF keep ε = 1e-8 and 1e-10 when args.yaml has none: the rule's ε/√κ
    is written, since a missing opt_eps would keep the default at every κ."""
    a = timm_args.load(DEFAULTS)
    a.update(opt=opt, opt_eps=None)
    p, out = timm_args.timm_plan(a, "x", kappa=4)
    assert out["opt_eps"] == pytest.approx(default / 2)


def test_unknown_optimizer_is_left_alone_with_a_warning():
    a = timm_args.load(SGD)
    a.update(opt="lion")
    p, out = timm_args.timm_plan(a, "x", kappa=2)
    assert out["lr"] == 0.4 and any("no known scaling rule" in w for w in p.warnings)
    assert out["model_ema_decay"] == pytest.approx(0.9999 ** 2)


def test_format_timm_writes_a_file_timm_reads_back(tmp_path):
    dest = tmp_path / "new_args.yaml"
    out = cli("--timm-args", SGD, "--batch-size", "1024", "--format", "timm", "--out", dest)
    assert "train.py --config" in out
    old, new = yaml.safe_load(SGD.read_text()), yaml.safe_load(dest.read_text())
    changed = {k for k in old if old[k] != new[k]}
    assert changed == {"batch_size", "lr", "model_ema_decay", "log_interval", "warmup_lr"}
    assert new["lr"] == pytest.approx(1.6) and new["model_ema_decay"] == pytest.approx(0.9999 ** 4)
    assert [p.name for p in tmp_path.iterdir()] == ["new_args.yaml"]  # no temporary file left


def test_a_short_file_gets_only_the_values_the_rules_change():
    p, out = timm_args.timm_plan({"batch_size": 64, "opt": "sgd", "lr": 0.1}, "x", kappa=2)
    assert out == {"batch_size": 128, "opt": "sgd", "lr": 0.2, "warmup_lr": 2e-5,
                   "model_ema_decay": pytest.approx(0.9998 ** 2)}  # train.py's defaults, scaled
    assert p["weight_decay"] == 2e-5 and p["momentum"] == 0.9  # printed, unchanged, not written


def test_format_timm_without_out_prints_yaml():
    assert yaml.safe_load(cli("--timm-args", SGD, "-k", "2", "-f", "timm"))["batch_size"] == 512


def test_plan_timm_does_not_import_torch():
    code = ("import sys\nfrom emarule.cli.main import main\n"
            f"try:\n    main(['plan', '--timm-args', {str(ADAMW)!r}, '-b', '512'])\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _bad(*args, needle):
    r = runner.invoke(app, ["plan", *map(str, args)])
    text = r.output.strip()
    assert r.exit_code == 2 and "Traceback" not in text, text
    assert len(text.splitlines()) == 1 and text.startswith("error: ") and needle in text, text


@pytest.mark.parametrize("content,needle", [
    ("batch_size: [1\n", "not valid YAML at line"),
    ("- 1\n- 2\n", "not a timm args.yaml"),
    ("name: byol\n", "not a timm args.yaml"),
    ("batch_size: '256'\nopt: sgd\n", "batch_size must be a whole number"),
    ("batch_size: 256\nopt: sgd\nmodel_ema_decay: high\n", "model_ema_decay must be a number"),
    ("batch_size: 256\nopt: adamw\nopt_betas: 0.9\n", "opt_betas must be a list"),
    ("batch_size: 256\nopt: sgd\nmodel_ema: 'yes'\n", "model_ema must be true or false"),
    ("batch_size: 256\nopt: sgd\nmodel_ema_decay: 1.5\n", "model_ema_decay must be in [0, 1)"),
    ("batch_size: 256\nopt: sgd\nlog_interval: [50]\n", "log_interval must be a whole number ≥ 0, got [50]"),
    ("batch_size: 256\nopt: sgd\nrecovery_interval: 2.5\n", "recovery_interval must be a whole number"),
    ("batch_size: 256\nopt: sgd\nepochs: [1, x]\n", "epochs must be a number or a list of numbers"),
])
def test_bad_files(tmp_path, content, needle):
    f = tmp_path / "args.yaml"
    f.write_text(content)
    _bad("--timm-args", f, "-b", "512", needle=needle)


def test_bad_options(tmp_path):
    _bad("--timm-args", tmp_path / "missing.yaml", "-b", "512", needle="no such file")
    _bad("--timm-args", tmp_path, "-b", "512", needle="is a folder")
    _bad("--timm-args", SGD, "-b", "0", needle="finite and > 0")
    _bad("--timm-args", SGD, "-b", "-512", needle="finite and > 0")
    _bad("--timm-args", SGD, needle="give --kappa K or --batch-size B")
    _bad("--timm-args", ADAMW, "-b", "1001", needle="pick a multiple of 2")
    _bad("--timm-args", SGD, "-b", "512", "--out", tmp_path / "x.yaml", needle="add --format timm")
    _bad("-b", "512", "-f", "timm", needle="need --timm-args")
    _bad("byol-vit", "--timm-args", SGD, "-b", "512", needle="replaces EXPERIMENT")
    _bad("--timm-args", ADAMW, "-b", "4096", needle="opt_betas[0]")
    _bad("--timm-args", SGD, "-b", "512", "-f", "timm", "--out", tmp_path / "no" / "x.yaml", needle="does not exist")
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "no").exists()


def test_api_refuses_a_bad_world_size_and_a_bad_dict():
    with pytest.raises(UserError, match="world size"):
        timm_args.timm_plan(timm_args.load(SGD), "x", kappa=2, world_size=0)
    with pytest.raises(UserError, match="lr must be a number or null"):
        timm_args.timm_plan({"batch_size": 64, "opt": "sgd", "lr": "0.1"}, "x", kappa=2)


@pytest.mark.parametrize("opt,eps", [("lookahead_rmsproptf", 1e-10), ("RMSProp", 1e-8), ("Lookahead_RMSpropTF", 1e-10)])
def test_an_optimizer_name_is_read_as_timm_reads_it(tmp_path, opt, eps):
    f = tmp_path / "args.yaml"
    f.write_text(f"batch_size: 128\nopt: {opt}\nlr: 0.1\n")
    plan, out = timm_args.timm_plan(timm_args.load(f), "x", kappa=4)
    assert out["opt_eps"] == pytest.approx(eps / 2) and out["lr"] == pytest.approx(0.2)


def test_epoch_keys_take_lists_and_batch_counts_are_divided(tmp_path):
    f = tmp_path / "args.yaml"
    f.write_text("batch_size: 128\nopt: sgd\ndecay_milestones: [30, 60]\nlog_interval: 50\n")
    plan, out = timm_args.timm_plan(timm_args.load(f), "x", kappa=2)
    assert plan["decay_milestones"] == [30, 60] and out["log_interval"] == 25


def test_rmsprops_alpha_is_exact_at_its_limit_and_none_is_offered_past_it():
    # 1 − 10(1 − 0.9) is 0, not float's 2.2e-16; past κ=10 no alpha in [0, 1) keeps the horizon
    a = timm_args.load(DEFAULTS)
    a.update(opt="rmsproptf")
    at_limit = timm_args.timm_plan(a, "x", kappa=10)[0]
    assert any("alpha=0.0 " in w for w in at_limit.warnings)
    past = timm_args.timm_plan(a, "x", kappa=20)[0]
    assert not any("alpha=-" in w for w in past.warnings)
    assert any("no alpha keeps its horizon at κ=20" in w for w in past.warnings)


def test_the_written_args_are_readable_by_everyone_as_the_umask_allows(tmp_path):
    import os

    out = tmp_path / "args.yaml"
    mask = os.umask(0o022)
    try:
        timm_args.write({"batch_size": 128}, out)
    finally:
        os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o644 and yaml.safe_load(out.read_text()) == {"batch_size": 128}
