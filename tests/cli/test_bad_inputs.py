"""The bad-input corpus: every case ends with one line on stderr, exit code 2, no traceback, and
nothing created. Each runs through `emarule.cli.main` (what the console script calls) in a fresh
working directory that holds a few fixtures; the tree is compared before and after."""

import json
import os
from pathlib import Path

import pytest

from cli_util import refused_in_one_line
from emarule.cli.main import main

TINY = ["byol-r18", "--preset", "tiny"]
UNWRITABLE = "/proc/emarule-test"  # not writable even for root

CASES = [
    # --out: a file, under a file, a place that cannot be written, empty (run, sweep, compare)
    ("run-out-file", ["run", *TINY, "--out", "afile"], "--out afile is a file"),
    ("run-out-under-file", ["run", *TINY, "--out", "afile/run"], "is a file, so nothing can be created"),
    ("run-out-unwritable", ["run", *TINY, "--out", UNWRITABLE], "cannot write in /proc"),
    ("run-out-empty", ["run", *TINY, "--out", ""], "--out is empty"),
    ("sweep-out-file", ["sweep", *TINY, "--out", "afile"], "--out afile is a file"),
    ("sweep-out-under-file", ["sweep", *TINY, "--out", "afile/runs"], "is a file, so nothing can be created"),
    ("sweep-out-unwritable", ["sweep", *TINY, "--out", UNWRITABLE], "cannot write in /proc"),
    ("sweep-run-dir-is-a-file", ["sweep", *TINY, "--out", "root", "--kappas", "2"], "tiny-k2-rule-s0 is a file"),
    ("compare-out-under-file", ["compare", "k1", "k4", "--out", "afile/fig.png"], "is a file, so nothing can be"),
    ("compare-out-dir", ["compare", "k1", "k4", "--out", "adir"], "--out adir is a directory"),
    ("compare-out-unwritable", ["compare", "k1", "k4", "--out", UNWRITABLE + "/fig.png"], "cannot write in /proc"),
    ("compare-out-empty", ["compare", "k1", "k4", "--out", ""], "--out is empty"),
    # --out: a broken symbolic link is named as one, not as "a file"
    ("run-out-dangling-link", ["run", *TINY, "--out", "dangling"], "--out dangling is a broken symbolic link"),
    ("run-out-under-dangling-link", ["run", *TINY, "--out", "dangling/run"], "dangling is a broken symbolic link"),
    # compare's figure is a PNG: another suffix would hold PNG bytes under a wrong name
    ("compare-out-pdf", ["compare", "k1", "k4", "--out", "c.pdf"], "--out c.pdf: the figure is written as PNG"),
    ("compare-out-txt", ["compare", "k1", "k4", "--out", "fig.txt"], "give a path ending in .png, e.g. --out fig.png"),
    # --out of run, sweep and reproduce: a folder of the user's own files is never written into
    ("run-out-users-folder", ["run", *TINY, "--out", "mine"], "--out mine holds files emarule did not write "
                                                               "(compare-probe_top1.png, figures, k1 and 2 more)"),
    ("sweep-out-users-folder", ["sweep", *TINY, "--out", "mine"], "--out mine holds files emarule did not write"),
    ("reproduce-out-users-folder", ["reproduce", "polyak", "--out", "mine"], "holds a report.md that emarule did not"),
    ("reproduce-out-users-files", ["reproduce", "polyak", "--out", "mine/figures"], "holds files emarule did not"),
    # compare replaces only a figure emarule wrote: at --out, or at the default path beside the runs
    ("compare-out-users-png", ["compare", "k1", "k4", "--out", "mine/compare-probe_top1.png"],
     "--out mine/compare-probe_top1.png is a file emarule did not write"),
    ("compare-default-users-png", ["compare", "mine/k1", "mine/k4"],
     "compare-probe_top1.png is a file emarule did not"),
    # a sweep's root holds <experiment>/<run>: the error names the folder that works
    ("compare-sweep-root", ["compare", "runs"], "runs holds experiment folders, not runs; pass runs/byol-r18"),
    # --resume needs a run; a new run needs a directory without one
    ("resume-missing-out", ["run", *TINY, "--resume", "--out", "gone"], "--resume: gone does not exist"),
    ("resume-missing-default", ["run", *TINY, "--resume"], "tiny-k1-rule-s0 does not exist"),
    ("resume-no-checkpoint", ["run", *TINY, "--resume", "--out", "adir"], "--resume: no checkpoint in adir"),
    ("new-run-over-a-run", ["run", *TINY, "--out", "done"], "already holds a run"),
    # a run whose checkpoint was deleted: its hparams.json and metrics.jsonl are still a run's record
    ("new-run-over-a-run-record", ["run", *TINY, "--out", "k1"],
     "k1 already holds a run (hparams.json and metrics.jsonl, no checkpoint"),
    ("new-run-over-metrics-only", ["run", *TINY, "--out", "logonly"], "logonly already holds a run (metrics.jsonl"),
    ("resume-run-record-no-checkpoint", ["run", *TINY, "--resume", "--out", "k1"],
     "no checkpoint in k1 (it holds hparams.json and metrics.jsonl"),
    # an experiment name and --spec
    ("plan-name-and-spec", ["plan", "byol-r18", "--spec", "mine.yaml", "--kappa", "2"], "not both"),
    ("run-name-and-spec", ["run", "byol-r18", "--spec", "mine.yaml"], "not both"),
    # --no-ema-rule with --ema-rule
    ("plan-rule-conflict", ["plan", "byol-r18", "--kappa", "2", "--no-ema-rule", "--ema-rule", "linear"],
     "contradict"),
    ("run-rule-conflict", ["run", *TINY, "--no-ema-rule", "--ema-rule", "exponential"], "contradict"),
    ("sweep-no-rule-flag", ["sweep", *TINY, "--no-ema-rule"], "No such option"),
    # --data where there is nothing to point it at
    ("run-data-bundled", ["run", *TINY, "--data", "adir"], "uses bundled data (data.source: digits)"),
    ("sweep-data-bundled", ["sweep", "byol-r18", "--preset", "cpu", "--data", "adir"], "drop --preset cpu"),
    # a batch unit the task does not batch by (ctc counts seconds of audio, byol samples)
    ("run-unit-ctc-samples", ["run", "ctc-polyak", "--preset", "tiny", "--set", "batch.unit=samples"],
     "batch.unit samples is not a unit the ctc task batches by (seconds)"),
    ("sweep-unit-byol-seconds", ["sweep", *TINY, "--set", "batch.unit=seconds"],
     "batch.unit seconds is not a unit the byol task batches by (samples)"),
    ("run-data-synthetic", ["run", *TINY, "--set", "data.source=synthetic", "--data", "adir"], "synthetic"),
    ("run-data-generated", ["run", "parabola", "--data", "adir"],
     "parabola sweeps κ and ρ itself, a study with no batches or data to set: drop --data"),
    # Progressive Scaling epochs
    ("plan-step-negative", ["plan", "byol-r18", "--kappa", "2", "--progressive", "step:-1"], "epoch must be"),
    ("plan-step-nan", ["plan", "byol-r18", "--kappa", "2", "--progressive", "step:nan"], "epoch must be"),
    ("run-incremental-negative", ["run", *TINY, "--kappa", "2", "--progressive", "incremental:-1,32,1"],
     "start_epoch must be"),
    ("plan-incremental-zero-period", ["plan", "byol-r18", "--kappa", "2", "--progressive", "incremental:0,64,0"],
     "every_epochs must be a finite number > 0"),
    ("plan-spec-negative-epoch", ["plan", "byol-r18", "--kappa", "2", "--set", "progressive={kind: step, epoch: -3}"],
     "progressive.epoch: must be ≥ 0"),
    ("plan-incremental-short-of-kappa", ["plan", "byol-vit", "--kappa", "6", "--progressive",
                                        "incremental:60,3072,60,0.75", "--set", "schedule.epochs=300"],
     "reaches κB = 24576 only at epoch 420, not before the end of training (300 epochs)"),
    ("plan-smooth-from-kappa", ["plan", "dino-vit", "--kappa", "2", "--set", "progressive.from_kappa=1.5"],
     "progressive smooth: from_kappa applies to step and incremental only"),
    ("plan-batch-multiple-zero", ["plan", "dino-vit", "--kappa", "2", "--set", "progressive.batch_multiple=0"],
     "progressive.batch_multiple"),
    ("run-base-step-after-the-end", ["run", *TINY, "--kappa", "2", "--set",
                                     "progressive={kind: step, base_step: 100000}"],
     "base_step 100000 is not before the end of training"),
    # a fractional batch in samples
    ("plan-fractional-batch", ["plan", "byol-r18", "--batch-size", "100.5"], "give a whole number"),
    ("run-fractional-batch", ["run", *TINY, "--batch-size", "100.5"], "give a whole number"),
    ("run-fractional-kappa-batch", ["run", *TINY, "--kappa", "2.3"], "κ=2.3 gives a batch of 73.6 samples"),
    ("table-fractional-rows", ["table", "momenta", "--batch-sizes", "32.5,64"], "give whole numbers"),
    ("table-fractional-base", ["table", "momenta", "--momentum", "0.99", "--base-batch-size", "100.5"],
     "give whole numbers"),
    # a batch below one sample (κB = 3.2e-8 is not "the whole number 0")
    ("plan-batch-below-one-sample", ["plan", "byol-r18", "--kappa", "1e-9"], "κ=1e-09 gives a batch of 1.024e-06"),
    ("run-batch-below-one-sample", ["run", *TINY, "--kappa", "1e-9"], "samples (κ × 32), below one sample"),
    # empty lists
    ("table-empty-batch-sizes", ["table", "momenta", "--batch-sizes", ""], "--batch-sizes is empty"),
    ("table-comma-batch-sizes", ["table", "lr", "--batch-sizes", ","], "--batch-sizes is empty"),
    ("sweep-empty-kappas", ["sweep", *TINY, "--kappas", ""], "--kappas is empty"),
    ("sweep-empty-rule", ["sweep", *TINY, "--rule", ""], "--rule needs at least one"),
    # an empty item in a list is not dropped (the bad --rule makes the old code fail fast, not sweep)
    ("table-empty-item", ["table", "momenta", "--batch-sizes", "256,,1024"],
     "--batch-sizes '256,,1024': an empty item"),
    ("table-trailing-comma", ["table", "lr", "--batch-sizes", "256,1024,"], "an empty item"),
    ("sweep-empty-kappa-item", ["sweep", *TINY, "--kappas", "2,,4", "--rule", "with,sometimes"],
     "--kappas '2,,4': an empty item; give numbers separated by commas, e.g. 1,2,4"),
    ("reproduce-empty-kappa-item", ["reproduce", "byol", "--kappas", "2,,4", "--out", "afile"], "an empty item"),
    # an optimizer switched without the values its rules scale
    ("plan-sgd-to-adam", ["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.name=adam"],
     "optimizer adam needs optimizer.betas, optimizer.eps"),
    ("plan-to-rmsprop", ["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.name=rmsprop",
                         "--set", "optimizer.eps=1e-8"], "optimizer rmsprop needs optimizer.alpha"),
    ("run-sgd-to-adamw", ["run", *TINY, "--set", "optimizer.name=adamw"], "optimizer adamw needs"),
    ("spec-adam-without-betas", ["plan", "--spec", "adam.yaml", "--kappa", "2"], "adam.yaml: optimizer adam needs"),
    # a spec file that is not UTF-8 text
    ("plan-spec-not-utf8", ["plan", "--spec", "bin.yaml", "--kappa", "2"], "bin.yaml: not UTF-8 text"),
    ("run-spec-not-utf8", ["run", "--spec", "bin.yaml", "--kappa", "2"], "bin.yaml: not UTF-8 text"),
    # a sweep checks every κ, rule, seed and metric before its first run
    ("sweep-bad-kappa", ["sweep", *TINY, "--kappas", "1,x"], "--kappas must be a number"),
    ("sweep-zero-kappa", ["sweep", *TINY, "--kappas", "0,2"], "must be finite and > 0"),
    ("sweep-bad-rule", ["sweep", *TINY, "--rule", "with,sometimes"], "--rule 'sometimes'"),
    ("sweep-linear-out-of-range", ["sweep", *TINY, "--kappas", "2,40", "--rule", "linear"], "linear EMA rule"),
    ("sweep-zero-seeds", ["sweep", *TINY, "--seeds", "0"], "--seeds must be ≥ 1"),
    # --seeds is capped: range(N) of a huge N hung (the bad --rule / --out make the old code fail fast)
    ("sweep-huge-seeds", ["sweep", *TINY, "--seeds", "99999999999999999999", "--rule", "with,sometimes"],
     "--seeds 99999999999999999999: at most 100"),
    ("sweep-101-seeds", ["sweep", *TINY, "--seeds", "101", "--rule", "with,sometimes"], "--seeds 101: at most 100"),
    ("reproduce-huge-seeds", ["reproduce", "byol", "--seeds", "99999999999999999999", "--out", "afile"],
     "at most 100"),
    ("reproduce-zero-seeds", ["reproduce", "byol", "--seeds", "0", "--out", "afile"], "--seeds must be ≥ 1"),
    ("sweep-unknown-metric", ["sweep", *TINY, "--metric", "top5"], "--metric 'top5'"),
    ("sweep-fractional-batch", ["sweep", *TINY, "--kappas", "2,2.3"], "κ=2.3 gives a batch of 73.6 samples"),
    ("sweep-study", ["sweep", "parabola"], "sweeps κ itself"),
    # every experiment runs now (dino-vit was the last that could not): a data set left out is the error
    ("run-cifar-without-data", ["run", "dino-vit", "--kappa", "2"], "CIFAR-10 is read from a local directory"),
    # a spec of one's own has no `cpu` preset: the fix offered is one it has
    ("run-own-spec-without-data", ["run", "--spec", "mine.yaml"], "or add --set data.source=digits"),
    ("sweep-own-spec-without-data", ["sweep", "--spec", "mine.yaml", "--kappas", "2"], "--set data.source=digits"),
    # compare on a damaged metrics.jsonl names the file and the line
    ("compare-torn-metrics", ["compare", "k1", "torn"], "torn/metrics.jsonl, line 3 is cut short"),
    ("compare-corrupt-metrics", ["compare", "k1", "corrupt"], "corrupt/metrics.jsonl, line 2 is not a JSON object"),
    ("compare-missing-metric", ["compare", "k1", "nometric"], "'probe_top1' is not in nometric/metrics.jsonl"),
    # other options
    ("run-negative-seed", ["run", *TINY, "--seed", "-1"], "--seed"),
    # --seed: what every seeding path takes (torch.manual_seed overflowed past 2^64 − 1)
    ("run-huge-seed", ["run", *TINY, "--seed", "99999999999999999999"], "--seed must be a whole number from 0 to "
                                                                          "4294967295"),
    ("run-seed-past-the-bound", ["run", *TINY, "--seed", str(2**32)], "got 4294967296"),
    ("run-bad-wandb", ["run", *TINY, "--wandb", "maybe"], "--wandb must be off, offline or online"),
    ("run-zero-device-batch", ["run", *TINY, "--max-device-batch", "0"], "--max-device-batch must be ≥ 1"),
    ("run-negative-workers", ["run", *TINY, "--num-workers", "-1"], "--num-workers must be ≥ 0"),
    ("sweep-negative-workers", ["sweep", *TINY, "--num-workers", "-2"], "--num-workers must be ≥ 0"),
    ("table-optimizer-without-lr", ["table", "lr", "--optimizer", "adam"], "give --lr too"),
    # nothing resolved silently: a repeated --set key, a duplicate YAML key, a repeated sweep setting
    ("set-twice", ["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.lr=0.1", "--set", "optimizer.lr=0.2"],
     "--set optimizer.lr is given twice ('optimizer.lr=0.1', then 'optimizer.lr=0.2')"),
    ("run-set-section-and-key", ["run", *TINY, "--set", "ema={momentum: 0.9}", "--set", "ema.momentum=0.99"],
     "--set ema.momentum is given in two overlapping --set options"),
    ("spec-duplicate-section", ["plan", "--spec", "dup.yaml", "--kappa", "2"],
     "dup.yaml: key 'batch' appears twice in one mapping (first at line 3) at line 6"),
    ("spec-duplicate-key", ["run", "--spec", "dupkey.yaml"], "key 'lr' appears twice"),
    ("sweep-kappas-twice", ["sweep", *TINY, "--kappas", "2,2"], "--kappas 2,2: κ=2 is given twice"),
    ("sweep-kappas-twice-spelled-apart", ["sweep", *TINY, "--kappas", "1,2,2.0"], "κ=2 is given twice"),
    ("sweep-rule-twice", ["sweep", *TINY, "--rule", "with,with"], "'with' is given twice"),
    ("reproduce-kappas-twice", ["reproduce", "byol", "--kappas", "4,4"], "κ=4 is given twice"),
    # specs nested too deep, and YAML aliases that expand to huge (or endless) trees
    ("spec-nested-3000-deep", ["plan", "--spec", "deep.yaml", "--kappa", "2"], "deep.yaml: nested too deep to parse"),
    ("spec-nested-40-deep", ["run", "--spec", "deep40.yaml"], "nested more than 32 levels deep"),
    ("set-nested-3000-deep",
     ["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.betas=" + "[" * 3000 + "]" * 3000],
     "--set optimizer.betas: the value is nested too deep to parse"),
    ("spec-alias-bomb", ["plan", "--spec", "bomb.yaml", "--kappa", "2"], "expands to more than 100,000 values"),
    ("set-alias-bomb", ["plan", "byol-r18", "--kappa", "2", "--set", "title=" + "".join(
        f"{{a{i}: &a{i + 1} [{', '.join([f'*a{i}'] * 10)}], " for i in range(7)).replace("*a0", "x") + "z: 1"
        + "}" * 7], "expands to more than 100,000 values"),
    ("spec-recursive-alias", ["plan", "--spec", "loop.yaml", "--kappa", "2"], "an alias refers to the node that"),
    # presets of the wrong shape, and a name that would put the run directory outside runs/
    ("spec-preset-not-a-mapping", ["plan", "--spec", "preset5.yaml", "--kappa", "2", "--preset", "tiny"],
     "presets.tiny: expected a mapping of dotted keys to values, got int 5"),
    ("spec-preset-name-a-number", ["run", "--spec", "presetnum.yaml", "--preset", "5"], "5 is not a preset name"),
    ("set-name-escapes-runs", ["run", *TINY, "--set", "name=../../escaped"], "--set name: must be a plain name"),
    ("spec-name-absolute", ["run", "--spec", "absname.yaml"], "name: must be a plain name"),
    # the first thing to fix is named first; an empty schedule is not "the spec's own"
    ("plan-unknown-name-no-kappa", ["plan", "nosuch"], "unknown experiment 'nosuch'"),
    ("plan-progressive-empty", ["plan", "byol-vit", "--kappa", "2", "--progressive", ""], "--progressive '': cannot"),
    # a run refused after the plan warned (ρ^κ underflows): the refusal alone, the warning never said
    ("run-kappa-past-the-data", ["run", *TINY, "--kappa", "1e5"], "is larger than the training set (128 samples)"),
    # a sweep has no --batch-size to offer
    ("sweep-kappa-below-one-sample", ["sweep", *TINY, "--kappas", "0.001"], "choose κ ≥ 0.03125 (κB ≥ 1)"),
    # what every plan reads cannot be removed; a mapping does not drop a section's keys; the task is the spec's
    ("plan-set-batch-null", ["plan", "byol-r18", "-k", "2", "--set", "batch=null"], "batch: missing or null"),
    ("plan-set-batch-empty", ["plan", "byol-r18", "-k", "2", "--set", "batch={}"], "which a mapping would drop"),
    ("plan-spec-without-batch-size", ["plan", "--spec", "nosize.yaml", "-k", "2"], "nosize.yaml: batch.size: missing"),
    ("plan-set-ema-empty", ["plan", "byol-r18", "-k", "2", "--set", "ema={}"], "ema is a section holding momentum"),
    ("run-set-ema-null", ["run", *TINY, "--kappa", "2", "--set", "ema=null", "--out", "X"], "ema: missing or null"),
    ("plan-set-section-mapping", ["plan", "byol-r18", "-k", "2", "--set", "optimizer={lr: 0.1}"],
     "set its keys one at a time, e.g. optimizer.name=VALUE"),
    ("plan-set-task", ["plan", "dino-vit", "-k", "2", "--set", "task=byol"], "task cannot be changed"),
    ("plan-set-unknown-key", ["plan", "byol-r18", "-k", "2", "--set", "nosuch=1"], "docs/spec-keys.md lists the keys"),
    ("plan-ema-also-twice", ["plan", "byol-r18", "-k", "2", "--set", "ema.also=[0.9, 0.9]"],
     "ema.also[1]: 0.9 is already kept"),
    # κ at the edges of float64: a step count or a scaled value past its range, a linear rule that rounds to 1
    ("plan-kappa-subnormal", ["plan", "parabola", "--kappa", "1e-320"], "overflows at κ=9.99989e-321; the smallest"),
    ("plan-lr-infinite", ["plan", "byol-r18", "--kappa", "1e300", "--set", "optimizer.lr=1e10", "-f", "json"],
     "optimizer.lr: 1e+10 scales to inf"),
    ("plan-wd-nan", ["plan", "byol-r18", "--kappa", "1e300", "--set", "optimizer.lr=1e10", "--set",
                     "optimizer.weight_decay_rule=auto", "-f", "json"], "past float64's range"),
    ("plan-beta-rounds-to-one", ["plan", "ctc-pseudo-label", "--kappa", "1e-14"], "rounds to 1 at κ=1e-14"),
    ("plan-linear-rounds-to-one", ["plan", "byol-r18", "--kappa", "1e-15", "--ema-rule", "linear"],
     "use κ ≥ 2.78e-14"),
    # --progressive replaces the spec's schedule: a --set of its shape would be dropped unseen
    ("plan-progressive-and-set-shape", ["plan", "byol-r18", "-k", "4", "--progressive", "step:10", "--set",
                                        "progressive.from_kappa=2"], "--set progressive.from_kappa and --progressive"),
    ("plan-progressive-constant-and-set-shape", ["plan", "byol-r18", "-k", "4", "--progressive", "constant",
                                                 "--set", "progressive.epoch=3"],
     "--set progressive.epoch and --progressive"),
    ("plan-too-many-stages", ["plan", "byol-r18", "-k", "64", "--progressive", "smooth:0-100000", "--set",
                              "schedule.epochs=1e9"], "more than 10,000 stages"),
    # an option a command would ignore, or a metric this spec never logs (its task's other specs do)
    ("sweep-metric-of-another-spec", ["sweep", "ctc-polyak", "--preset", "tiny", "--kappas", "2", "--metric",
                                      "pl_wer", "--out", "X"], "ctc-polyak logs loss, grad_norm, ctc_loss, wer ("),
    ("plan-world-size-without-timm", ["plan", "byol-r18", "-k", "2", "--world-size", "4"],
     "--world-size applies only with --timm-args"),
    ("power-list-with-seeds", ["power", "--list", "--seeds", "7"], "--list takes no --seeds; drop it"),
    ("power-spread-unknown", ["power", "rule_closer", "--effect", "1", "--spread", "exact"],
     "--spread must be one of bounded, estimated, known, got 'exact'"),
    ("power-effect-huge", ["power", "rule_closer", "--effect", "1e308"], "--effect must lie in [−1e+06, 1e+06]"),
    ("power-noise-huge", ["power", "rule_closer", "--effect", "1", "--noise", "1e155"], "--noise must lie in"),
    ("table-batch-at-2-53", ["table", "momenta", "--batch-sizes", "9007199254740993"], "at or past 2^53"),
    ("plan-betas-binding-bound", ["plan", "ctc-polyak", "--kappa", "1e-14"], "betas[1]: 1 − κ(1 − β) for β=0.999 "
                                                                             "rounds to 1 at κ=1e-14"),
    ("limits-batch-underflow", ["limits", "--momentum", "0.99", "--batch-size", "1e-320"], "below float64's range"),
    ("sweep-out-study-run", ["sweep", *TINY, "--out", "studyrun"], "is a run's directory (it holds results.json)"),
    ("run-out-another-experiments-run", ["run", "dino-vit", "--preset", "tiny", "--out", "otherexp"],
     "otherexp holds a run of byol-r18, not dino-vit; pass --out NEW_DIR"),
    # a timm args.yaml: batch-counted keys are whole numbers
    ("plan-timm-log-interval-list", ["plan", "--timm-args", "args.yaml", "-k", "2"],
     "log_interval must be a whole number ≥ 0, got [50]"),
]


def _run_dir(root: Path, name: str, kappa: float, lines: list[str]) -> None:
    d = root / name
    d.mkdir()
    (d / "hparams.json").write_text(json.dumps({"experiment": "byol-r18", "kappa": kappa, "ema_rule": True,
                                               "ema_rule_form": "exponential", "seed": 0, "dataset_size": 10}))
    (d / "metrics.jsonl").write_text("".join(lines))


def _row(epoch: float, **values) -> str:
    return json.dumps({"kind": "eval", "epoch": epoch, "samples_seen": epoch * 10, **values}) + "\n"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "root" / "byol-r18").mkdir(parents=True)  # a sweep root where one run's directory is a file
    (tmp_path / "root" / "byol-r18" / "tiny-k2-rule-s0").write_text("")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "studyrun").mkdir()  # a study's run directory: its record, no checkpoint
    (tmp_path / "studyrun" / "results.json").write_text("{}\n")
    (tmp_path / "otherexp").mkdir()  # a byol-r18 run with its checkpoint
    (tmp_path / "otherexp" / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "otherexp" / "hparams.json").write_text(json.dumps({"experiment": "byol-r18", "kappa": 1.0}))
    (tmp_path / "logonly").mkdir()
    (tmp_path / "logonly" / "metrics.jsonl").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe")
    (tmp_path / "mine.yaml").write_text("name: mine\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\n"
                                        "ema: {momentum: 0.99}\nschedule: {kind: cosine, epochs: 10}\n")
    (tmp_path / "adam.yaml").write_text("name: mine\ntask: byol\nbatch: {size: 256}\n"
                                        "optimizer: {name: adam, lr: 0.001}\nema: {momentum: 0.99}\n")
    base = "name: mine\ntask: byol\nbatch: {size: 256}\noptimizer: {name: sgd, lr: 0.1}\nema: {momentum: 0.99}\n"
    (tmp_path / "dup.yaml").write_text(base + "batch: {size: 512}\n")
    (tmp_path / "dupkey.yaml").write_text(base.replace("lr: 0.1", "lr: 0.1, lr: 0.2"))
    (tmp_path / "deep.yaml").write_text(base + "title: " + "[" * 3000 + "]" * 3000 + "\n")
    (tmp_path / "deep40.yaml").write_text(base + "title: " + "[" * 40 + "]" * 40 + "\n")
    bomb = "a0: &a1 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i + 1} [{', '.join([f'*a{i}'] * 10)}]\n" for i in range(1, 7))
    (tmp_path / "bomb.yaml").write_text(base + bomb)
    (tmp_path / "loop.yaml").write_text(base + "x: &l {y: *l}\n")
    (tmp_path / "preset5.yaml").write_text(base + "presets: {tiny: 5}\n")
    (tmp_path / "nosize.yaml").write_text(base.replace("{size: 256}", "{unit: samples}"))
    (tmp_path / "args.yaml").write_text("batch_size: 128\nopt: sgd\nlog_interval: [50]\n")
    (tmp_path / "presetnum.yaml").write_text(base + "presets: {5: {ema.momentum: 0.9}}\n")
    (tmp_path / "absname.yaml").write_text(base.replace("name: mine", f"name: {tmp_path / 'abs'}"))
    good = [_row(e, probe_top1=float(e)) for e in range(4)]
    _run_dir(tmp_path, "k1", 1, good)
    _run_dir(tmp_path, "k4", 4, good)
    _run_dir(tmp_path, "torn", 4, good[:2] + ['{"kind": "eval", "epo'])
    _run_dir(tmp_path, "corrupt", 4, good[:1] + ["not json\n"] + good[1:])
    _run_dir(tmp_path, "nometric", 4, [_row(e, loss=1.0) for e in range(4)])
    mine = tmp_path / "mine"  # the user's own folder: a figure, a compare figure and a report of theirs
    (mine / "figures").mkdir(parents=True)
    (mine / "figures" / "loss.png").write_bytes(b"\x89PNG not emarule's")
    (mine / "compare-probe_top1.png").write_bytes(b"\x89PNG not emarule's")
    (mine / "report.md").write_text("# my notes\n")
    _run_dir(mine, "k1", 1, good)
    _run_dir(mine, "k4", 4, good)
    (tmp_path / "runs" / "byol-r18").mkdir(parents=True)  # a sweep's root: runs/<experiment>/<run>
    _run_dir(tmp_path / "runs" / "byol-r18", "k1", 1, good)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def tree(root: Path) -> dict:
    """Every path under root, and each file's size and modification time: a file or directory created,
    removed or rewritten shows up as a difference. A directory's own mtime is left out: a run takes its
    directory's lock before it builds the task, and a refusal from that build removes the lock and the
    directory it made, which leaves nothing but a newer mtime on the parent."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = "dir" if n in dirnames else (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(workdir, capsys, argv, needle):
    before = tree(workdir)
    refused_in_one_line(argv, capsys, needle)
    assert tree(workdir) == before


def test_a_sweep_is_offered_only_options_it_has(workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", *TINY, "--kappas", "0.001"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("(κB ≥ 1)")  # no "--batch-size", which sweep lacks


def test_the_corpus_covers_every_category():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_read_only_directory(workdir, capsys):
    (workdir / "ro").mkdir()
    (workdir / "ro").chmod(0o555)
    try:
        with pytest.raises(SystemExit) as e:
            main(["run", *TINY, "--out", "ro/run"])
        assert e.value.code == 2 and "cannot write in" in capsys.readouterr().err
        assert list((workdir / "ro").iterdir()) == []
    finally:
        (workdir / "ro").chmod(0o755)


def test_what_is_not_an_error(workdir, capsys):
    """The checks leave valid inputs alone: seconds batches may be fractional, `plan` may show a
    fractional κB, `--verbose` goes with any plan, and an Adam spec that brings its betas plans."""
    for argv in (["plan", "ctc-polyak", "--batch-size", "4640.5"],
                 ["plan", "byol-r18", "--kappa", "0.3"],
                 ["plan", "byol-r18", "--kappa", "2", "--ema-rule", "linear"],
                 ["plan", "byol-r18", "--kappa", "2", "--verbose"],
                 ["plan", "byol-r18", "--kappa", "2", "--set", "optimizer.name=adam",
                  "--set", "optimizer.betas=[0.9, 0.99]", "--set", "optimizer.eps=1e-8"],
                 ["plan", "byol-r18", "--kappa", "2", "--progressive", "step:0"],
                 ["plan", "--spec", "mine.yaml", "--kappa", "2"],
                 ["table", "lr", "--lr", "0.1", "--optimizer", "adam"],
                 # β̂ = 0 at κ = 1/(1 − β) exactly is valid (float noise made it −8.9e-16)
                 ["plan", "byol-vit", "--kappa", "1000", "--set", "optimizer.betas=[0.999,0.999]"],
                 ["plan", "byol-vit", "--kappa", "20", "--set", "optimizer.betas=[0.95,0.999]"],
                 ["plan", "byol-r18", "--kappa", "125", "--ema-rule", "linear"],
                 ["plan", "byol-r18", "--kappa", "2", "--progressive", "step:1", "--set", "schedule.epochs=1e9"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, (argv, capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["run", *TINY, "--out", "new"], ["sweep", *TINY, "--out", "new"],
                                  ["reproduce", "polyak", "--out", "new"]])
@pytest.mark.parametrize("env", [{"WORLD_SIZE": "3"}, {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x"}])
def test_distributed_variables_without_torchrun_are_one_line(workdir, capsys, monkeypatch, argv, env):
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = tree(workdir)
    refused_in_one_line(argv, capsys, "not: launch with torchrun")
    assert tree(workdir) == before


def test_the_betas_bound_named_is_one_every_beta_meets(workdir, capsys):
    """The smallest κ a rounds-to-1 error names is the binding β's, so the plan at that κ stands."""
    refused_in_one_line(["plan", "ctc-polyak", "--kappa", "1e-14"], capsys, "use κ ≥ 2.22e-13")
    with pytest.raises(SystemExit) as e:
        main(["plan", "ctc-polyak", "--kappa", "2.22e-13", "-f", "json"])
    assert e.value.code == 0
