"""docs/api.md's example prints what its comments say: step 1 of its block (the recipe and `emarule.scale`) is
run as written, and the values each `# ...` comment line shows are compared with what the line above returns.
Steps 2 and 3 need a model and a training loop; scripts/ema_in_your_loop.py runs them (tests/test_api.py)."""

import ast
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def step_one() -> list[str]:
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    return block.split("# 2.")[0].splitlines()


def test_the_scaled_values_the_page_shows_are_what_scale_returns():
    lines, namespace, checked = step_one(), {}, 0
    for i, line in enumerate(lines):
        shown = re.fullmatch(r"# (\d[\d.]*, .*?)(?: \(.*\))?", line)  # a line of values, not "# 1. The ..."
        if not shown:
            continue
        code = "\n".join(x for x in lines[:i - 1] if not x.startswith("#"))
        exec(compile(code, str(PAGE), "exec"), namespace)
        got = eval(lines[i - 1].split("#")[0], namespace)
        want = ast.literal_eval(f"({shown.group(1)},)")
        for g, w in zip(got, want, strict=True):
            digits = len(repr(w).split(".")[-1]) if isinstance(w, float) else 0
            assert (round(g, digits) if digits else g) == w, (line, got)
        checked += 1
    assert checked == 1, "the page's step 1 shows one line of values"
