"""More of the bad-input corpus: values YAML's tags cannot read, models that cannot be built, schedule keys
that would silently lose to others, a single-value option given twice, paths too long to create, and
messages that name the real problem. Each case runs through `emarule.cli.main` (what the console script
calls) in a fresh working directory and ends with one line on stderr, exit code 2, and nothing written."""

import json
import os
from pathlib import Path

import pytest

from cli_util import refused_in_one_line, snapshot
from emarule.cli.main import main

TINY = ["byol-r18", "--preset", "tiny"]
LONG = "x/" + "a" * 300 + "/y"  # one name past NAME_MAX, under a parent that does not exist yet

CASES = [
    # explicit YAML tags PyYAML cannot construct: ValueError, KeyError, IndexError, AttributeError, not YAMLError
    ("set-float-tag", ["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=!!float abc"],
     "--set optimizer.lr: the value is not a valid float ('abc' under its !!float tag)"),
    ("set-int-tag", ["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=!!int abc"], "not a valid int"),
    ("set-int-tag-fraction", ["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=!!int 1.5"], "'1.5' under"),
    ("set-bool-tag", ["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=!!bool abc"], "not a valid bool"),
    ("set-float-tag-empty", ["plan", "byol-r18", "-k", "2", "--set", 'optimizer.lr=!!float ""'], "not a valid float"),
    ("set-timestamp-tag", ["plan", "byol-r18", "-k", "2", "--set", "title=!!timestamp abc"], "not a valid timestamp"),
    ("set-impossible-date", ["plan", "byol-r18", "-k", "2", "--set", "title=2023-13-45"], "quote the value"),
    ("spec-float-tag", ["plan", "--spec", "tagged.yaml", "-k", "2"],
     "tagged.yaml: not a valid float ('abc' under its !!float tag) at line 4"),
    ("run-spec-float-tag", ["run", "--spec", "tagged.yaml"], "not a valid float"),
    ("timm-float-tag", ["plan", "--timm-args", "tagged_args.yaml", "-k", "2"], "tagged_args.yaml: not a valid float"),
    ("timm-duplicate-key", ["plan", "--timm-args", "dup_args.yaml", "-k", "2"], "key 'opt' appears twice"),
    # a model that cannot be built is refused by plan, run and sweep alike, before a run directory exists
    ("run-dino-heads", ["run", "dino-vit", "--preset", "tiny", "--set", "model.heads=3"],
     "model.embed_dim 16 is not divisible by model.heads 3"),
    ("sweep-dino-heads", ["sweep", "dino-vit", "--preset", "tiny", "--set", "model.heads=3"], "model.heads 3"),
    ("plan-dino-heads", ["plan", "dino-vit", "--preset", "tiny", "-k", "2", "--set", "model.heads=3"],
     "pick heads dividing 16"),
    ("run-byol-vit-heads", ["run", "byol-vit", "--preset", "tiny", "--set", "model.heads=3"], "model.heads 3"),
    ("plan-byol-vit-arch-heads", ["plan", "byol-vit", "-k", "2", "--set", "model.heads=5"],
     "model.arch vit_base_patch16_224's width 768 is not divisible by model.heads 5"),
    ("run-ctc-heads", ["run", "ctc-polyak", "--preset", "tiny", "--set", "model.heads=3"],
     "model.dim 32 is not divisible by model.heads 3"),
    ("run-dino-patch", ["run", "dino-vit", "--preset", "tiny", "--set", "model.patch_size=5"],
     "data.image_size 8 is not divisible by model.patch_size 5"),
    ("run-dino-image-size", ["run", "dino-vit", "--preset", "tiny", "--set", "data.image_size=7"],
     "data.image_size 7 is not divisible by model.patch_size 4"),
    ("run-dino-local-size", ["run", "dino-vit", "--preset", "tiny", "--set", "data.local_size=6"],
     "data.local_size 6 is not divisible by model.patch_size 4"),
    ("sweep-dino-patch", ["sweep", "dino-vit", "--preset", "tiny", "--set", "model.patch_size=5"],
     "model.patch_size 5"),
    # a sweep's --metric is checked whole before anything trains
    ("sweep-ema-metric-not-logged", ["sweep", *TINY, "--jobs", "1", "--kappas", "2", "--metric", "ema_loss"],
     "no ema_<name>: its evaluations score the teacher alone"),
    ("sweep-ema-suffix-not-kept", ["sweep", "polyak-r50", "--preset", "tiny", "--metric", "ema_top1/0.5"],
     "--metric 'ema_top1/0.5'"),
    ("sweep-target-suffix", ["sweep", "polyak-r50", "--preset", "tiny", "--set", "ema.also=[0.5]", "--metric",
                             "top1/0.5"], "--metric 'top1/0.5'"),
    # a path too long to create: refused before any parent of it is made
    ("run-out-too-long", ["run", *TINY, "--out", LONG], "is longer than the file system's limit of"),
    ("sweep-out-too-long", ["sweep", *TINY, "--out", LONG], "pass a shorter path"),
    ("compare-out-too-long", ["compare", "k2", "--out", LONG + ".png"], "pass a shorter path"),
    ("reproduce-out-too-long", ["reproduce", "byol", "--out", LONG], "pass a shorter path"),
    ("run-path-too-long", ["run", *TINY, "--out", "/".join(["b" * 200] * 25)], "the path is longer than"),
    # --data for a family whose tasks read no data set
    ("reproduce-parabola-data", ["reproduce", "parabola", "--data", "/nonexistent/zzz"],
     "parabola reads no data set (its 'parabola' task makes its own); drop --data"),
    # schedule keys that would lose silently to others
    ("set-warmup-steps-with-epochs", ["plan", "byol-r18", "-k", "2", "--set", "schedule.warmup_steps=1000"],
     "schedule.warmup_steps and schedule.warmup_epochs are both set"),
    ("set-total-steps-with-epochs", ["plan", "byol-r18", "-k", "2", "--set", "schedule.total_steps=3"],
     "schedule.total_steps and schedule.epochs are both set"),
    ("run-total-steps-with-epochs", ["run", *TINY, "--set", "schedule.total_steps=3"], "give one"),
    ("set-milestones-on-cosine", ["plan", "byol-r18", "-k", "2", "--set", "schedule.milestones_epochs=[30,10]"],
     "is read only by schedule.kind multistep (this spec's is cosine)"),
    ("set-milestones-unsorted", ["plan", "polyak-r50", "-k", "2", "--set", "schedule.milestones_epochs=[30,10]"],
     "the epochs must increase"),
    ("set-presets", ["plan", "byol-r18", "-k", "2", "--set", "presets={tiny: {batch.size: 2}}"],
     "--set presets: presets are applied from the spec file before any --set"),
    ("set-presets-not-a-mapping", ["plan", "byol-r18", "-k", "2", "--set", "presets={tiny: 5}"], "--set presets"),
    ("set-a-preset-key", ["run", *TINY, "--set", "presets.tiny.batch.size=2"], "--set presets.tiny.batch.size"),
    # a single-value option given twice, in any spelling
    ("plan-kappa-twice", ["plan", "byol-vit", "-k", "2", "-k", "3"], "--kappa (or -k) is given more than once"),
    ("plan-kappa-twice-spelled-apart", ["plan", "byol-vit", "--kappa=2", "-k3"], "--kappa (or -k) is given more"),
    ("plan-preset-twice", ["plan", "byol-r18", "-k", "2", "--preset", "cpu", "--preset", "tiny"], "--preset is given"),
    ("plan-ema-rule-twice", ["plan", "byol-r18", "-k", "2", "--ema-rule", "linear", "--ema-rule", "exponential"],
     "--ema-rule is given more than once"),
    ("run-seed-twice", ["run", *TINY, "--seed", "1", "--seed=2"], "--seed is given more than once"),
    ("compare-metric-twice", ["compare", "k2", "--metric", "loss", "-m", "probe_top1"], "--metric (or -m)"),
    ("reproduce-jobs-twice", ["reproduce", "byol", "--jobs", "1", "--jobs", "2"], "--jobs is given more than once"),
    # a missing argument's choices on one line
    ("table-without-kind", ["table"], "Missing argument 'kind'. Choose from: momenta, lr"),
    # messages that name the problem there is
    ("spec-is-a-directory", ["plan", "--spec", "adir", "-k", "2"], "--spec adir is a directory"),
    ("spec-unknown-task-with-model", ["plan", "--spec", "nope.yaml", "-k", "2"],
     "nope.yaml: task 'nope' is not a known task (known: byol"),
    ("run-spec-unknown-task", ["run", "--spec", "nope-bare.yaml"], "nope-bare.yaml: task 'nope' is not a known task"),
    ("plan-spec-unknown-task", ["plan", "--spec", "nope-bare.yaml", "-k", "2"], "task 'nope' is not a known task"),
    # files are read only when they are regular files: a FIFO would block the read forever
    ("spec-fifo", ["plan", "--spec", "pipe", "-k", "2"], "--spec pipe is a FIFO (named pipe), not a regular file"),
    ("run-spec-fifo", ["run", "--spec", "pipe"], "--spec pipe is a FIFO"),
    ("timm-args-fifo", ["plan", "--timm-args", "pipe", "-k", "2"], "--timm-args pipe is a FIFO"),
    # timm args in the ranges timm's optimizers accept
    ("timm-negative-lr", ["plan", "--timm-args", "neg_lr.yaml", "-k", "2"], "neg_lr.yaml: lr must be > 0, got -0.1"),
    ("timm-negative-eps", ["plan", "--timm-args", "neg_eps.yaml", "-k", "2"], "opt_eps must be > 0"),
    ("timm-negative-wd", ["plan", "--timm-args", "neg_wd.yaml", "-k", "2"], "weight_decay must be ≥ 0"),
    ("timm-one-beta", ["plan", "--timm-args", "one_beta.yaml", "-k", "2"], "opt_betas must be a list of two numbers"),
    ("timm-beta-one", ["plan", "--timm-args", "beta_one.yaml", "-k", "2"], "in [0, 1) (β1 β2) or null, got [0.9, 1.0]"),
    ("compare-tiny-without-baseline", ["compare", "k2"],
     "`emarule run byol-r18 --preset tiny --kappa 1 --out tiny-k1-rule-s0`"),
    ("plan-lamb-without-betas", ["plan", "byol-r18", "-k", "2", "--set", "optimizer.name=lamb"],
     "optimizer lamb needs optimizer.betas, optimizer.eps, which its update reads (its scaling rules leave them "
     "unchanged)"),
    ("timm-out-unwritable", ["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--format", "timm",
                             "--out", "/proc/x.yaml"], "--out /proc/x.yaml: cannot write in /proc"),
    # a file --out that names a directory; values past float64's range; a run's directory as a sweep's root
    ("timm-out-trailing-slash", ["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--format", "timm",
                                 "--out", "d/"], "--out d/ is a directory's path (it ends in '/')"),
    ("table-lr-infinite", ["table", "lr", "--lr", "1e300", "--batch-sizes", "1e15"], "scales to inf at batch size"),
    ("table-batch-past-2-53", ["table", "lr", "--lr", "1e300", "--batch-sizes", "1e300"], "past 2^53"),
    ("limits-batch-infinite", ["limits", "--momentum", "0.996", "--batch-size", "1e308"],
     "gives a batch size past float64's range"),
    ("sweep-out-is-a-run", ["sweep", *TINY, "--out", "k2"], "--out k2 is a run's directory (it holds hparams.json)"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    base = "name: mine\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\nema: {momentum: 0.99}\n"
    (tmp_path / "tagged.yaml").write_text(base.replace("lr: 0.1", "lr: !!float abc"))
    (tmp_path / "nope.yaml").write_text(base.replace("task: byol", "task: nope") + "model: {arch: resnet18}\n")
    (tmp_path / "nope-bare.yaml").write_text(base.replace("task: byol", "task: nope"))
    (tmp_path / "args.yaml").write_text("batch_size: 128\nopt: sgd\nmodel_ema: true\nmodel_ema_decay: 0.999\n")
    (tmp_path / "tagged_args.yaml").write_text("batch_size: 128\nopt: sgd\nlr: !!float abc\n")
    (tmp_path / "dup_args.yaml").write_text("batch_size: 128\nopt: sgd\nopt: adam\n")
    adamw = "batch_size: 128\nopt: adamw\n"
    for name, line in (("neg_lr", "lr: -0.1"), ("neg_eps", "opt_eps: -1.0e-08"), ("neg_wd", "weight_decay: -0.05"),
                       ("one_beta", "opt_betas: [0.9]"), ("beta_one", "opt_betas: [0.9, 1.0]")):
        (tmp_path / f"{name}.yaml").write_text(adamw + line + "\n")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "adir").mkdir()
    run = tmp_path / "k2"  # a tiny-preset run at κ=2 without its baseline
    run.mkdir()
    (run / "hparams.json").write_text(json.dumps({"experiment": "byol-r18", "kappa": 2, "ema_rule": True,
                                                  "ema_rule_form": "exponential", "seed": 0, "preset": "tiny",
                                                  "dataset_size": 10}))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "epoch": 1, "samples_seen": 10,
                                                   "probe_top1": 1.0}) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(workdir, capsys, argv, needle):
    before = snapshot(workdir)
    refused_in_one_line(argv, capsys, needle)
    assert snapshot(workdir) == before


def test_the_messages_name_no_temporary_file_and_no_rule_that_is_not_applied(workdir, capsys):
    for argv in (["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--format", "timm", "--out",
                  "/proc/x.yaml"], ["plan", "byol-r18", "-k", "2", "--set", "optimizer.name=lamb"]):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert ".x.yaml." not in err and "which its scaling rules scale" not in err, err


def _ok(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    return out


def test_what_is_not_an_error(workdir, capsys):
    """Options meant to repeat still do; a schedule switched from epochs to steps by nulling the other key plans;
    every preset of every experiment still loads (tests/config covers that)."""
    for argv in (["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=0.2", "--set", "ema.momentum=0.9"],
                 ["table", "momenta", "--momentum", "0.9", "--momentum", "0.99"],
                 ["table", "lr", "--lr", "0.1", "--lr", "0.2"],
                 ["plan", "byol-r18", "-k", "2", "--set", "schedule.warmup_epochs=null", "--set",
                  "schedule.warmup_steps=100"],
                 ["plan", "byol-r18", "-k", "2", "--set", "optimizer.lr=!!float 0.5"],
                 ["plan", "polyak-r50", "-k", "2", "--set", "schedule.milestones_epochs=[10, 30]"],
                 ["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--format", "timm", "--out", "new.yaml"]):
        _ok(argv, capsys)
    assert (workdir / "new.yaml").is_file()


def test_timm_args_takes_the_ema_rule_it_is_given(workdir, capsys):
    """--ema-rule linear scales model_ema_decay by 1 − κ(1 − ρ), as `plan` scales ema.momentum; the title says so."""
    linear = _ok(["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--ema-rule", "linear"], capsys)
    assert "(linear EMA rule)" in linear and "0.996 " in linear and "0.996006" not in linear
    exponential = _ok(["plan", "--timm-args", "args.yaml", "--batch-size", "512"], capsys)
    assert "(EMA rule ρ^κ)" in exponential and "0.996006" in exponential
    written = _ok(["plan", "--timm-args", "args.yaml", "--batch-size", "512", "--ema-rule", "linear",
                   "--format", "timm"], capsys)
    assert "model_ema_decay: 0.996\n" in written


def test_the_suggested_baseline_is_the_matching_one(tmp_path):
    """compare's fix for a missing baseline is the command that makes it: spec, preset, --set, seed, data, beside it."""
    from emarule.request.suggest import baseline_command
    from emarule.config.load import load_spec

    spec = load_spec("byol-r18", preset="tiny", overrides=["ema.also=[0.5]"])
    cmd = baseline_command({"experiment": "byol-r18", "spec": spec, "preset": "tiny", "seed": 3,
                            "data": "/data/x"}, tmp_path / "tiny-k2-rule-s3")
    assert cmd == (f"emarule run byol-r18 --preset tiny --set 'ema.also=[0.5]' --kappa 1 --seed 3 --data /data/x "
                   f"--out {tmp_path / 'tiny-k1-rule-s3'}")
    own = tmp_path / "mine.yaml"
    own.write_text("name: mine\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\n"
                   "ema: {momentum: 0.99}\n")
    cmd = baseline_command({"spec": load_spec(path=own), "seed": 0}, Path("r") / "k2-rule-s0")
    assert cmd == f"emarule run --spec {own} --kappa 1 --out {Path('r') / 'k1-rule-s0'}"


@pytest.mark.skipif(os.pathconf("/", "PC_NAME_MAX") < 255, reason="a file system with short names")
def test_a_long_name_that_fits_is_not_refused(workdir, capsys):
    from emarule.request import checks

    assert checks.out_dir("x/" + "a" * 255) is not None and not (workdir / "x").exists()
