"""emarule.extras: each extra's modules are what pyproject.toml installs for it, every module emarule imports
is the core's or an extra's, and a command missing one refuses in one line, before it writes anything."""

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from emarule import extras
from emarule.errors import UserError
from tests.cli_util import refused_in_one_line

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# typer's own requirement, whose exceptions the CLI catches; the framework callbacks have extras of their own
# (lightning, hf) and say so themselves on import
ALSO_ALLOWED = {"click", "lightning", "pytorch_lightning", "transformers"}


def names(requirements) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def distribution_of(module: str) -> str:
    return canonicalize_name(metadata.packages_distributions()[module][0])


@pytest.mark.parametrize("extra", sorted(extras.EXTRAS))
def test_each_extra_checks_the_modules_of_what_pyproject_installs_for_it(extra):
    assert {distribution_of(m) for m in extras.EXTRAS[extra]} == names(PROJECT["optional-dependencies"][extra])


def test_all_is_every_extra_and_the_core_is_five_packages():
    assert names(PROJECT["dependencies"]) == {"torch", "numpy", "pyyaml", "typer", "rich"}
    (everything,) = PROJECT["optional-dependencies"]["all"]
    assert Requirement(everything).extras == set(extras.EXTRAS)


def test_every_module_emarule_imports_is_the_cores_or_an_extras():
    core = {m for m, dists in metadata.packages_distributions().items()
            if names(dists) & names(PROJECT["dependencies"])}
    allowed = core | {m for ms in extras.EXTRAS.values() for m in ms} | ALSO_ALLOWED
    seen = {}
    for f in (ROOT / "emarule").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top not in sys.stdlib_module_names and top != "emarule":
                    seen.setdefault(top, f.relative_to(ROOT))
    assert {m: str(f) for m, f in seen.items() if m not in allowed} == {}


def test_a_missing_module_names_its_extra_and_the_install(monkeypatch):
    extras.require("byol-r18", ("vision", "plots"))  # all installed here
    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert extras.missing(("vision", "plots", "speech")) == {"vision": ("timm",), "plots": ("matplotlib",)}
    with pytest.raises(extras.MissingExtra) as e:
        extras.require("byol-r18", ("vision", "plots"))
    assert isinstance(e.value, UserError) and isinstance(e.value, ImportError)
    assert str(e.value) == ("byol-r18 needs emarule's vision and plots extras (timm, matplotlib: not installed); "
                            "pip install 'emarule[vision,plots]'")


@pytest.mark.parametrize("argv,blocked,needle", [
    (["run", "parabola", "--preset", "tiny", "--out", "{tmp}/r"], "matplotlib", "pip install 'emarule[plots]'"),
    (["sweep", "byol-r18", "--preset", "tiny", "--out", "{tmp}/s"], "torchvision", "pip install 'emarule[vision]'"),
    (["reproduce", "ctc-polyak", "--out", "{tmp}/p"], "jiwer", "pip install 'emarule[speech]'"),
    (["run", "parabola", "--preset", "tiny", "--wandb", "offline", "--out", "{tmp}/w"], "wandb",
     "--wandb offline needs emarule's wandb extra"),
    (["compare", "{tmp}"], "matplotlib", "compare's figure needs emarule's plots extra"),
    (["probe", "{tmp}"], "sklearn", "emarule probe needs emarule's vision extra"),
])
def test_a_command_missing_an_extra_refuses_in_one_line_and_writes_nothing(argv, blocked, needle, monkeypatch,
                                                                           capsys, tmp_path):
    monkeypatch.setitem(sys.modules, blocked, None)
    refused_in_one_line([a.format(tmp=tmp_path) for a in argv], capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_list_says_which_extras_a_run_lacks(monkeypatch, capsys):
    from emarule.cli.main import main

    monkeypatch.setitem(sys.modules, "soundfile", None)
    monkeypatch.setenv("COLUMNS", "250")
    with pytest.raises(SystemExit) as e:
        main(["list"])
    rows = {line.split("│")[1].strip(): line.split("│")[8].strip() for line in capsys.readouterr().out.splitlines()
            if line.startswith("│ ") and line.split("│")[1].strip()}
    assert e.value.code == 0
    assert rows["ctc-polyak"] == rows["ctc-pseudo-label"] == "with emarule[speech]"
    assert rows["byol-r18"] == rows["parabola"] == "yes"
