"""The optional parts of emarule, one pip extra each (pyproject.toml), and the check a command makes for them.

The core (`import emarule`, ModelEma, PowerEma, scale, plan_at; the commands list, plan, table and limits) needs
torch, numpy, pyyaml, typer and rich. What runs an experiment needs more; each command names its extras before it
writes anything, so a missing one is one line naming the `pip install` that adds it, not an ImportError deep
inside a run. Torch-free: a module is looked for (importlib.util.find_spec), not imported.
"""

from __future__ import annotations

import importlib.util

from emarule.errors import UserError

# extra -> the modules emarule imports from it (import names, which are not always the package names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "vision": ("torchvision", "timm", "PIL", "sklearn", "threadpoolctl"),
    "speech": ("soundfile", "jiwer", "espeakng_loader"),
    "plots": ("matplotlib",),
    "wandb": ("wandb",),
    "slurm": ("submitit",),
    "gpu-augment": ("kornia",),  # emarule.vision.device_views checks it itself, naming the same install
}


class MissingExtra(UserError, ImportError):
    """A command or task needs an extra that is not installed; the message names the `pip install`."""


def absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module set to None
        return True


def missing(extras) -> dict[str, tuple[str, ...]]:
    """Each of `extras` that lacks a module, with the modules it lacks."""
    out = {}
    for extra in extras:
        lacking = tuple(m for m in EXTRAS[extra] if absent(m))
        if lacking:
            out[extra] = lacking
    return out


def install_hint(extras) -> str:
    return f"pip install 'emarule[{','.join(extras)}]'"


def require(what: str, extras) -> None:
    """Refuse `what` (e.g. "byol-r18", "compare's figure") when an extra it needs is not installed."""
    lacking = missing(extras)
    if lacking:
        names = " and ".join(lacking)
        modules = ", ".join(m for ms in lacking.values() for m in ms)
        raise MissingExtra(f"{what} needs emarule's {names} extra{'s' if len(lacking) > 1 else ''} ({modules}: not "
                           f"installed); {install_hint(lacking)}")
