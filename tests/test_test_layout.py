"""The tests mirror the package: each folder of tests/ is named after a package of emarule/ (docs/ holds the
README, docs and examples checks; data/ the fixtures; install/ the wheel, installed as a user installs it), a test
file at the top of tests/ after a module at the top of emarule/, and no two files share a name (pytest imports a
test module by its file name)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "emarule"


def test_every_folder_and_top_level_test_is_named_after_a_part_of_the_package():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders - {"docs", "data", "install"} <= packages, folders - {"docs", "data", "install"} - packages
    top = {p.stem.removeprefix("test_") for p in TESTS.glob("test_*.py")} - {"test_layout"}
    assert top <= {p.stem for p in PACKAGE.glob("*.py")}, top - {p.stem for p in PACKAGE.glob("*.py")}


def test_no_two_test_or_helper_files_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py" and "data" not in p.parts)
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]
