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
