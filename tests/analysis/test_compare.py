"""`emarule compare` on synthetic run directories: gap numbers checked by hand, errors, figure, no torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emarule.analysis import compare as C
from emarule.cli.main import app
from emarule.errors import UserError

runner = CliRunner()


def make_run(root: Path, name: str, kappa: float, rule, points, metric="probe_top1", seed=0, experiment="byol-r18",
             size=100, extra_rows=(), engine_style=True):
    """A run directory as `emarule run` writes it; `points` is [(epoch, value)]."""
    d = root / name
    d.mkdir(parents=True)
    if engine_style:  # what emarule.engine.loop writes: a bool plus the form, hyperparameters at the top
        h = {"experiment": experiment, "kappa": kappa, "ema_rule": rule is not None, "ema_rule_form": rule,
             "seed": seed, "progressive": None, "dataset_size": size,
             "hyperparameters": {"batch_size": {"base": 64, "scaled": 64 * kappa},
                                 "ema.momentum": {"base": 0.97, "scaled": 0.97 ** (kappa if rule else 1)}}}
    else:  # the rule as a string or null
        h = {"experiment": experiment, "kappa": kappa, "ema_rule": rule, "seed": seed, "dataset_size": size}
    (d / "hparams.json").write_text(json.dumps(h))
    rows = [{"kind": "eval", "samples_seen": int(round(e * size)), "epoch": e, metric: v} for e, v in points]
    rows += list(extra_rows)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def line(ts, f):
    return [(t, f(t)) for t in ts]


T = [float(t) for t in range(11)]  # epochs 0..10


def test_constant_offset_gap_is_exact(tmp_path):
    b = make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t))
    r = make_run(tmp_path, "k4-rule-s0", 4, "exponential", line(T, lambda t: t + 0.5))
    res = C.compare([b, r], "probe_top1")
    row = next(x for x in res["runs"] if x["name"] == "k4-rule-s0")
    assert row["gap_max"] == pytest.approx(0.5) and row["gap_mean"] == pytest.approx(0.5)
    assert row["gap_final"] == pytest.approx(0.5) and row["points"] == 11
    assert row["ema_rule"] is True and row["rule"] == "with" and row["batch_size"] == 256
    base = next(x for x in res["runs"] if x["baseline"])
    assert base["gap_max"] == 0 and base["gap_mean"] == 0


def test_interpolation_onto_the_baseline_grid_within_the_overlap(tmp_path):
    # Baseline y = t on 0..10; the run y = 2t is logged at 0.5, 1.5, ..., 9.5 only.
    b = make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t))
    r = make_run(tmp_path, "k2-norule-s0", 2, None, line([t + 0.5 for t in range(10)], lambda t: 2 * t))
    row = next(x for x in C.compare([b, r])["runs"] if x["name"] == "k2-norule-s0")
    # Baseline grid points inside [0.5, 9.5] are 1..9, where |2t - t| = t: max 9, mean 5.
    assert row["points"] == 9 and row["from_epoch"] == 1 and row["to_epoch"] == 9
    assert row["gap_max"] == pytest.approx(9.0) and row["gap_mean"] == pytest.approx(5.0)
    assert row["gap_final"] == pytest.approx(9.0) and row["rule"] == "without" and row["ema_rule"] is False


def test_nonlinear_run_interpolated_by_hand(tmp_path):
    # Run logged at 0, 4, 10 with values 0, 8, 8: on the grid 0..10 it is 2t up to 4, then 8.
    b = make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: 0.0))
    r = make_run(tmp_path, "k8-rule-s0", 8, "exponential", [(0.0, 0.0), (4.0, 8.0), (10.0, 8.0)])
    row = next(x for x in C.compare([b, r])["runs"] if x["name"] == "k8-rule-s0")
    expected = [2 * t if t <= 4 else 8 for t in T]
    assert row["gap_max"] == pytest.approx(8.0)
    assert row["gap_mean"] == pytest.approx(sum(expected) / len(expected))


def test_several_baseline_seeds_are_averaged_and_grouped(tmp_path):
    b0 = make_run(tmp_path, "k1-rule-s0", 1, "exponential", line(T, lambda t: t), seed=0)
    b1 = make_run(tmp_path, "k1-rule-s1", 1, "exponential", line(T, lambda t: t + 1.0), seed=1)
    r0 = make_run(tmp_path, "k4-rule-s0", 4, "exponential", line(T, lambda t: t + 0.5), seed=0)
    r1 = make_run(tmp_path, "k4-rule-s1", 4, "exponential", line(T, lambda t: t + 0.5), seed=1)
    res = C.compare([b0, b1, r0, r1])
    # The baseline mean is t + 0.5, so both scaled runs sit exactly on it; each seed is 0.5 away.
    rows = {x["name"]: x for x in res["runs"]}
    assert rows["k4-rule-s0"]["gap_max"] == pytest.approx(0.0)
    assert rows["k1-rule-s1"]["gap_mean"] == pytest.approx(0.5)
    groups = {g["label"]: g for g in res["groups"]}
    assert groups["κ=1 baseline"]["runs"] == 2 and groups["with EMA rule"]["runs"] == 2
    _, mean, std = res["_baseline_curve"]
    assert mean[0] == pytest.approx(0.5) and std[0] == pytest.approx(0.5)


def test_rule_as_string_or_null_and_folder_expansion(tmp_path):
    make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t), engine_style=False)
    make_run(tmp_path, "k2-lin", 2, "linear", line(T, lambda t: t), engine_style=False)
    make_run(tmp_path, "k2-no", 2, None, line(T, lambda t: t - 1), engine_style=False)
    (tmp_path / "not-a-run").mkdir()
    res = C.compare([tmp_path])
    rows = {x["name"]: x for x in res["runs"]}
    assert set(rows) == {"k1", "k2-lin", "k2-no"}
    assert rows["k2-lin"]["rule"] == "linear" and rows["k2-no"]["rule"] == "without"
    assert rows["k2-no"]["gap_mean"] == pytest.approx(1.0)


def test_metric_defaults_and_x_from_samples_seen(tmp_path):
    # No epoch key: the time axis is samples_seen / dataset_size.
    b = tmp_path / "b"
    b.mkdir()
    (b / "hparams.json").write_text(json.dumps({"experiment": "x", "kappa": 1, "ema_rule": None, "dataset_size": 10}))
    (b / "metrics.jsonl").write_text("".join(json.dumps({"samples_seen": s, "loss": s / 10}) + "\n" for s in (10, 20)))
    r = tmp_path / "r"
    r.mkdir()
    (r / "hparams.json").write_text(json.dumps({"experiment": "x", "kappa": 2, "ema_rule": None, "dataset_size": 10}))
    rows = "".join(json.dumps({"samples_seen": s, "loss": s / 10 + 1}) + "\n" for s in (10, 20))
    (r / "metrics.jsonl").write_text(rows)
    res = C.compare([b, r])
    assert res["metric"] == "loss"  # no probe_top1 logged: the loss
    row = next(x for x in res["runs"] if x["name"] == "r")
    assert row["gap_mean"] == pytest.approx(1.0) and row["from_epoch"] == 1 and row["to_epoch"] == 2


@pytest.mark.parametrize("case,needle", [
    ("missing", "run directory not found"),
    ("no_baseline", "no κ=1 baseline"),
    ("unknown_metric", "available: loss, probe_top1"),
    ("not_a_run", "no hparams.json"),
    ("two_experiments", "different experiments"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, case, needle):
    extra = [{"kind": "train", "samples_seen": 0, "epoch": 0.0, "loss": 1.0}]
    b = make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t), extra_rows=extra)
    r = make_run(tmp_path, "k4", 4, "exponential", line(T, lambda t: t), extra_rows=extra)
    args = {"missing": [str(b), str(tmp_path / "nope")],
            "no_baseline": [str(r)],
            "unknown_metric": [str(b), str(r), "--metric", "acc"],
            "not_a_run": [str(b), str(tmp_path)],
            "two_experiments": [str(b), str(make_run(tmp_path, "other", 2, None, line(T, lambda t: t),
                                                     experiment="byol-vit"))]}[case]
    if case == "not_a_run":
        (tmp_path / "empty").mkdir()
        args = [str(b), str(tmp_path / "empty")]
    res = runner.invoke(app, ["compare", *args, "--out", str(tmp_path / "f.png")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output


@pytest.mark.parametrize("tail,needle", [
    ('{"kind": "eval", "epoch": 10.5, "probe_', "line 12 is cut short"),  # killed mid-write
    ('{torn line\n', "line 12 is not a JSON object"),
    ('[1, 2]\n', "line 12 is not a JSON object"),
])
def test_damaged_metrics_name_the_file_and_line(tmp_path, tail, needle):
    b = make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t))
    r = make_run(tmp_path, "k4", 4, "exponential", line(T, lambda t: t))
    with open(r / "metrics.jsonl", "a") as f:
        f.write(tail)
    res = runner.invoke(app, ["compare", str(b), str(r), "--out", str(tmp_path / "f.png")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and f"{r / 'metrics.jsonl'}, {needle}" in lines[0], res.output
    assert not (tmp_path / "f.png").exists()


def test_a_run_without_the_metric_is_an_error_not_a_dash(tmp_path):
    b = make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t))
    r = make_run(tmp_path, "k4", 4, "exponential", line(T, lambda t: t), metric="loss")
    with pytest.raises(UserError, match=r"'probe_top1' is not in .*k4/metrics.jsonl \(11 rows\); available: loss"):
        C.compare([b, r])


def test_cli_table_json_and_atomic_png(tmp_path):
    b = make_run(tmp_path / "runs", "k1-rule-s0", 1, "exponential", line(T, lambda t: t))
    make_run(tmp_path / "runs", "k4-rule-s0", 4, "exponential", line(T, lambda t: t + 0.5))
    make_run(tmp_path / "runs", "k4-norule-s0", 4, None, line(T, lambda t: t - 2.0))
    out = tmp_path / "fig" / "cmp.png"
    res = runner.invoke(app, ["compare", str(tmp_path / "runs"), "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    gaps = {r["name"]: (r["gap_max"], r["gap_mean"]) for r in d["runs"]}
    assert gaps["k4-rule-s0"] == pytest.approx((0.5, 0.5)) and gaps["k4-norule-s0"] == pytest.approx((2.0, 2.0))
    assert d["figure"] == str(out) and d["baseline"]["runs"] == [str(b)]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["cmp.png"]  # no temporary left behind
    res = runner.invoke(app, ["compare", str(tmp_path / "runs")])
    assert res.exit_code == 0 and "k4-norule-s0" in res.output and "-2" in res.output
    assert (tmp_path / "runs" / "compare-probe_top1.png").exists()


def test_compare_never_imports_torch(tmp_path):
    make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t))
    make_run(tmp_path, "k2", 2, None, line(T, lambda t: t + 1))
    code = ("import sys; sys.modules['torch'] = None\n"
            "from emarule.cli.main import main\n"
            f"main(['compare', {str(tmp_path)!r}, '--format', 'json', '--out', {str(tmp_path / 'x.png')!r}])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"][1]["gap_mean"] == pytest.approx(1.0)


def test_gap_helper_without_overlap():
    assert C.gap(([5.0, 6.0], [1.0, 1.0]), ([0.0, 1.0], [0.0, 0.0]))["gap_max"] is None
    with pytest.raises(UserError):
        C.load_runs([])


def test_the_same_run_twice_is_compared_once(tmp_path):
    """`compare k1 k1 k4` (or a folder and a run inside it): each run once, no error."""
    b = make_run(tmp_path / "runs", "k1", 1, "exponential", line(T, lambda t: t))
    r = make_run(tmp_path / "runs", "k4", 4, "exponential", line(T, lambda t: t + 0.5))
    res = C.compare([b, b, r, tmp_path / "runs"])
    assert [x["name"] for x in res["runs"]] == ["k1", "k4"] and res["baseline"]["runs"] == [str(b)]
    out = runner.invoke(app, ["compare", str(b), str(b), "--out", str(tmp_path / "f.png"), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert [x["name"] for x in json.loads(out.output)["runs"]] == ["k1"]


def test_a_sweep_root_names_its_experiment_folders(tmp_path):
    make_run(tmp_path / "runs" / "byol-r18", "k1", 1, "exponential", line(T, lambda t: t))
    make_run(tmp_path / "runs" / "dino-vit", "k1", 1, "exponential", line(T, lambda t: t), experiment="dino-vit")
    (tmp_path / "runs" / "empty").mkdir()
    root = tmp_path / "runs"
    with pytest.raises(UserError, match=f"{root} holds experiment folders, not runs; pass one of "
                                        f"{root / 'byol-r18'}, {root / 'dino-vit'}$"):
        C.compare([root])
    assert C.compare([root / "byol-r18"])["experiment"] == "byol-r18"


@pytest.mark.parametrize("name", ["c.pdf", "fig.txt", "fig", "c.svg"])
def test_the_figure_must_be_a_png(tmp_path, name):
    b = make_run(tmp_path, "k1", 1, "exponential", line(T, lambda t: t))
    res = runner.invoke(app, ["compare", str(b), "--out", str(tmp_path / name)])
    assert res.exit_code == 2 and "the figure is written as PNG; give a path ending in .png" in res.output
    assert not (tmp_path / name).exists()
    res = runner.invoke(app, ["compare", str(b), "--out", str(tmp_path / "upper.PNG")])
    assert res.exit_code == 0 and (tmp_path / "upper.PNG").read_bytes()[:4] == b"\x89PNG"


def test_a_metric_with_a_slash_names_one_figure_file_not_folders(tmp_path):
    from emarule.analysis.compare import default_figure, figure_name

    assert figure_name("ema_wer/0.9999/test-clean") == "compare-ema_wer_0.9999_test-clean.png"
    fig = default_figure({"metric": "ema_wer/0.999", "runs": [{"run": str(tmp_path / "a" / "k1")},
                                                             {"run": str(tmp_path / "a" / "k2")}]})
    assert fig == (tmp_path / "a" / "compare-ema_wer_0.999.png").resolve()


def test_baselines_of_one_seed_twice_or_of_other_settings_are_not_pooled(tmp_path):
    a = make_run(tmp_path, "k1-a", 1, "exponential", line(T, lambda t: t), seed=0)
    b = make_run(tmp_path, "k1-b", 1, "exponential", line(T, lambda t: t + 1), seed=0)
    r = make_run(tmp_path, "k4", 4, "exponential", line(T, lambda t: t), seed=0)
    with pytest.raises(UserError, match="two κ=1 baselines of seed 0"):
        C.load_runs([a, b, r])
    c = make_run(tmp_path, "k1-c", 1, "exponential", line(T, lambda t: t), seed=1)
    for run, epochs in ((a, 2), (c, 30)):
        h = json.loads((run / "hparams.json").read_text())
        h["spec"] = {"name": "byol-r18", "title": f"t{epochs}", "schedule": {"epochs": epochs}}
        (run / "hparams.json").write_text(json.dumps(h))
    with pytest.raises(UserError, match="κ=1 baselines made with other settings"):
        C.load_runs([a, c, r])
    h = json.loads((c / "hparams.json").read_text())
    h["spec"]["schedule"]["epochs"] = 2  # a title alone computes nothing
    (c / "hparams.json").write_text(json.dumps(h))
    assert len(C.load_runs([a, c, r])) == 3
