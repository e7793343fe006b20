"""docs/model-ema.md: every `python` block runs, in order, in one namespace, and prints what it says.

A `print(...)  # text` line, or the comment lines closing a block, state output that must appear
(a trailing "..." allows the rest of the line to differ)."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "model-ema.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)


def expected(block: str) -> list[str]:
    lines = block.rstrip("\n").split("\n")
    said = [ln.split("  # ", 1)[1] for ln in lines if "print(" in ln and "  # " in ln]
    tail = []
    for ln in reversed(lines):
        if not ln.startswith("# "):
            break
        tail.insert(0, ln[2:])
    return [s.removesuffix(" ...").strip() for s in said + tail]


def test_every_python_block_runs_and_prints_what_it_states():
    import torch

    torch.set_num_threads(1)
    found = blocks()
    assert len(found) >= 4
    namespace: dict = {}
    for i, block in enumerate(found):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{DOC.name} block {i + 1}", "exec"), namespace)
        for text in expected(block):
            assert text in out.getvalue(), (i + 1, text, out.getvalue())
