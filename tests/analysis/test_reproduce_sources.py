"""What the reproduction's sources and the Makefile say about themselves holds."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def test_every_file_the_reproduction_sources_name_exists():
    named = re.compile(r"(?<![\w/.{}-])((?:scripts|emarule|tests|docs|benchmarks|experiments)/[\w./-]+"
                       r"\.(?:py|md|yaml|sh))")
    missing = [f"{f.name}: {m.group(1)}" for f in sorted((REPO / "emarule/analysis/reproduce").glob("*.py"))
               for m in named.finditer(f.read_text()) if not (REPO / m.group(1)).exists()]
    assert not missing


def test_the_bench_targets_comment_counts_its_benchmarks():
    text = (REPO / "Makefile").read_text()
    target = re.search(r"^bench:.*?\n((?:\t.*\n)+)", text, re.M).group(1)
    scripts = re.findall(r"benchmarks/\w+\.py", target)
    said = re.search(r"smoke test of all (\w+)", text).group(1)
    assert WORDS[said] == len(scripts), (said, scripts)


def test_the_tables_headline_seeds_are_the_makefiles():
    from emarule.analysis.reproduce.table import NEW_SEEDS
    from emarule.request.seeds import parse_seeds

    seeds = re.search(r"^REPRO_SEEDS_NEW := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert parse_seeds(seeds) == NEW_SEEDS


def test_make_repro_says_which_family_it_is_at(tmp_path):
    """`make repro` with stand-ins for emarule and the table writer: a progress line before each family, its
    headline check after each training family, in the registry's order."""
    import os
    import shutil
    import subprocess
    import sys

    from emarule.analysis.reproduce.claims import FAMILIES

    if shutil.which("make") is None:
        import pytest

        pytest.skip("no make on this machine")
    (tmp_path / "emarule").write_text('#!/bin/sh\necho "emarule $*"\n')
    (tmp_path / "python").write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'
                                     'echo "table $*"\n')
    for f in ("emarule", "python"):
        (tmp_path / f).chmod(0o755)
    env = os.environ | {"PYTHONPATH": str(REPO)}
    stamp = tmp_path / "installed"  # newer than pyproject.toml, so make builds no environment
    stamp.touch()
    out = subprocess.run(["make", "-s", "-C", str(REPO), "repro", f"BIN={tmp_path}", f"STAMP={stamp}",
                          f"REPRO_OUT={tmp_path / 'root'}"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    n = len(FAMILIES)
    progress = [line for line in lines if line.startswith("make repro: [")]
    assert progress == [f"make repro: [{i}/{n}] {name}, 0 min in" for i, name in enumerate(FAMILIES, 1)]
    for name, family in FAMILIES.items():
        at = lines.index(f"make repro: [{list(FAMILIES).index(name) + 1}/{n}] {name}, 0 min in")
        assert lines[at + 1] == f"emarule reproduce {name} --out {tmp_path / 'root'}/{name}"
        headline = f"emarule reproduce {name} --headline --seeds 100-104 --out {tmp_path / 'root'}/{name}-headline"
        assert (lines[at + 2] == headline) == (family.kind == "sweep")
    assert lines[-2].startswith(f"table -m emarule.analysis.reproduce.table {tmp_path / 'root'} --readme README.md")
