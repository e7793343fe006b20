"""`emarule table`'s options checked and turned into the reference table they ask for."""

from __future__ import annotations

from emarule.errors import UserError
from emarule.request.resolve import number, numbers, whole


def reference_table(kind: str, base_batch_size: str | None, momentum: list[str] | None, lr: list[str] | None,
                    optimizer: str | None, batch_sizes: str | None):
    """The `momenta` or `lr` table: the paper's, or one of the given base values (each option's text as given)."""
    from emarule.scaling import tables

    rows = whole(numbers(batch_sizes, "--batch-sizes", "256,1024,4096") or tables.PAPER_BATCH_SIZES,
                 "--batch-sizes")
    base = number(base_batch_size, "--base-batch-size")
    if base is not None:
        whole([base], "--base-batch-size")
    if optimizer is not None and not lr:
        raise UserError("--optimizer picks the lr rule for --lr values; give --lr too (`emarule table lr --lr 0.1 "
                        "--optimizer adam`)")
    if kind == "momenta":
        if lr:
            raise UserError("--lr goes with `emarule table lr`")
        if momentum:
            cols = []
            for m in momentum:
                try:
                    rho = float(m)
                except ValueError:
                    raise UserError(f"--momentum must be a number, got {m!r}") from None
                if not 0.0 <= rho < 1.0:
                    raise UserError(f"--momentum must be in [0, 1), got {m!r}")
                cols.append((base or 256, rho))
            t = tables.momentum_table(cols, rows)
        elif base is not None:
            raise UserError("--base-batch-size needs --momentum values to go with it")
        else:
            t = tables.momentum_table(batch_sizes=rows)
    else:
        if momentum:
            raise UserError("--momentum goes with `emarule table momenta`")
        if lr:
            cols = [(base or 256, number(v, "--lr"), optimizer or "sgd") for v in lr]
            t = tables.lr_table(cols, rows)
        elif base is not None:
            raise UserError("--base-batch-size needs --lr values to go with it")
        else:
            t = tables.lr_table(batch_sizes=rows)
    return t
