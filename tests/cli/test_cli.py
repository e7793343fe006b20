"""The torch-free commands through Typer's runner, every bad-input path included."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app, main
from engine_util import rows_without_wall_clock

runner = CliRunner()


def ok(*args):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def bad(*args, needle=""):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 2, r.output
    text = r.output.strip()
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert needle in text, text
    return text


def test_plan_byol_vit_kappa_6_table():
    out = ok("plan", "byol-vit", "--kappa", "6")
    assert "24,576" in out and "0.94148" in out and "(0.4, 0.7)" in out and "Adam Scaling Rule" in out
    assert "step at epoch 60" in out and "0–60" in out and "60–480" in out  # the spec's step: one row per stage
    verbose = ok("plan", "byol-vit", "--kappa", "6", "--verbose")
    assert "epochs 0–60" in verbose and "epochs 60–480" in verbose  # a full table per stage


def test_smooth_schedule_is_one_compact_table():
    out = ok("plan", "dino-vit", "--kappa", "2")
    assert len(out.splitlines()) < 100 and "61 stages" in out
    assert len(ok("plan", "dino-vit", "--kappa", "2", "--verbose").splitlines()) > 900
    d = json.loads(ok("plan", "dino-vit", "--kappa", "2", "--format", "json"))
    assert len(d["stages"]) == 61 and all(st["hyperparameters"] for st in d["stages"])


def test_plan_json_shape_for_tools():
    d = json.loads(ok("plan", "byol-vit", "--kappa", "6", "--format", "json"))
    assert d["experiment"] == "byol-vit" and d["kappa"] == 6 and d["ema_rule"] is True
    hp = d["hyperparameters"]
    assert hp["batch_size"]["scaled"] == 24576
    assert hp["optimizer.betas"] == {"base": [0.9, 0.95], "scaled": [0.4, 0.7], "unit": "momentum",
                                     "rule": "Adam/RMSProp Scaling Rule: β̂ = 1 − κ(1 − β)"}
    assert hp["ema.momentum"]["scaled"] == pytest.approx(0.99**6)


def test_plan_yaml_and_batch_size_and_no_rule():
    import yaml

    d = yaml.safe_load(ok("plan", "byol-r18", "--batch-size", "4096", "--no-ema-rule", "--format", "yaml"))
    assert d["kappa"] == 4 and d["ema_rule"] is False
    assert d["hyperparameters"]["ema.momentum"]["scaled"] == 0.992
    assert d["hyperparameters"]["optimizer.lr"]["scaled"] == pytest.approx(0.08)


def test_plan_own_spec_set_and_progressive(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\n"
                 "ema: {momentum: 0.99}\nschedule: {kind: cosine, epochs: 10}\n")
    d = json.loads(ok("plan", "--spec", str(p), "--kappa", "2", "--set", "optimizer.lr=0.2",
                      "--progressive", "step:3", "--format", "json"))
    assert d["hyperparameters"]["optimizer.lr"]["scaled"] == pytest.approx(0.4)
    assert [s["kappa"] for s in d["stages"]] == [1, 2]


def test_plan_linear_rule():
    d = json.loads(ok("plan", "byol-r18", "--kappa", "2", "--ema-rule", "linear", "--format", "json"))
    assert d["hyperparameters"]["ema.momentum"]["scaled"] == pytest.approx(0.984)


@pytest.mark.parametrize("args,needle", [
    (["plan", "byol-vit", "--kappa", "0"], "--kappa must be finite and > 0"),
    (["plan", "byol-vit", "--kappa", "-2"], "--kappa must be finite and > 0"),
    (["plan", "byol-vit", "--kappa", "nan"], "--kappa must be finite"),
    (["plan", "byol-vit", "--kappa", "inf"], "--kappa must be finite"),
    (["plan", "byol-vit", "--kappa", "abc"], "--kappa must be a number"),
    (["plan", "byol-vit"], "give --kappa K or --batch-size B"),
    (["plan", "byol-vit", "--kappa", "2", "--batch-size", "8192"], "not both"),
    (["plan", "nope", "--kappa", "2"], "unknown experiment 'nope'"),
    (["plan", "--spec", "/does/not/exist.yaml", "--kappa", "2"], "spec file not found"),
    (["plan", "byol-vit", "--kappa", "11"], "optimizer.betas[0]"),
    (["plan", "byol-r18", "--kappa", "200", "--ema-rule", "linear"], "linear EMA rule"),
    (["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.foo=1"], "--set optimizer.foo: unknown key"),
    (["plan", "byol-r18", "--kappa", "2", "--set", "ema.momentum=2"], "ema.momentum: must be < 1"),
    (["plan", "byol-r18", "--kappa", "2", "--preset", "huge"], "no preset 'huge'"),
    (["plan", "byol-r18", "--kappa", "2", "--progressive", "ramp"], "--progressive"),
    (["plan", "ctc-polyak", "--kappa", "2", "--progressive", "step:3"], "schedule.epochs"),
    (["table", "momenta", "--momentum", "1.5"], "--momentum must be in [0, 1)"),
    (["table", "momenta", "--momentum", "x"], "--momentum must be a number"),
    (["table", "lr", "--lr", "-1"], "--lr must be finite and > 0"),
    (["table", "momenta", "--batch-sizes", "32,zero"], "--batch-sizes must be a number"),
    (["table", "momenta", "--lr", "0.1"], "--lr goes with"),
    (["table", "momenta", "--base-batch-size", "512"], "needs --momentum"),
    (["limits", "--momentum", "1", "--batch-size", "256"], "--momentum must be in (0, 1)"),
    (["limits", "--momentum", "0.99", "--batch-size", "0"], "--batch-size must be finite and > 0"),
    (["limits", "--momentum", "0.99", "--batch-size", "256", "--dtype", "float64"],
     "--dtype float64: use float32, bfloat16 or float16"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    bad(*args, needle=needle)


def test_malformed_and_invalid_spec_files(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nbatch: {size: 1\n")
    bad("plan", "--spec", str(broken), "--kappa", "2", needle="line")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: x\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\n"
                     "ema: {momentum: 0.99, update_from: later}\n")
    bad("plan", "--spec", str(wrong), "--kappa", "2", needle="ema.update_from: must be one of")


def test_table_defaults_are_the_papers():
    out = ok("table", "momenta")
    for cell in ("0.99999", "0.93798", "0.07632", "0.61425"):
        assert cell in out
    csv = ok("table", "lr", "--format", "csv").splitlines()
    assert csv[0].startswith("batch_size,") and csv[1].split(",")[:2] == ["32", "0.0125"]
    assert len(csv) == 13


def test_table_custom_values_markdown():
    out = ok("table", "momenta", "--momentum", "0.99", "--momentum", "0.996", "--base-batch-size", "1024",
             "--batch-sizes", "1024,2048", "--format", "markdown")
    lines = out.strip().splitlines()
    assert lines[2].startswith("| 1024 | **0.99** | **0.996** |")
    assert lines[3] == "| 2048 | 0.9801 | 0.99202 |"
    out = ok("table", "lr", "--lr", "0.001", "--optimizer", "adam", "--base-batch-size", "256",
             "--batch-sizes", "1024", "--format", "csv")
    assert out.strip().splitlines()[1] == "1024,0.002"


def test_limits_json_is_strict_json_past_float64s_range():
    def no_constants(name):
        raise AssertionError(f"{name} is not JSON")

    # a bound's batch size past float64's range is no limit to print: refused, as plan refuses a scaled value
    bad("limits", "--momentum", "0.99", "--batch-size", "1e308", "--format", "json",
        needle="kappa_max κ = 1724 gives a batch size past float64's range")
    d = json.loads(ok("limits", "--momentum", "0.99", "--batch-size", "256", "--relative-gap", "1e308",
                      "--format", "json"), parse_constant=no_constants)
    assert "-0.0" not in json.dumps(d)


def test_limits_json():
    d = json.loads(ok("limits", "--momentum", "0.996", "--batch-size", "4096", "--format", "json"))
    assert 4000 < d["bounds"]["kappa_max"]["kappa"] < 4500
    assert d["bounds"]["kappa_max"]["formula"] == "log(2^-25) / log(rho)"
    lo, hi = d["meaningful_batch_size"]
    assert lo < 1 and hi > 16e6
    out = ok("limits", "--momentum", "0.9999", "--batch-size", "256", "--dtype", "bfloat16")
    assert "meaningful" in out


@pytest.mark.parametrize("alias,name", [("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"),
                                        ("tf32", "float32"), ("BF16", "bfloat16")])
def test_limits_reads_a_dtypes_short_name_as_its_full_one(alias, name):
    args = ["limits", "--momentum", "0.996", "--batch-size", "4096", "--format", "json"]
    assert json.loads(ok(*args, "--dtype", alias)) == json.loads(ok(*args, "--dtype", name))
    assert json.loads(ok(*args, "--dtype", alias))["dtype"] == name


def test_limits_titles_a_momentum_close_to_one_with_every_digit():
    out = ok("limits", "--momentum", "0.99999999999", "--batch-size", "4096")
    assert "ρ=0.99999999999 at batch 4096" in out and "ρ=1 " not in out
    assert "ρ=0.996 at batch" in ok("limits", "--momentum", "0.996", "--batch-size", "4096")


@pytest.mark.parametrize("command", ["run", "sweep", "reproduce", "compare", "plan", "table", "limits", "list"])
def test_help_names_every_value_and_shows_no_type_labels(command):
    text = ok(command, "--help")
    for label in ("<str>", "<int>", "<bool>", "<list[Path]>", "<int range>", "<path>"):
        assert label not in text, (command, label)
    if command in ("run", "sweep", "plan"):
        assert "EXPERIMENT" in text
    metavars = {"run": ("INT", "DIR", "NAME"), "sweep": ("RULE,RULE", "NAME", "N|A-B|S,S,..."),
                "reproduce": ("FAMILY", "N|A-B|S,S,...", "DIR"), "compare": ("RUN_DIR", "NAME", "PNG")}
    for m in metavars.get(command, ()):
        assert m in text, (command, m)


def test_list_shows_nine():
    out = ok("list")
    for name in ("parabola", "precision", "polyak-r50", "ctc-polyak", "ctc-pseudo-label", "byol-r18",
                 "byol-vit", "byol-r50-lars", "dino-vit"):
        assert name in out


@pytest.mark.parametrize("argv,needle", [
    (["plan", "byol-vit", "--kappax", "2"], "No such option: --kappax"),
    (["table", "speeds"], "speeds"),
    (["limits", "--momentum", "0.99"], "--batch-size"),
])
def test_usage_errors_through_main_are_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err


def test_torch_free_commands_do_not_import_torch():
    code = ("import sys\nfrom emarule.cli.main import main\n"
            "for argv in (['table','momenta'], ['plan','byol-vit','--kappa','6'], "
            "['limits','--momentum','0.99','--batch-size','256'], ['list']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code == 0, argv\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "emarule", "table", "momenta", "--format", "csv"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("batch_size,")


def test_spec_schedule_is_skipped_below_kappa_one():
    d = json.loads(ok("plan", "byol-vit", "--kappa", "0.5", "--format", "json"))
    assert "stages" not in d and d["progressive"] is None
    assert any("skipped at κ=0.5" in w for w in d["warnings"])
    assert d["hyperparameters"]["batch_size"]["scaled"] == 2048
    d = json.loads(ok("plan", "byol-vit", "--kappa", "2", "--format", "json"))
    assert d["progressive"] == {"kind": "step", "epoch": 60}


def test_progressive_section_is_validated_and_settable():
    d = json.loads(ok("plan", "byol-vit", "--kappa", "2", "--set", "progressive.epoch=30", "--format", "json"))
    assert [s["start_epoch"] for s in d["stages"]] == [0, 30]
    bad("plan", "byol-vit", "--kappa", "2", "--set", "progressive.typo=1", needle="--set progressive.typo: unknown key")
    bad("plan", "byol-r18", "--kappa", "2", "--set", "progressive={epoch: 30}", needle="progressive: missing kind")


def test_help_version_and_list():
    assert ok("--version").strip() == "emarule 0.1.0"
    assert "Usage" in ok("-h") and "Usage" in ok("plan", "-h")
    run_help = ok("run", "--help")
    assert "byol-r18: cpu, tiny" in run_help and "parabola: paper, quick" in run_help
    assert "FLOAT" in run_help and "<str>" not in run_help.split("--kappa")[1].split("\n")[0]
    assert "FLOAT,FLOAT" in ok("sweep", "--help")
    rows = {line.split("│")[1].strip(): line for line in ok("list").splitlines() if line.startswith("│")}
    assert "yes" in rows["byol-r18"] and "cpu, tiny" in rows["byol-r18"]
    assert "yes" in rows["dino-vit"] and "cpu, tiny" in rows["dino-vit"]  # every experiment runs now


def test_runnable_tasks_are_the_task_dict():
    from emarule.tasks import RUNNABLE_TASKS, _tasks

    assert sorted(RUNNABLE_TASKS) == sorted(_tasks())


def test_every_experiment_has_a_tiny_preset():
    from emarule.config.load import experiment_names, load_spec

    for name in experiment_names():
        assert load_spec(name, preset="tiny")["preset"] == "tiny", name  # `--preset tiny` works everywhere


def test_num_workers_loads_the_same_batches_in_worker_processes(tmp_path):
    """--num-workers moves the loading into DataLoader workers; the batches, and so the rows, stay the same."""
    base = ["run", "byol-r18", "--preset", "tiny", "--out"]
    r0 = runner.invoke(app, [*base, str(tmp_path / "w0")])
    r2 = runner.invoke(app, [*base, str(tmp_path / "w2"), "--num-workers", "2"])
    assert r0.exit_code == 0 and r2.exit_code == 0, r0.output + r2.output
    hp = {d: json.loads((tmp_path / d / "hparams.json").read_text()) for d in ("w0", "w2")}
    assert (hp["w0"]["num_workers"], hp["w2"]["num_workers"]) == (0, 2)
    w0, w2 = (rows_without_wall_clock(tmp_path / d) for d in ("w0", "w2"))
    assert len(w2) > 2 and w0 == w2
