"""results/cpu-root: the records of a `make repro` root on the 2-core CPU, kept in the repository so that a
root outlives its machine. Each archive must hold one reproduction's directory, records only, and the analysis
must still judge them: a change that made them unreadable, or read them as made with other settings, would
leave the next sitting to train them all again."""

import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emarule.analysis.reproduce.claims import FAMILIES
from emarule.cli.main import app

ROOT = Path(__file__).resolve().parents[2] / "results" / "cpu-root"
ARCHIVES = sorted(ROOT.glob("*.tgz"))
runner = CliRunner()


def test_the_records_are_there():
    assert {a.name for a in ARCHIVES} >= {"parabola.tgz", "precision.tgz", "polyak.tgz", "byol-headline.tgz"}


@pytest.mark.parametrize("archive", ARCHIVES, ids=[a.stem for a in ARCHIVES])
def test_each_archive_is_one_reproductions_records(archive):
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert all(n == archive.stem or n.startswith(f"{archive.stem}/") for n in names), names[:3]
        assert not [n for n in names if n.endswith((".pt", ".png"))]  # no checkpoints, snapshots or figures
        assert all(m.isfile() or m.isdir() for m in tar.getmembers())  # no links to follow out of the root
        ledger = [json.loads(x) for x in tar.extractfile(f"{archive.stem}/invocations.jsonl").read().splitlines()]
    assert ledger and ledger[-1]["args"]["family"] in FAMILIES and not ledger[-1].get("ended")


def test_a_kept_reproduction_is_judged_again_with_the_numbers_it_gave(tmp_path):
    """byol's headline check on seeds 100-104, its 15 runs judged from their records: the README's row."""
    with tarfile.open(ROOT / "byol-headline.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    out = tmp_path / "byol-headline"
    res = runner.invoke(app, ["reproduce", "byol", "--headline", "--seeds", "100-104", "--out", str(out),
                              "--judge-only"])
    assert res.exit_code == 0, res.output
    assert "judging the 15 runs" in res.output and "nothing trains" in res.output
    (claim,) = json.loads((out / "verdict.json").read_text())["claims"]
    assert claim["verdict"] == "not reproduced at this preset"
    assert claim["effect"] == pytest.approx(2.43, abs=0.005)
    assert claim["effect_ci"] == pytest.approx([-2.60, 7.46], abs=0.01)
