"""The task families: one module each, registered in `registry` (the one list of them).

A training task's module exposes `build(ctx) -> TaskParts`, which the engine trains
(`emarule.engine.runner`); a study's exposes `run(ctx) -> dict`. Only the task that runs is imported.
"""

from __future__ import annotations

from emarule.engine.context import RunContext
from emarule.errors import UserError
from emarule import registry


def __getattr__(name: str):
    if name == "RUNNABLE_TASKS":  # the registered names, read at use so a family added later is in it
        return registry.names()
    raise AttributeError(f"module 'emarule.tasks' has no attribute {name!r}")


def _tasks() -> dict:
    """Every registered task's builder, each module imported: what `emarule run` can call."""
    return {name: spec.load() for name, spec in registry.REGISTRY.items()}


def build_parts(ctx: RunContext):
    """A training task's parts (model, data, loss) without training: for checks that need the data."""
    return registry.REGISTRY[ctx.spec["task"]].load()(ctx)


def run_task(ctx: RunContext) -> dict:
    from emarule.engine.runner import run

    task = ctx.spec["task"]
    spec = registry.lookup(task)
    if spec is None:
        ready = ", ".join(sorted(registry.names())) or "none yet"
        raise UserError(f"{ctx.experiment}: the {task!r} task cannot run yet (runnable tasks: {ready}); "
                        f"`emarule plan {ctx.experiment} --kappa K` shows its scaled recipe")
    return run(ctx, spec)
