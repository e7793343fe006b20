"""One runner for every task: a training task's parts go through the loop, a study runs itself.

The record (`emarule.tasks.registry.TaskSpec`) is passed in: the engine never imports the tasks.
"""

from __future__ import annotations

from emarule.engine.context import RunContext


def run(ctx: RunContext, spec) -> dict:
    """`train(ctx, spec.build(ctx))` for a training task; a study writes its run directory itself."""
    if spec.kind == "study":
        from emarule.engine.runlock import lock_dir

        with lock_dir(ctx.out, "run"):
            return spec.build(ctx)
    from emarule.engine.loop import train

    return train(ctx, spec.build(ctx))
