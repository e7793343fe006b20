"""emarule: scale every hyperparameter, the model-EMA momentum included, when the batch size changes.

Reproduces Busbridge et al., "How to Scale Your EMA" (NeurIPS 2023).

The stable Python surface is `__all__` (README, "Python API"; docs/api.md):

    plan = emarule.scale(spec, kappa)                  # every value scaled, with its rule
    ema = emarule.ModelEma(model, rho, base_batch_size=B)
    ema.update(model, batch_size=B_now)                # applies rho ** (B_now / B)
    now = emarule.plan_at(plan, samples_seen, samples_per_epoch)   # Progressive Scaling
    tracker = emarule.PowerEma(model, (0.05, 0.10), snapshot_every=N)   # post-hoc EMA (emarule.engine.posthoc)

`import emarule` imports nothing but the errors: the rest of `__all__` is imported on first use, so that
the command line (which imports this package first) starts fast and `ModelEma` alone brings in torch.
"""

from typing import TYPE_CHECKING

from emarule.errors import ScalingError, UserError

if TYPE_CHECKING:  # for type checkers and editors; at run time `__getattr__` below imports them
    from emarule.api import plan_at, scale
    from emarule.engine.ema import ModelEma
    from emarule.engine.posthoc import PowerEma
    from emarule.scaling import Plan, Scaled

__version__ = "0.1.0"

__all__ = ["ModelEma", "Plan", "PowerEma", "Scaled", "ScalingError", "UserError", "plan_at", "scale"]


# name -> module that defines it, imported on first access
_LAZY = {"plan_at": "emarule.api", "scale": "emarule.api", "Plan": "emarule.scaling", "Scaled": "emarule.scaling",
         "ModelEma": "emarule.engine.ema", "PowerEma": "emarule.engine.posthoc"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'emarule' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
