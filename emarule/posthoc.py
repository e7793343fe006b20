"""`from emarule.posthoc import reconstruct, solve` (docs/model-ema.md) keeps working; the code: engine/posthoc.py."""

from emarule.engine.posthoc import PowerEma, reconstruct, solve

__all__ = ["PowerEma", "reconstruct", "solve"]
