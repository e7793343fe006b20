"""emarule: scale every hyperparameter, the model-EMA momentum included, when the batch size changes.

Reproduces Busbridge et al., "How to Scale Your EMA" (NeurIPS 2023).

The stable Python surface is `__all__` (README, "Use it in your own code"):

    plan = emarule.scale(spec, kappa)                  # every value scaled, with its rule
    ema = emarule.ModelEma(model, rho, base_batch_size=B)
    ema.update(model, batch_size=B_now)                # applies rho ** (B_now / B)
    now = emarule.plan_at(plan, samples_seen, samples_per_epoch)   # Progressive Scaling
    tracker = emarule.PowerEma(model, (0.05, 0.10), snapshot_every=N)   # post-hoc EMA (emarule.engine.posthoc)

`import emarule` does not import torch: `ModelEma` and `PowerEma` are imported on first use.
"""

import sys

from emarule.api import plan_at, scale
from emarule.errors import ScalingError, UserError
from emarule.scaling import Plan, Scaled

# Module paths that moved but that the docs still show users importing (README's worked task, docs/model-ema.md):
# each old name is the new module, imported when first asked for. No file sits at the old path, so git follows
# the moves.
MOVED = {"emarule.train": "emarule.engine.loop", "emarule.tasks.parts": "emarule.engine.interface",
         "emarule.posthoc": "emarule.engine.posthoc"}


class _MovedModules:
    """A meta-path finder and loader whose module for an old name is the new module itself."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in MOVED:
            from importlib.machinery import ModuleSpec

            return ModuleSpec(name, _MovedModules)
        return None

    specs: dict = {}  # the new modules' own specs, which the import system overwrites with the old name's

    @staticmethod
    def create_module(spec):
        import importlib

        module = importlib.import_module(MOVED[spec.name])
        _MovedModules.specs[spec.name] = module.__spec__
        return module

    @staticmethod
    def exec_module(module):
        module.__spec__ = _MovedModules.specs[module.__spec__.name]


if not any(f is _MovedModules for f in sys.meta_path):
    sys.meta_path.append(_MovedModules)

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
