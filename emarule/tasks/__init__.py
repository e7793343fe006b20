"""One module per paper section, listed explicitly (never imported by string).

Each task exposes `run(ctx: RunContext) -> dict` and reads only `ctx`; tasks whose
full-size recipe is exact but not yet runnable here are absent, and `run_task` says so.
"""

from __future__ import annotations

from emarule.context import RunContext
from emarule.errors import UserError


def _tasks() -> dict:
    # Imported on use: `emarule run` is the only command that may load torch.
    tasks: dict = {}
    from emarule.tasks import toy  # engine smoke/test task (no experiments/*.yaml)

    tasks["toy"] = toy.run
    from emarule.tasks import byol

    tasks["byol"] = byol.run
    from emarule.tasks import parabola, precision

    tasks.update(parabola=parabola.run, precision=precision.run)
    return tasks


def run_task(ctx: RunContext) -> dict:
    tasks = _tasks()
    task = ctx.spec["task"]
    if task not in tasks:
        ready = ", ".join(sorted(tasks)) or "none yet"
        raise UserError(f"{ctx.experiment}: the {task!r} task cannot run yet (runnable tasks: {ready}); "
                        f"`emarule plan {ctx.experiment} --kappa K` shows its scaled recipe")
    return tasks[task](ctx)
