"""One runner for every task: a training task's parts go through the loop, a study runs itself.

The record (`emarule.registry.TaskSpec`) is passed in: the engine never imports the tasks.
"""

from __future__ import annotations

from emarule.engine.context import RunContext


def run(ctx: RunContext, spec) -> dict:
    """`train(ctx, spec.build(ctx))` for a training task; a study writes its run directory itself.

    The directory is locked before the task is built. The loop checks the directory (a checkpoint
    there, or none) before its own lock, which is this same hold: a second run that passed the
    command's checks while the first was starting is told the directory is in use, instead of
    judging a directory the first is writing in."""
    from emarule.engine import rundir
    from emarule.engine.runlock import lock_dir

    with lock_dir(ctx.out, "run"):
        if spec.kind == "study":
            rundir.check_study_dir(ctx.out, ctx.experiment, ctx.resume)
            from emarule.engine import distributed  # the launcher's environment, read without torch

            if distributed.is_main():
                ctx.say_warnings()
            return spec.build(ctx)
        from emarule.engine.loop import train

        return train(ctx, spec.build(ctx))
