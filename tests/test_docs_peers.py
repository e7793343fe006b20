"""docs/ema-vs-peers.md: every test it names as backing an emarule ✓ exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_named_test_exists():
    table = (ROOT / "docs" / "ema-vs-peers.md").read_text()
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", table)
    assert len(named) >= 10
    for path, name in named:
        assert f"def {name}(" in (ROOT / path).read_text(), f"{path}::{name}"
    for path in set(re.findall(r"(tests/test_\w+\.py)", table)):
        assert (ROOT / path).is_file(), path
