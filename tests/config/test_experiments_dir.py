"""Where the named experiments' specs are read from: the package's own folder, or $EMARULE_EXPERIMENTS."""

import shutil
from pathlib import Path

import pytest

import emarule
from emarule.config.load import experiment_names, experiments_dir, load_spec
from tests.cli_util import refused_in_one_line

PACKAGED = Path(emarule.__file__).parent / "experiments"


def test_the_specs_are_read_from_the_package(monkeypatch):
    monkeypatch.delenv("EMARULE_EXPERIMENTS", raising=False)
    assert experiments_dir() == PACKAGED and len(experiment_names()) == 9
    assert load_spec("byol-vit")["source"] == str(PACKAGED / "byol-vit.yaml")
    monkeypatch.setenv("EMARULE_EXPERIMENTS", "")  # empty is unset
    assert experiments_dir() == PACKAGED


def test_the_variable_replaces_the_packaged_specs(monkeypatch, tmp_path, capsys):
    shutil.copy(PACKAGED / "byol-vit.yaml", tmp_path / "mine.yaml")
    monkeypatch.setenv("EMARULE_EXPERIMENTS", str(tmp_path))
    assert experiment_names() == ["mine"]
    assert emarule.scale("mine", 4)["ema.momentum"] == pytest.approx(0.99 ** 4)
    refused_in_one_line(["plan", "byol-vit", "--kappa", "2"], capsys,
                        "unknown experiment 'byol-vit'; choose one of: mine (or pass --spec PATH)")


@pytest.mark.parametrize("argv", [["list"], ["plan", "byol-vit", "--kappa", "2"]])
@pytest.mark.parametrize("make,words", [
    (lambda p: p / "absent", "no such folder"),
    (lambda p: (p / "a.yaml").write_text("{}") and p / "a.yaml", "is a file"),
    (lambda p: p, "holds no <name>.yaml spec"),
])
def test_a_wrong_folder_is_one_line_naming_the_variable(argv, make, words, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("EMARULE_EXPERIMENTS", str(make(tmp_path)))
    line = refused_in_one_line(argv, capsys, words)
    assert line.startswith("error: EMARULE_EXPERIMENTS=") and "unset it to use the specs installed with emarule" in line


def test_a_spec_given_by_path_needs_no_experiments_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("EMARULE_EXPERIMENTS", str(tmp_path / "absent"))
    assert emarule.scale(PACKAGED / "byol-vit.yaml", 2)["ema.momentum"] == pytest.approx(0.99 ** 2)
