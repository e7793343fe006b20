"""The paper's reference tables (Appendix C.3): scaled learning rates and scaled EMA momenta.

Defaults reproduce the paper's two tables column for column; values are rounded to five
decimal places with trailing zeros dropped, as the paper prints them. Momenta are raised to κ
with ρ stored in float32 (the training dtype): that is how the paper's table was computed —
in float64 three of its entries (0.999 at 16384 and 65536, 0.99 at 65536) differ in the fifth
decimal. Values of your own (`--momentum`, `--lr`) are computed in float64 and shown to five
decimals or to at least three significant digits (`significant`): five decimals alone print an lr
of 1e-6 as 0, and float32 makes ρ = 0.99999999 exactly 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emarule.errors import ScalingError
from emarule.scaling import rules
from emarule.scaling.limits import round_to

PAPER_BATCH_SIZES = [32 * 2**i for i in range(12)]  # 32 … 65536

# (base batch, base value, optimizer) in the paper's column order
PAPER_LR_COLUMNS = [(256, 0.1, "sgd"), (256, 0.3, "sgd"), (512, 0.1, "sgd"),
                    (256, 1e-3, "adam"), (4096, 4.8, "adam"), (4096, 1e-3, "adam")]
PAPER_MOMENTUM_COLUMNS = [(256, 0.9999), (256, 0.999), (256, 0.99),
                          (4096, 0.996), (4096, 0.992), (4096, 0.99), (4096, 0.97)]


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list]  # first column: batch size
    bold: set  # (row, column) cells holding a reference value
    paper: bool = True  # the paper's own columns: shown with its rounding (paper_round), else `significant`


def paper_round(x: float) -> str:
    s = f"{round(x, 5):.5f}".rstrip("0").rstrip(".")
    return s if s not in ("-0", "") else "0"


def significant(x: float, digits: int = 3) -> str:
    """The paper's five decimals, or more where five would show fewer than `digits` significant digits of x
    (an lr of 1e-6 is not 0) or, for a momentum near 1, of 1 − x (0.99999999 is not 1)."""
    if x == 0 or not math.isfinite(x):
        return paper_round(x) if x == 0 else str(x)
    if abs(x) < 1e-4:
        return f"{x:.{digits}g}"
    decimals = max(5, digits - 1 - math.floor(math.log10(abs(x))))
    if 0.5 <= x < 1:
        decimals = max(decimals, digits - 1 - math.floor(math.log10(1 - x)))
    return f"{x:.{decimals}f}".rstrip("0").rstrip(".")


def _finite(headers: list[str], rows: list[list]) -> None:
    """A value past float64's range is no hyperparameter: refused, naming its column and row."""
    for row in rows:
        for head, v in zip(headers[1:], row[1:], strict=True):
            if not math.isfinite(v):
                raise ScalingError(f"{head} scales to {v} at batch size {row[0]:g}, past float64's range; give a "
                                   f"smaller value or smaller --batch-sizes")


def momentum_table(columns=PAPER_MOMENTUM_COLUMNS, batch_sizes=PAPER_BATCH_SIZES) -> Table:
    headers = ["batch_size"] + [f"rho={rho!r}@B={b}" for b, rho in columns]  # repr: 0.99999999 is not 1
    rows, bold = [], set()
    paper = columns == PAPER_MOMENTUM_COLUMNS
    for i, bs in enumerate(batch_sizes):
        row = [bs]
        for j, (b, rho) in enumerate(columns):
            row.append(rules.ema_exponential(round_to(rho, "float32") if paper else rho, bs / b))
            if bs == b:
                bold.add((i, j + 1))
        rows.append(row)
    _finite(headers, rows)
    return Table("Scaled EMA momenta ρ̂ = ρ^κ (κ = B̂/B)", headers, rows, bold, paper)


def lr_table(columns=PAPER_LR_COLUMNS, batch_sizes=PAPER_BATCH_SIZES) -> Table:
    headers = ["batch_size"] + [f"{'sgd' if o == 'sgd' else 'adam'} lr={lr!r}@B={b}" for b, lr, o in columns]
    rows, bold = [], set()
    for i, bs in enumerate(batch_sizes):
        row = [bs]
        for j, (b, lr, opt) in enumerate(columns):
            fn = rules.lr_linear if opt == "sgd" else rules.lr_sqrt
            row.append(fn(lr, bs / b))
            if bs == b:
                bold.add((i, j + 1))
        rows.append(row)
    _finite(headers, rows)
    return Table("Scaled learning rates: SGD η̂ = κη, RMSProp/Adam η̂ = √κ η", headers, rows, bold,
                 columns == PAPER_LR_COLUMNS)
