"""examples/: each port runs on the bundled digits, prints its diff size, and at κ=4 the EMA with the rule
ends closer to the κ=1 run than the peer's EMA without it."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
RESULTS = re.compile(r"κ=4 .*?(?:accuracy|probe accuracy) ([\d.]+) .*?(?:distance|gap) ([\d.]+)")


def run(name):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    r = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("name,lines", [("timm_model_ema.py", 2), ("lightning_trainer.py", 2),
                                        ("hf_trainer.py", 6), ("lightly_byol.py", 5)])
def test_example_runs_and_the_rule_tracks_kappa_one(name, lines):
    out = run(name)
    assert f"the port changes {lines} lines" in out, out
    (_, without), (_, with_rule) = [tuple(map(float, m)) for m in RESULTS.findall(out)]
    assert with_rule < 0.5 * without, out  # the ported EMA at κ=4 stays closer to κ=1 than the peer's
    assert out.count("κ=1") >= 2
    # The header quotes this output: numbers in docs come from the code as it is. They were measured with the
    # Makefile's torch; another release rounds differently, and so does another CPU under the same torch (the
    # digits' probe at κ=1 prints 0.788 or 0.791 on a 2-core Intel Xeon for lightly's quoted 0.793): with the
    # pinned torch the words match exactly and each number within 1 % or 0.01, with another only the layout.
    header = (EXAMPLES / name).read_text().split('"""')[1]
    found = re.search(r"Measured here \(that command, with the Makefile's torch ([\d.]+);.*?\):\n(.*)", header, re.S)
    assert found, f"{name}: its header must say 'Measured here (that command, with the Makefile's torch X; ...):'"
    pinned, measured = found.groups()
    assert f"torch=={pinned} " in (EXAMPLES.parent / "Makefile").read_text()
    quoted = [line.strip() for line in measured.strip().splitlines()]
    printed = [line.strip() for line in out.strip().splitlines()]
    numbers = tuple([[float(n) for n in NUMBER.findall(line)] for line in text] for text in (quoted, printed))
    quoted, printed = ([NUMBER.sub("#", line) for line in text] for text in (quoted, printed))
    assert quoted and quoted == printed, (quoted, out)
    if torch.__version__.split("+")[0] == pinned:
        pairs = [(q, p) for qs, ps in zip(*numbers, strict=True) for q, p in zip(qs, ps, strict=True)]
        assert all(math.isclose(q, p, rel_tol=0.01, abs_tol=0.01) for q, p in pairs), (numbers, out)
