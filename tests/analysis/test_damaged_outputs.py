"""Damaged or foreign files in what `emarule run` and `emarule reproduce` wrote: each is one line on stderr
(exit 2, nothing written), or, for what the command can rebuild (probe caches, a study's results), rebuilt."""

import json
import shutil
from pathlib import Path

import pytest
from cli_util import invoke, one_line_error, snapshot
from emarule.analysis import offline_probe as PC

STUDY = Path("parabola") / "tiny-k1-rule-s0"  # where `reproduce parabola --preset tiny` runs its study


@pytest.fixture(scope="module")
def byol_run(tmp_path_factory):
    """A finished tiny byol run (two evaluations), its probe caches filled."""
    out = tmp_path_factory.mktemp("byol") / "k1"
    res = invoke("run", "byol-r18", "--preset", "tiny", "--out", out)
    assert res.exit_code == 0, res.output
    assert invoke("probe", out, "--jobs", "1").exit_code == 0
    return out


@pytest.fixture
def run_copy(byol_run, tmp_path):
    return Path(shutil.copytree(byol_run, tmp_path / "k1"))


@pytest.fixture(scope="module")
def parabola(tmp_path_factory):
    out = tmp_path_factory.mktemp("parabola") / "D"
    res = invoke("reproduce", "parabola", "--preset", "tiny", "--out", out)
    assert res.exit_code == 0, res.output
    return out


def reproduce_parabola(out):
    return invoke("reproduce", "parabola", "--preset", "tiny", "--out", out)


# --- emarule probe ----------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [{"a": 1}, [1, 2]], ids=["dict", "list"])
def test_probe_names_a_foreign_checkpoint(run_copy, content):
    import torch

    for cache in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):
        (run_copy / cache).unlink()
    torch.save(content, run_copy / "checkpoint.pt")
    before = snapshot(run_copy)
    one_line_error(invoke("probe", run_copy), "checkpoint.pt", "not an emarule checkpoint", "run the run again")
    assert snapshot(run_copy) == before


def test_probe_refits_damaged_caches(run_copy, byol_run, monkeypatch):
    monkeypatch.setattr(PC, "_PIXELS", {})  # as a fresh process: no pixel fit held from the fixture's
    (run_copy / PC.CACHE).write_text("{")
    (run_copy / PC.CACHE_INIT).write_bytes(b"\xff")
    (run_copy / PC.CACHE_PIXELS).write_text("[]")
    res = invoke("probe", run_copy, "--format", "json")
    assert res.exit_code == 0, res.output
    for cache in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):  # refitted to the same reading, and rewritten
        assert json.loads((run_copy / cache).read_text()) == json.loads((byol_run / cache).read_text())


def test_probe_refits_a_cache_edited_by_hand(run_copy, byol_run, monkeypatch):
    """A cache is sealed with what it was fitted on: an edited reading (which would move a verdict) is fitted
    again, not believed."""
    monkeypatch.setattr(PC, "_PIXELS", {})
    for cache, key in ((PC.CACHE, "offline_probe_top1"), (PC.CACHE_INIT, "offline_probe_top1"),
                       (PC.CACHE_PIXELS, "pixels_probe_top1")):
        got = json.loads((run_copy / cache).read_text())
        (run_copy / cache).write_text(json.dumps({**got, key: 99.0}))
    assert invoke("probe", run_copy, "--format", "json").exit_code == 0
    for cache in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):
        assert json.loads((run_copy / cache).read_text()) == json.loads((byol_run / cache).read_text())


def test_a_final_teachers_cache_is_sealed_to_its_checkpoints_bytes(run_copy):
    before = PC._source(run_copy, "final")
    with open(run_copy / "checkpoint.pt", "ab") as f:  # another checkpoint: a run trained again
        f.write(b"\0")
    assert PC._source(run_copy, "final") != before
    assert PC._cached(run_copy / PC.CACHE, "offline_probe_top1", PC._source(run_copy, "final")) is None


# --- emarule reproduce ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,damage", [("results.json", "{"), ("run.json", "["), ("reproduce-spec.json", "{")])
def test_reproduce_computes_a_damaged_study_again(parabola, tmp_path, name, damage):
    out = Path(shutil.copytree(parabola, tmp_path / "D"))
    (out / STUDY / name).write_text(damage)
    res = reproduce_parabola(out)
    assert res.exit_code == 0 and "computing the study again" in res.output, res.output
    assert isinstance(json.loads((out / STUDY / name).read_text()), (dict, list))  # rewritten whole
    assert (out / STUDY / "results.json").read_text() == (parabola / STUDY / "results.json").read_text()
    assert json.loads((out / "verdict.json").read_text())["timing"]["reused"] == 0


def test_reproduce_reuses_a_study_whose_spec_differs_only_in_description_or_path(parabola, tmp_path):
    """The appendix a spec cites, or where the checkout lies, changes nothing the study computes."""
    out = Path(shutil.copytree(parabola, tmp_path / "D"))
    path = out / STUDY / "reproduce-spec.json"
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, "section": "App. E.1", "source": "/elsewhere/parabola.yaml"}))
    res = reproduce_parabola(out)
    assert res.exit_code == 0 and "reusing it" in res.output, res.output
    path.write_text(json.dumps({**written, "ema": {**written["ema"], "momentum": 0.5}}))  # a setting: refused
    one_line_error(reproduce_parabola(out), "holds results computed with other settings")


def test_reproduce_skips_a_damaged_ledger_line(parabola, tmp_path):
    out = Path(shutil.copytree(parabola, tmp_path / "D"))
    with open(out / "invocations.jsonl", "ab") as f:
        f.write(b"\xff")
    res = reproduce_parabola(out)
    assert res.exit_code == 0, res.output
    lines = (out / "invocations.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["runs"] == 1 for x in lines)


def test_reproduce_resumes_a_study_stopped_after_its_results(parabola, tmp_path):
    """A full disk stopped the study after results.json, before its figures and reproduce-spec.json."""
    out = Path(shutil.copytree(parabola, tmp_path / "D"))
    study = out / STUDY
    for p in [study / "reproduce-spec.json", study / "run.json", study / "table.txt", out / "report.md",
              out / "verdict.json", out / "invocations.jsonl", *(study / "figures").iterdir()]:
        p.unlink()
    res = reproduce_parabola(out)
    assert res.exit_code == 0 and "computing the study again" in res.output, res.output
    assert (study / "reproduce-spec.json").is_file() and (study / "figures" / "summary.png").is_file()


def test_reproduce_refuses_another_familys_reproduction(parabola, tmp_path):
    out = Path(shutil.copytree(parabola, tmp_path / "D"))
    before = snapshot(out)
    one_line_error(invoke("reproduce", "precision", "--preset", "tiny", "--out", out), "holds the parabola")
    assert snapshot(out) == before
    (out / "verdict.json").unlink()  # the ledger names the family too
    before = snapshot(out)
    one_line_error(invoke("reproduce", "precision", "--preset", "tiny", "--out", out), "holds the parabola")
    assert snapshot(out) == before


def test_reproduce_refuses_a_run_directory(run_copy):
    before = snapshot(run_copy)
    one_line_error(reproduce_parabola(run_copy), "run's directory", "hparams.json")
    assert snapshot(run_copy) == before


# --- emarule compare --------------------------------------------------------------------------------


def last_eval(run: Path, value: str) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    i = max(n for n, x in enumerate(lines) if '"kind": "eval"' in x)
    row = json.loads(lines[i])
    lines[i] = json.dumps({**row, "probe_top1": "VALUE"}).replace('"VALUE"', value)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return i + 1


@pytest.mark.parametrize("value", ['"abc"', "NaN", "[1]"])
def test_compare_names_a_non_numeric_metric(run_copy, tmp_path, value):
    n = last_eval(run_copy, value)
    one_line_error(invoke("compare", run_copy, "--out", tmp_path / "x.png"), f"metrics.jsonl, line {n}",
                   "'probe_top1'", "not a number")
    assert not (tmp_path / "x.png").exists()


def test_compare_keeps_a_diverged_runs_nan(run_copy, tmp_path):
    last_eval(run_copy, '"nan"')  # what the engine logs for a non-finite value
    res = invoke("compare", run_copy, "--out", tmp_path / "x.png", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["runs"][0]["final_epoch"] == 1.0  # the curve ends where the run diverged


def test_compare_names_a_missing_log_of_a_run_with_a_checkpoint(run_copy, tmp_path):
    (run_copy / "metrics.jsonl").unlink()
    one_line_error(invoke("compare", run_copy, "--out", tmp_path / "x.png"), "no metrics.jsonl", "damaged",
                   "run it again")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("key,value", [("experiment", None), ("seed", "x"), ("seed", True), ("kappa", -1)])
def test_compare_refuses_edited_hparams(run_copy, tmp_path, key, value):
    h = json.loads((run_copy / "hparams.json").read_text())
    if value is None:
        del h[key]
    else:
        h[key] = value
    (run_copy / "hparams.json").write_text(json.dumps(h))
    one_line_error(invoke("compare", run_copy, "--out", tmp_path / "x.png"), "hparams.json", f"'{key}'")
    assert not (tmp_path / "x.png").exists()
