"""The scaling core: pure Python, no torch. `plan(spec, κ)` is the one entry point."""

from emarule.scaling.plan import Plan, Scaled, kappa_from, plan, scale
from emarule.scaling.progressive import BatchSchedule, Stage

__all__ = ["Plan", "Scaled", "plan", "scale", "kappa_from", "BatchSchedule", "Stage"]
