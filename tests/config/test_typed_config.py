"""The typed config (emarule/config/typed.py): the spec read as `cfg.section.key`, defaults from the schema."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emarule.config.keys import rows
from emarule.config.load import experiment_names, load_spec
from emarule.config.schema import schema_for, value
from emarule.config.typed import Section, typed

ROOT = Path(__file__).resolve().parents[2]


def read(cfg: Section, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("name", experiment_names())
def test_every_key_reads_what_value_reads_with_lists_as_tuples(name):
    spec = load_spec(name, preset="tiny")
    cfg = typed(spec)
    keys = [k for k, _ in rows(schema_for(spec["task"])) if k != "presets"]
    assert len(keys) > 40
    for key in keys:
        want = value(spec, key)
        want = tuple(tuple(x) if isinstance(x, list) else x for x in want) if isinstance(want, list) else want
        assert read(cfg, key) == want, key
        assert not isinstance(read(cfg, key), list), key
    assert cfg.name == spec["name"] and cfg.preset == spec["preset"] and cfg.source == spec["source"]
    assert not {part for k in keys for part in k.split(".")} & set(vars(Section))  # no key hidden by a method


def test_defaults_fill_what_the_spec_leaves_out():
    cfg = typed({"task": "byol", "batch": {"size": 256}, "data": {"image_size": 64}})
    assert cfg.data.image_size == 64 and cfg.data.num_classes == 10 and cfg.batch.unit == "samples"
    assert cfg.ema.also == () and cfg.eval.every_epochs == 1.0 and cfg.schedule.gamma == 0.1
    assert cfg.model.width is None  # a key with no default reads None
    dino = typed({"task": "dino"})
    assert dino.data.image_size == 224 and dino.data.global_scale == (0.4, 1.0)


def test_a_null_that_means_the_default_reads_the_default():
    spec = load_spec("polyak-r50", preset="tiny", overrides=["eval.every_epochs=null",
                                                              "data.train_samples=null"])
    assert spec["eval"]["every_epochs"] is None  # the record keeps what was given
    cfg = typed(spec)
    assert cfg.eval.every_epochs == 1.0 and cfg.data.train_samples == 4096
    assert value(spec, "eval.every_epochs") == 1.0
    # a null that means "none" stays None
    assert typed(load_spec("byol-r18", preset="tiny", overrides=["optimizer.grad_clip=null"])).optimizer.grad_clip \
        is None


def test_an_unknown_key_names_its_path_and_what_is_there():
    cfg = typed(load_spec("byol-r18", preset="tiny"))
    with pytest.raises(AttributeError, match=r"data\.nope: not a key of a 'byol' spec; data has: .*num_classes"):
        _ = cfg.data.nope
    with pytest.raises(AttributeError, match=r"toy: not a section of a 'byol' spec; its sections and keys: "
                                             r".*batch.*probe"):
        _ = cfg.toy
    assert not hasattr(cfg.data, "nope") and "data" in cfg and "toy" not in cfg and "num_classes" in cfg.data


def test_read_only_at_every_level():
    cfg = typed(load_spec("byol-r18", preset="tiny"))
    with pytest.raises(AttributeError, match=r"data\.num_classes: the config is read-only"):
        cfg.data.num_classes = 3
    with pytest.raises(AttributeError, match="read-only"):
        cfg.data = None
    with pytest.raises(AttributeError, match="read-only"):
        del cfg.ema.momentum
    assert cfg.data.num_classes == 10


def test_a_section_is_true_only_when_the_spec_gives_it():
    polyak, pl = typed(load_spec("ctc-polyak", preset="tiny")), typed(load_spec("ctc-pseudo-label", preset="tiny"))
    assert not polyak.pseudo_label and pl.pseudo_label
    assert polyak.pseudo_label.labeled_ratio == 1 and polyak.pseudo_label.start == "auto"  # defaults either way
    assert not typed(load_spec("byol-r18", preset="tiny")).progressive


def test_pickles_and_compares_by_value():
    cfg = typed(load_spec("dino-vit", preset="tiny"))
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and again.data.global_scale == cfg.data.global_scale
    assert cfg.as_dict()["data"]["global_scale"] == list(cfg.data.global_scale)


def test_the_run_context_carries_it_and_no_untyped_side_channel(tmp_path):
    from emarule.engine.context import RunContext
    from emarule.scaling import plan

    spec = load_spec("byol-r18", preset="tiny")
    ctx = RunContext(spec=spec, kappa=2.0, ema_rule="exponential", plan=plan(spec, 2.0), out=tmp_path)
    assert ctx.cfg == typed(spec) and ctx.cfg.data.num_classes == 10
    assert not hasattr(ctx, "extra") and ctx.checkpoint_every_epochs == 1.0 and ctx.num_workers is None


def test_the_toy_task_sets_its_checkpoint_cadence_on_the_context(tmp_path):
    from emarule.engine.context import RunContext
    from emarule.scaling import plan
    from emarule.tasks import toy

    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump({
        "name": "toy", "task": "toy", "batch": {"size": 16}, "optimizer": {"name": "sgd", "lr": 0.05},
        "schedule": {"epochs": 1}, "ema": {"momentum": 0.9},
        "toy": {"samples": 32, "checkpoint_every_epochs": 0.5, "threads": 1, "quiet": True}}))
    spec = load_spec(path=p)
    ctx = RunContext(spec=spec, kappa=1.0, ema_rule="exponential", plan=plan(spec, 1.0), out=tmp_path / "run")
    parts = toy.build(ctx)
    assert ctx.checkpoint_every_epochs == 0.5 and ctx.quiet and len(parts.train_set) == 32


def test_the_typed_config_does_not_import_torch():
    code = ("import sys; from emarule.config.load import load_spec; from emarule.config.typed import typed; "
            "import emarule.engine.context; typed(load_spec('byol-r18')); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_tasks_and_the_engine_read_the_typed_config_not_spec_keys():
    """No `get(spec, "section.key")` / `value(spec, "section.key")` left where a run reads its spec."""
    import ast

    from emarule.config.schema import COMMON
    from emarule.registry import REGISTRY

    sections = set(COMMON) | {s for t in REGISTRY.values() for s in t.config}
    found = []
    for folder in ("tasks", "engine", "studies", "vision", "speech"):
        for f in sorted((ROOT / "emarule" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("get", "value") and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                        and node.args[1].value.split(".")[0] in sections):
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert not found, "read these through ctx.cfg:\n" + "\n".join(found)
