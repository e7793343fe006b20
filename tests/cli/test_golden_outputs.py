"""`plan`, `table` and `limits` print exactly the bytes frozen in tests/data/golden/.

The files were written before the package layout was last restructured; a change of layout must not change a byte.
A deliberate change of output rewrites them: `python tests/cli/test_golden_outputs.py` (then review the diff).
"""

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app

GOLDEN = Path(__file__).parents[1] / "data" / "golden"
EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[2] / "emarule" / "experiments").glob("*.yaml"))

CASES = {f"plan-{e}-{k}": ["plan", e, "--kappa", k] for e in EXPERIMENTS for k in ("2", "8")}
CASES |= {f"plan-{e}-4-json": ["plan", e, "--kappa", "4", "--format", "json"] for e in EXPERIMENTS}
CASES |= {
    "plan-byol-r18-batch-size": ["plan", "byol-r18", "--batch-size", "8192"],
    "plan-byol-r18-progressive": ["plan", "byol-r18", "--kappa", "8", "--progressive", "step:30"],
    "plan-byol-r18-tiny-yaml": ["plan", "byol-r18", "--kappa", "8", "--preset", "tiny", "--format", "yaml"],
    "plan-byol-vit-verbose": ["plan", "byol-vit", "--kappa", "6", "--verbose"],
    "plan-polyak-no-rule": ["plan", "polyak-r50", "--kappa", "4", "--no-ema-rule"],
    "plan-ctc-linear": ["plan", "ctc-polyak", "--kappa", "4", "--ema-rule", "linear"],
    "table-momenta": ["table", "momenta"],
    "table-lr": ["table", "lr"],
    "table-momenta-csv": ["table", "momenta", "--format", "csv"],
    "table-lr-adam-markdown": ["table", "lr", "--lr", "0.1", "--optimizer", "adam", "--format", "markdown"],
    "table-momenta-own": ["table", "momenta", "--momentum", "0.996", "-B", "1024", "--batch-sizes", "1024,4096"],
    "limits-f32": ["limits", "--momentum", "0.9999", "--batch-size", "256"],
    "limits-bf16": ["limits", "--momentum", "0.99", "--batch-size", "4096", "--dtype", "bfloat16"],
    "limits-f16-json": ["limits", "--momentum", "0.996", "--batch-size", "1024", "--dtype", "float16", "-f", "json"],
}


def output(args: list[str]) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_frozen(name):
    assert output(CASES[name]) == (GOLDEN / f"{name}.txt").read_text(encoding="utf-8"), CASES[name]


def test_every_golden_file_has_its_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, args in CASES.items():
        (GOLDEN / f"{name}.txt").write_text(output(args), encoding="utf-8")
    print(f"wrote {len(CASES)} files to {GOLDEN}", file=sys.stderr)
