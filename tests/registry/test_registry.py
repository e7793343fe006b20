"""The task registry: every list of tasks derives from it, and a new family is one module, one registry line
and one YAML (a toy family in a temporary package runs end to end through `emarule run`)."""

import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.config.schema import num
from emarule import registry
from emarule.registry import TaskSpec

FAMILY = '''
import torch

from emarule.engine.interface import Evaluation, TaskParts


def build(ctx):
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(96, 4, generator=g)
    y = x.sum(1, keepdim=True) * ctx.spec["mini"]["scale"]
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(4, 1)

    def loss(model, teacher, batch, now):
        xb, yb = batch
        value = (model(xb) - yb).pow(2).mean()
        return value, {"mini_mse": value.item()}

    def score(net, batch, now):
        xb, yb = batch
        return {"sse": (net(xb) - yb).pow(2).sum(), "n": len(yb)}

    val = Evaluation(data=list(zip(x[:32], y[:32])), score=score, finish=lambda s: {"mini_val": s["sse"] / s["n"]})
    return TaskParts(model=model, train_set=list(zip(x, y)), loss=loss, evaluations=[val], progress_metric="mini_mse")
'''

SPEC = """
name: mini
task: mini
precision: fp32
batch: {size: 16}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0}
schedule: {kind: constant, epochs: 2}
ema: {momentum: 0.9}
mini: {scale: 2.0}
presets:
  tiny: {schedule.epochs: 1}
"""


@pytest.fixture
def mini_family(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg" / "minifamily"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mini.py").write_text(textwrap.dedent(FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # the line below, undone after the test
    registry.register(TaskSpec("mini", "training", "minifamily.mini", "build", {"mini": {"scale": num()}},
                               metrics=("mini_mse", "mini_val"), headline="ema_mini_val"))
    spec = tmp_path / "mini.yaml"
    spec.write_text(SPEC)
    yield spec
    sys.modules.pop("minifamily.mini", None)
    sys.modules.pop("minifamily", None)


def test_a_new_family_is_one_module_one_registry_line_and_one_yaml(mini_family, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--spec", str(mini_family), "--preset", "tiny", "--kappa", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in rows if x["kind"] == "train"]
    assert train and all("mini_mse" in x for x in train) and train[0]["batch_size"] == 32
    assert any("ema_mini_val" in x for x in rows) and any("mini_val" in x for x in rows)
    assert json.loads((out / "hparams.json").read_text())["spec"]["task"] == "mini"
    # its own keys are checked like any task's, with the key path named
    bad = CliRunner().invoke(app, ["plan", "--spec", str(mini_family), "--kappa", "2", "--set", "mini.scal=1"])
    assert bad.exit_code == 2 and "mini.scal: unknown key" in bad.output
    # and `sweep --metric` knows what it logs before anything trains
    bad = CliRunner().invoke(app, ["sweep", "--spec", str(mini_family), "--kappas", "1,2", "--metric", "nope",
                                   "--out", str(tmp_path / "sw")])
    assert bad.exit_code == 2 and "mini_mse" in bad.output and not (tmp_path / "sw").exists()


def test_every_list_of_tasks_derives_from_the_registry():
    import emarule.tasks
    from emarule.request import checks

    assert emarule.tasks.RUNNABLE_TASKS == tuple(registry.REGISTRY)
    assert checks.STUDIES == {"parabola", "precision"}
    assert set(checks.TASK_METRICS) == {"byol", "dino", "polyak", "ctc", "toy"}  # dino's metrics are known too
    assert checks.DEFAULT_SOURCE == {"byol": "cifar10", "dino": "cifar10", "polyak": "imagenet",
                                     "ctc": "librispeech"}
    assert registry.preferred_metrics() == ("probe_top1", "ema_top1", "ema_wer", "top1", "wer", "val_top1",
                                            "test_top1", "loss")
    assert registry.training_losses() == ("byol_loss", "loss")


def test_a_name_registered_twice_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(TaskSpec("byol", "training", "elsewhere", "build"))
    with pytest.raises(ValueError, match="kind must be"):
        TaskSpec("x", "trainin", "m", "build")
