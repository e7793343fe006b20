"""`emarule probe` (emarule/analysis/teacher_probe.py): the offline probes of finished self-supervised runs."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from cli_util import one_line_error

from emarule.analysis import offline_probe as PC
from emarule.cli.main import app


@pytest.fixture(scope="module")
def byol_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "k1"
    res = CliRunner().invoke(app, ["run", "byol-r18", "--preset", "tiny", "--set", "schedule.epochs=1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def probe(*args):
    return CliRunner().invoke(app, ["probe", *map(str, args)])


def test_json_reads_the_three_probes_and_the_margin_over_the_better_reference(byol_run, monkeypatch):
    monkeypatch.setattr(PC, "_PIXELS", {})
    res = probe(byol_run, "--jobs", "1", "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    (row,) = got["runs"]
    assert row["trained"] == PC.offline_probe(byol_run)["offline_probe_top1"]
    assert row["init"] == PC.offline_probe(byol_run, at_init=True)["offline_probe_top1"]
    assert row["pixels"] == PC.pixel_probe(byol_run)["pixels_probe_top1"]
    assert row["margin"] == pytest.approx(row["trained"] - max(row["init"], row["pixels"]))
    assert (row["experiment"], row["seed"], row["kappa"]) == ("byol-r18", 0, 1.0)
    assert got["bar"]["margin"] == pytest.approx(row["margin"]) and got["bar"]["met"] is (row["margin"] >= 15)


def test_a_folder_stands_for_its_runs_and_the_table_gives_their_mean(byol_run, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("a", "b"):
        shutil.copytree(byol_run, folder / name)
    res = probe(folder, "--jobs", "2")
    assert res.exit_code == 0, res.output
    assert "│ a " in res.output and "│ b " in res.output and "│ mean" in res.output
    assert "15-point bar" in res.output


def test_runs_of_two_experiments_get_no_mean_and_no_bar(byol_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(byol_run, other)
    h = json.loads((other / "hparams.json").read_text())
    h["spec"]["name"] = "byol-other"
    (other / "hparams.json").write_text(json.dumps(h))
    res = probe(byol_run, other, "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["bar"] is None and [r["experiment"] for r in got["runs"]] == ["byol-r18", "byol-other"]


def test_bad_runs_are_one_line_each_before_any_fit(byol_run, tmp_path):
    one_line_error(probe(tmp_path / "missing"), "does not exist")
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("x")
    one_line_error(probe(not_a_run), "not a run directory")
    polyak = tmp_path / "polyak"
    polyak.mkdir()
    (polyak / "hparams.json").write_text(json.dumps({"spec": {"task": "polyak", "name": "polyak-r50"}}))
    one_line_error(probe(polyak), "polyak run", "byol, dino")
    unsaved = tmp_path / "unsaved"
    unsaved.mkdir()
    shutil.copy(byol_run / "hparams.json", unsaved)
    one_line_error(probe(unsaved), "no checkpoint.pt", "run it again")
    # the good run given first is not probed either: every path is checked before any fit
    fresh = tmp_path / "fresh"
    shutil.copytree(byol_run, fresh)
    for cache in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS):
        (fresh / cache).unlink(missing_ok=True)
    one_line_error(probe(fresh, unsaved), "no checkpoint.pt")
    assert not any((fresh / c).exists() for c in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS))
    truncated = tmp_path / "truncated"
    shutil.copytree(fresh, truncated)
    ck = truncated / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:1000])
    one_line_error(probe(fresh, truncated), "cannot read", "checkpoint.pt")
    assert not any((fresh / c).exists() for c in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS))
    damaged = tmp_path / "damaged"
    shutil.copytree(fresh, damaged)
    (damaged / "hparams.json").write_text("{")
    one_line_error(probe(damaged), "cannot be read")
    # the checkpoint of another experiment's run, put in this run's directory: named before any fit
    swapped = tmp_path / "swapped"
    shutil.copytree(fresh, swapped)
    import torch

    ck = torch.load(swapped / "checkpoint.pt", weights_only=False)
    ck["fingerprint"]["spec"]["name"] = "dino-vit"
    torch.save(ck, swapped / "checkpoint.pt")
    one_line_error(probe(fresh, swapped), "checkpoint.pt is the checkpoint of a run of dino-vit, not byol-r18")
    assert not any((fresh / c).exists() for c in (PC.CACHE, PC.CACHE_INIT, PC.CACHE_PIXELS))
