"""One module per paper section, listed explicitly (never imported by string).

Each task exposes `run(ctx: RunContext) -> dict` and reads only `ctx`; tasks whose
full-size recipe is exact but not yet runnable here are absent, and `run_task` says so.
"""

from __future__ import annotations

from emarule.engine.context import RunContext
from emarule.errors import UserError

# The runnable task names, known without importing torch (`emarule list`, the CLI's checks).
# `_tasks()` maps exactly these names; a test holds the two together.
RUNNABLE_TASKS = ("parabola", "precision", "byol", "dino", "polyak", "ctc", "toy")


def _tasks() -> dict:
    # Imported here, on use: `emarule run` is the only command that may load torch.
    from emarule.tasks import byol, ctc, dino, polyak, toy
    from emarule.studies.parabola import run as parabola
    from emarule.studies import precision

    return {
        "parabola": parabola.run,  # §3.1, App. E.1
        "precision": precision.run,  # App. numerical stability
        "byol": byol.run,  # §3.4, App. F (byol-r18, byol-vit, byol-r50-lars)
        "dino": dino.run,  # App. F.8 (dino-vit)
        "polyak": polyak.run,  # §3.2, App. E.2–E.3 (polyak-r50)
        "ctc": ctc.run,  # §3.2, §3.3, App. G (ctc-polyak, ctc-pseudo-label)
        "toy": toy.run,  # the engine's test task (no experiments/*.yaml)
    }


def build_parts(ctx: RunContext):
    """A training task's parts (model, data, loss) without training: for checks that need the data."""
    from emarule.tasks import byol, ctc, dino, polyak, toy

    builders = {"byol": byol.build, "dino": dino.build, "polyak": polyak.build, "ctc": ctc.build,
                "toy": toy.make_parts}
    return builders[ctx.spec["task"]](ctx)


def run_task(ctx: RunContext) -> dict:
    tasks = _tasks()
    task = ctx.spec["task"]
    if task not in tasks:
        ready = ", ".join(sorted(tasks)) or "none yet"
        raise UserError(f"{ctx.experiment}: the {task!r} task cannot run yet (runnable tasks: {ready}); "
                        f"`emarule plan {ctx.experiment} --kappa K` shows its scaled recipe")
    if task in ("parabola", "precision"):  # studies write their run directory themselves
        from emarule.engine.runlock import lock_dir

        with lock_dir(ctx.out, "run"):
            return tasks[task](ctx)
    return tasks[task](ctx)  # the training loop locks its run directory once its checks pass
