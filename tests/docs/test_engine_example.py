"""The example task of docs/engine.md runs as written through the shared loop, and the run summary of
docs/cli.md is what `emarule run` prints (the engine's documentation stays true)."""

import json
import re

import pytest
import torch

from emarule.engine.loop import train
from engine_util import ROOT, make_ctx, toy_spec


def readme_example() -> str:
    text = (ROOT / "docs" / "engine.md").read_text()
    after = text[text.index("A complete task, a linear regression"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_example_task_trains_logs_both_models_and_checkpoints_its_state(tmp_path):
    torch.set_num_threads(1)
    namespace: dict = {}
    exec(compile(readme_example(), "docs/engine.md example", "exec"), namespace)
    ctx = make_ctx(tmp_path, toy_spec(**{"schedule.epochs": 2, "batch.size": 32}), kappa=2)
    final = train(ctx, namespace["build"](ctx))  # what the runner does with a task's builder
    assert {"val_mse", "ema_val_mse"} <= set(final) and final["steps"] == 16
    rows = [json.loads(x) for x in (ctx.out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "train" and "mse" in rows[0] and "teacher_mean" not in rows[0]
    ck = torch.load(ctx.out / "checkpoint.pt", weights_only=False)
    assert ck["task_state"]["c"].abs().item() > 0  # the center moved, once per step, and was saved


NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def test_the_readme_run_summary_is_what_run_prints(tmp_path, monkeypatch, capsys):
    """The summary under docs/cli.md's "What a run prints and leaves" comes from the command it names: the same lines,
    metric names, paths and headline; metric values and wall time are the machine's, so only their
    places are compared."""
    from emarule.cli.main import main

    text = (ROOT / "docs" / "cli.md").read_text()
    section = text[text.index("### What a run prints and leaves"):]
    command = re.search(r"`(emarule run [^`]+)`:", section).group(1)
    shown = re.search(r"```text\n(.*?)```", section, re.S).group(1).strip().splitlines()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(SystemExit) as e:
        main(command.split()[1:])
    assert e.value.code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == shown[0]  # the headline: directory, κ, rule, seed, epoch, step, samples
    assert [NUMBER.sub("N", x) for x in printed[1:]] == [NUMBER.sub("N", x) for x in shown[1:]]
