"""The README's example task runs as written through the shared loop (the engine's documentation stays true)."""

import json
import re

import torch

from engine_util import ROOT, make_ctx, toy_spec


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index("A complete task, a linear regression"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_example_task_trains_logs_both_models_and_checkpoints_its_state(tmp_path):
    torch.set_num_threads(1)
    namespace: dict = {}
    exec(compile(readme_example(), "README example", "exec"), namespace)
    ctx = make_ctx(tmp_path, toy_spec(**{"schedule.epochs": 2, "batch.size": 32}), kappa=2)
    final = namespace["run"](ctx)
    assert {"val_mse", "ema_val_mse"} <= set(final) and final["steps"] == 16
    rows = [json.loads(x) for x in (ctx.out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "train" and "mse" in rows[0] and "teacher_mean" not in rows[0]
    ck = torch.load(ctx.out / "checkpoint.pt", weights_only=False)
    assert ck["task_state"]["c"].abs().item() > 0  # the center moved, once per step, and was saved
