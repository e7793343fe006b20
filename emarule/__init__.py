"""emarule: scale every hyperparameter, the model-EMA momentum included, when the batch size changes.

Reproduces Busbridge et al., "How to Scale Your EMA" (NeurIPS 2023).

The stable Python surface is `__all__` (README, "Python API"; docs/api.md):

    plan = emarule.scale(spec, kappa)                  # every value scaled, with its rule
    ema = emarule.ModelEma(model, rho, base_batch_size=B)
    ema.update(model, batch_size=B_now)                # applies rho ** (B_now / B)
    now = emarule.plan_at(plan, samples_seen, samples_per_epoch)   # Progressive Scaling
    tracker = emarule.PowerEma(model, (0.05, 0.10), snapshot_every=N)   # post-hoc EMA (emarule.engine.posthoc)

`import emarule` does not import torch: `ModelEma` and `PowerEma` are imported on first use.
"""

from emarule.api import plan_at, scale
from emarule.errors import ScalingError, UserError
from emarule.scaling import Plan, Scaled

__version__ = "0.1.0"

__all__ = ["ModelEma", "Plan", "PowerEma", "Scaled", "ScalingError", "UserError", "plan_at", "scale"]


def __getattr__(name: str):
    if name == "ModelEma":  # torch is imported here, not by `import emarule`
        from emarule.engine.ema import ModelEma

        return ModelEma
    if name == "PowerEma":
        from emarule.engine.posthoc import PowerEma

        return PowerEma
    raise AttributeError(f"module 'emarule' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
