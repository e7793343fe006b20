"""docs/ema-vs-peers.md: the feature table cannot drift from the tests that back it."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = (ROOT / "docs" / "ema-vs-peers.md").read_text(encoding="utf-8")
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def rows() -> list[list[str]]:
    """The feature rows: [feature, emarule, timm, AveragedModel, Lightning, Composer, EDM2, ema-pytorch, diffusers]."""
    out = [[c.strip() for c in line.strip().strip("|").split("|")] for line in TABLE.splitlines()
           if line.startswith("| ") and not line.startswith("| feature")]
    return [r for r in out if set(r[1]) - {"-", " "}]  # not the separator row


def functions(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_cited_test_node_exists():
    named = NODE.findall(TABLE)
    assert len(named) >= 30
    for path, name in named:
        assert (ROOT / path).is_file(), path
        assert name.startswith("test_") and name in functions(path), f"{path}::{name} is not a test there"


def test_every_emarule_tick_names_its_tests_and_matches_any_peers_tick():
    table = rows()
    assert len(table) >= 19 and all(len(r) == 9 for r in table), table
    for feature, ours, *peers in table:
        if any(p.startswith("✓") for p in peers):
            assert ours.startswith("✓"), f"a peer has {feature!r}, emarule does not"
        if ours.startswith("✓"):
            assert NODE.search(ours), f"{feature!r}: emarule's ✓ names no test (tests/x.py::test_y)"
    assert "ema helper" not in TABLE and "own branch" not in TABLE
