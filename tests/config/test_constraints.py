"""What a spec's keys must agree on (emarule/config/constraints.py), and YAML values their tags cannot read."""

import pytest
import yaml

from emarule.config import constraints
from emarule.config.load import SpecShapeError, experiment_names, load_spec, read_yaml, spec_path, yaml_load


def test_every_experiment_and_preset_agrees_with_itself():
    for name in experiment_names():
        assert constraints.check(load_spec(name)) is None, name
        for preset in read_yaml(spec_path(name, None)).get("presets") or {}:
            assert constraints.check(load_spec(name, preset=preset)) is None, (name, preset)


@pytest.mark.parametrize("experiment,preset,sets,needle", [
    ("dino-vit", "tiny", {"model": {"heads": 3}}, "model.embed_dim 16 is not divisible by model.heads 3"),
    ("byol-vit", None, {"model": {"heads": 5}}, "vit_base_patch16_224's width 768"),
    ("ctc-polyak", "tiny", {"model": {"heads": 3}}, "model.dim 32 is not divisible by model.heads 3"),
    ("dino-vit", "tiny", {"model": {"patch_size": 5}}, "data.image_size 8 is not divisible by model.patch_size 5"),
    ("byol-vit", "tiny", {"model": {"patch_size": 3}}, "data.image_size 8 is not divisible by model.patch_size 3"),
    ("dino-vit", "tiny", {"data": {"local_size": 6}}, "data.local_size 6"),
    ("byol-r18", None, {"schedule": {"warmup_steps": 10}}, "warmup_steps and schedule.warmup_epochs are both set"),
    ("ctc-polyak", None, {"schedule": {"epochs": 3}}, "total_steps and schedule.epochs are both set"),
    ("byol-r18", None, {"schedule": {"milestones_epochs": [3]}}, "read only by schedule.kind multistep"),
    ("polyak-r50", None, {"schedule": {"milestones_epochs": [30, 30]}}, "must increase"),
])
def test_a_disagreement_is_named(experiment, preset, sets, needle):
    spec = load_spec(experiment, preset=preset)
    for section, keys in sets.items():
        spec[section].update(keys)
    assert needle in constraints.check(spec)


def test_the_local_crops_are_checked_only_where_there_are_some():
    spec = load_spec("dino-vit", preset="cpu")  # no local crops
    spec["data"]["local_size"] = 6
    assert constraints.check(spec) is None


@pytest.mark.parametrize("text,needle", [
    ("!!float abc", "not a valid float ('abc' under its !!float tag)"), ("a: !!int 1.5", "not a valid int"),
    ("a: [1, !!bool abc]", "not a valid bool"), ('!!float ""', "not a valid float"),
    ("!!timestamp abc", "not a valid timestamp"), ("2023-13-45", "reads as one"),
])
def test_a_value_its_tag_cannot_read_is_a_yaml_error_with_its_place(text, needle):
    with pytest.raises(SpecShapeError) as e:
        yaml_load(text)
    assert needle in e.value.problem and e.value.problem_mark is not None
    assert isinstance(e.value, yaml.YAMLError)
