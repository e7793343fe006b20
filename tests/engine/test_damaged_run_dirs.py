"""Run directories damaged, foreign or busy, met by `emarule run` (and `sweep`): each is one line on stderr
naming the problem and the fix, exit code 2, no traceback, and the directory left as it was
(docs/faults.md)."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emarule.request import checks
from emarule.engine.runlock import LOCK, DirLock
from emarule.errors import UserError
from cli_util import invoke, one_line_error, snapshot
from engine_util import ROOT, env

TINY = ["--preset", "tiny"]


def run_ok(*args) -> Path:
    res = invoke(*args)
    assert res.exit_code == 0, (res.output, res.exception)
    return Path(args[args.index("--out") + 1])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished `emarule run byol-r18 --preset tiny` (10 rows in its metrics.jsonl)."""
    return run_ok("run", "byol-r18", *TINY, "--out", tmp_path_factory.mktemp("byol") / "R")


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("studies")
    return {name: run_ok("run", name, *TINY, "--out", root / name) for name in ("parabola", "precision")}


@pytest.fixture
def R(finished, tmp_path):
    return Path(shutil.copytree(finished, tmp_path / "R"))


def resume(out, *extra, experiment="byol-r18"):
    return invoke("run", experiment, *TINY, "--resume", "--out", out, *extra)


# --- 1, 2: a damaged metrics.jsonl --------------------------------------------------------------------


def test_resume_refuses_a_log_that_is_not_utf8(R):
    with open(R / "metrics.jsonl", "ab") as f:
        f.write(b"\xff\xfe\x00bad\n")
    before = snapshot(R)
    one_line_error(resume(R), "metrics.jsonl, line 11 is not UTF-8 text", "delete that line")
    assert snapshot(R) == before


def _not_utf8(log: Path) -> None:
    with open(log, "ab") as f:
        f.write(b"\xff\xfe\x00bad\n")


def _a_value_edited(log: Path) -> None:
    text = log.read_text()
    assert '"samples_seen": 96,' in text
    log.write_text(text.replace('"samples_seen": 96,', '"samples_seen": 95,', 1))


@pytest.mark.parametrize("damage,words", [
    (_not_utf8, "line 11 is not UTF-8 text"),
    (_a_value_edited, "metrics.jsonl was edited after the run wrote it (its rows up to the checkpoint"),
], ids=["not-utf8", "edited"])
def test_a_sweep_refuses_a_finished_run_whose_log_is_damaged_or_edited(finished, tmp_path, damage, words):
    """A sweep (and so a reproduction) reuses a finished run by resuming it: a log that is not the one the run
    wrote is refused before anything is judged on it."""
    run = Path(shutil.copytree(finished, tmp_path / "S" / "byol-r18" / "tiny-k1-rule-s0"))
    damage(run / "metrics.jsonl")
    before = snapshot(tmp_path / "S")
    res = invoke("sweep", "byol-r18", *TINY, "--kappas", "1", "--rule", "with", "--out", tmp_path / "S")
    assert res.exit_code == 2 and "Traceback" not in res.output, (res.output, res.exception)
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], res.output
    assert snapshot(tmp_path / "S") == before


def test_resume_refuses_a_damaged_line_in_the_middle_instead_of_dropping_it(R):
    lines = (R / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[4] = "not json\n"
    (R / "metrics.jsonl").write_text("".join(lines))
    before = snapshot(R)
    one_line_error(resume(R), "metrics.jsonl, line 5 is not a JSON object (the file is damaged)")
    assert snapshot(R) == before  # still 10 lines: none dropped


def test_resume_drops_a_torn_last_line(R):
    """What a kill leaves (a last line without its newline) is the one line `--resume` drops, as documented."""
    good = (R / "metrics.jsonl").read_text()
    with open(R / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "samples_')
    assert resume(R).exit_code == 0
    assert (R / "metrics.jsonl").read_text() == good


@pytest.mark.parametrize("value", ['"x"', "null", "true"])
def test_resume_refuses_a_row_whose_samples_seen_is_not_a_number(R, value):
    text = (R / "metrics.jsonl").read_text()
    (R / "metrics.jsonl").write_text(text.replace('"samples_seen": 96,', f'"samples_seen": {value},', 1))
    before = snapshot(R)
    one_line_error(resume(R), "metrics.jsonl, line 3: samples_seen is", "not a number")
    assert snapshot(R) == before


# --- 3: a foreign checkpoint --------------------------------------------------------------------------


@pytest.mark.parametrize("content", [[1, 2], {"a": 1}], ids=["list", "dict"])
def test_resume_refuses_a_foreign_checkpoint(R, content):
    import torch

    torch.save(content, R / "checkpoint.pt")
    before = snapshot(R)
    one_line_error(resume(R), "checkpoint.pt is not an emarule checkpoint", "--out NEW_DIR")
    assert snapshot(R) == before


# --- 4: a directory where the lock file goes ----------------------------------------------------------


@pytest.mark.parametrize("resuming", [True, False], ids=["resume", "new-run"])
def test_a_directory_in_place_of_the_lock_file_is_one_line(R, tmp_path, resuming):
    out = R if resuming else tmp_path / "new"
    (out / LOCK).mkdir(parents=True)
    before = snapshot(out)
    res = resume(out) if resuming else invoke("run", "byol-r18", *TINY, "--out", out)
    one_line_error(res, f"{out / LOCK} is a directory, not emarule's lock file", "remove it")
    assert snapshot(out) == before


# --- 5: descriptive spec fields -----------------------------------------------------------------------


def test_resume_ignores_descriptive_spec_fields_and_refuses_real_changes(R):
    """A docs fix that edits a descriptive field (the appendix a spec cites) leaves the runs made before it
    resumable."""
    for key in ("section", "title", "dataset", "paper_result"):
        res = resume(R, "--set", f"{key}=edited in a docs fix")
        assert res.exit_code == 0, (key, res.output)
    before = snapshot(R)
    one_line_error(resume(R, "--set", "optimizer.lr=0.2"), "other settings (spec.optimizer.lr differ)")
    assert snapshot(R) == before


def test_resume_names_another_experiments_run(R, tmp_path):
    spec = yaml.safe_load((ROOT / "emarule" / "experiments" / "byol-r18.yaml").read_text())
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**spec, "name": "mine"}))
    before = snapshot(R)
    res = invoke("run", "--spec", tmp_path / "mine.yaml", *TINY, "--resume", "--out", R)
    one_line_error(res, f"{R} holds a run of byol-r18, not mine")
    assert snapshot(R) == before


# --- 6: another experiment's directory, studies -------------------------------------------------------


def test_a_study_refuses_to_resume_into_a_training_run(R):
    before = snapshot(R)
    one_line_error(resume(R, experiment="parabola"), f"{R} holds a run of byol-r18", "not parabola's")
    assert snapshot(R) == before


@pytest.mark.parametrize("study,argv", [
    ("parabola", ["parabola", *TINY, "--seed", "5"]),
    ("parabola", ["byol-r18", *TINY]),
    ("precision", ["byol-r18", *TINY]),
    ("precision", ["parabola", *TINY]),
], ids=["parabola-over-parabola", "byol-over-parabola", "byol-over-precision", "parabola-over-precision"])
def test_a_new_run_refuses_a_studys_directory(studies, tmp_path, study, argv):
    out = Path(shutil.copytree(studies[study], tmp_path / study))
    before = snapshot(out)
    one_line_error(invoke("run", *argv, "--out", out), f"{out} already holds a run (results.json")
    assert snapshot(out) == before


@pytest.mark.parametrize("experiment", ["parabola", "byol-r18"])
def test_resume_refuses_a_studys_directory(studies, tmp_path, experiment):
    """A study has no checkpoint: `--resume` has nothing to continue (before, its fix, dropping --resume,
    wrote over the study)."""
    out = Path(shutil.copytree(studies["parabola"], tmp_path / "P"))
    before = snapshot(out)
    one_line_error(resume(out, experiment=experiment), f"no checkpoint in {out} (it holds results.json and run.json")
    assert snapshot(out) == before


def test_a_study_computes_again_over_its_own_results_but_not_another_studys(studies, tmp_path):
    """What `emarule reproduce` relies on: a study run (no `emarule run` checks) over its own damaged
    results computes them again; over another experiment's it is refused."""
    from emarule.engine.rundir import check_study_dir

    own = Path(shutil.copytree(studies["parabola"], tmp_path / "P"))
    (own / "results.json").write_text("{")
    check_study_dir(own, "parabola")
    with pytest.raises(UserError, match="holds a run of precision"):
        check_study_dir(studies["precision"], "parabola")


# --- 7: a missing or emptied log ----------------------------------------------------------------------


@pytest.mark.parametrize("damage,words", [
    (lambda p: p.unlink(), "metrics.jsonl is missing"),
    (lambda p: p.write_text(""), "metrics.jsonl holds no row up to the checkpoint"),
], ids=["deleted", "emptied"])
def test_resume_refuses_a_missing_or_empty_log(R, damage, words):
    damage(R / "metrics.jsonl")
    before = snapshot(R)
    one_line_error(resume(R), words, "start a new run with --out NEW_DIR")
    assert snapshot(R) == before


# --- 8: a second run that passed its checks while the first was starting -------------------------------

FIRST = ("import pathlib, sys, time; from emarule.engine.runlock import DirLock\n"
         "with DirLock(sys.argv[1], 'run'):\n"
         "    (pathlib.Path(sys.argv[1]) / 'checkpoint.pt').write_bytes(b'')  # its first checkpoint\n"
         "    print('locked', flush=True); time.sleep(120)\n")


def test_a_run_checked_while_another_started_is_told_it_is_in_use(tmp_path, monkeypatch):
    """`emarule run` checks its directory, then imports torch and builds the task before the loop locks it.
    A first run that locks the directory and writes its first checkpoint in that window (forced here,
    right after the checks) is named as the holder; the second does not judge the directory it is writing."""
    out = tmp_path / "conc"
    first = []
    real = checks.run_dir

    def checked_then_overtaken(path, resume, *rest):
        real(path, resume, *rest)
        p = subprocess.Popen([sys.executable, "-c", FIRST, str(out)], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                             text=True)
        first.append(p)
        assert p.stdout.readline().strip() == "locked"

    monkeypatch.setattr(checks, "run_dir", checked_then_overtaken)
    try:
        res = invoke("run", "byol-r18", *TINY, "--out", out)
    finally:
        for p in first:
            p.kill()
            p.wait()
    one_line_error(res, f"{out} is in use by another emarule run (host {socket.gethostname()}, pid {first[0].pid}")
    assert sorted(os.listdir(out)) == [LOCK, "checkpoint.pt"]  # the first run's, untouched


def test_a_lock_taken_again_in_the_same_process_is_the_same_hold(tmp_path):
    """The runner locks before the task is built, and the loop locks again: the inner release keeps the hold."""
    with DirLock(tmp_path / "run"):
        with DirLock(tmp_path / "run"):
            pass
        assert json.loads((tmp_path / "run" / LOCK).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "run").exists()
