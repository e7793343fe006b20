"""The spec and κ a command names, resolved to a plan; the numbers its options give, checked as they are read."""

from __future__ import annotations

import math

from emarule.errors import UserError

EXPONENTIAL = "exponential"  # the EMA rule a command applies unless told otherwise


def number(text: str | None, what: str) -> float | None:
    """Parse a float given as text so that 'abc', 'nan' and 'inf' get our one-line error."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise UserError(f"{what} must be finite and > 0, got {text!r}")
    return v


def numbers(text: str | None, what: str, example: str = "1,2,4") -> list[float] | None:
    """Comma-separated numbers; an empty list or an empty item ('2,,4', '2,4,') is an error."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise UserError(f"{what} is empty; give comma-separated numbers, e.g. {what} {example}")
    if not all(items):
        raise UserError(f"{what} {text!r}: an empty item; give numbers separated by commas, e.g. {example}")
    return [number(t, what) for t in items]


def whole(values: list[float], what: str) -> list[int]:
    bad = [v for v in values if not float(v).is_integer()]
    if bad:
        raise UserError(f"{what} {bad[0]:g}: batch sizes count samples; give whole numbers")
    # from 2^53 a float64 no longer holds every whole number (2^53 + 1 reads as 2^53), so the count it reads may
    # not be the one written
    huge = [v for v in values if v >= 2**53]
    if huge:
        raise UserError(f"{what} {huge[0]:g}: at or past 2^53, where float64 stops counting whole samples "
                        f"exactly; give smaller batch sizes")
    return [int(v) for v in values]


def resolve(experiment, spec, preset, overrides, kappa, batch_size, no_ema_rule, ema_rule, progressive,
            batch_option: bool = True, batch_multiple=None, baseline: bool = False):
    """Spec + κ + rule + progressive schedule → (spec, κ, rule name or None, progressive dict, plan).
    `batch_option`: the command offers --batch-size (sweep and reproduce take κ only). `batch_multiple(spec)`:
    what a run's ramp batches are multiples of (`emarule.request.checks.batch_multiple`; None: 1). `baseline`: a
    sweep's κ=1 run, whose `constant` schedule is the sweep's, so the overrides meant for its other runs stand."""
    from emarule.request import checks
    from emarule.scaling import kappa_from, plan
    from emarule.scaling import progressive as prog
    from emarule.config.load import load_spec

    ema_rule = getattr(ema_rule, "value", ema_rule)  # the command line's enum, or its text
    if no_ema_rule and ema_rule is not None:
        raise UserError(f"--no-ema-rule and --ema-rule {ema_rule} contradict each other; give one of them")
    s = load_spec(experiment, spec, preset, overrides or [])
    schedule = prog.parse(progressive) if progressive is not None else None
    _no_schedule_sets(schedule, overrides or [], baseline)
    b = number(batch_size, "--batch-size")
    k = kappa_from(s, number(kappa, "--kappa"), b)
    rule = None if no_ema_rule else (ema_rule or EXPONENTIAL)
    # Only a command-line schedule is passed on: `plan` itself takes the spec's, or skips it (κ < 1).
    p = plan(s, k, rule, schedule, batch_multiple(s) if batch_multiple is not None else 1)
    checks.whole_batches(s, p, b, runs=False, batch_option=batch_option)
    return s, k, rule, p.progressive, p


def _no_schedule_sets(schedule: dict | None, overrides: list[str], baseline: bool = False) -> None:
    """--progressive replaces the spec's schedule, so a --set of its shape (progressive.epoch, .from_kappa, ...)
    would be dropped unseen: refused, `--progressive constant` included. progressive.batch_multiple (the processes
    a ramp splits over) is kept. A sweep's baseline runs constant beside the sets its other runs take."""
    if schedule is None or baseline:
        return
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if (key == "progressive" or key.startswith("progressive.")) and key != "progressive.batch_multiple":
            raise UserError(f"--set {key} and --progressive both give the schedule, and --progressive replaces the "
                            f"spec's; put it in --progressive (e.g. incremental:START,DELTA_B,EVERY,FROM_KAPPA) or "
                            f"drop --progressive and set progressive.kind too")
