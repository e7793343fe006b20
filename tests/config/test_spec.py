"""Spec loading and validation: every failure names the key path."""

import pytest

from emarule.errors import UserError
from emarule.config.load import experiment_names, load_spec, read_yaml, spec_path

NINE = {"parabola", "precision", "polyak-r50", "ctc-polyak", "ctc-pseudo-label", "byol-r18", "byol-vit",
        "byol-r50-lars", "dino-vit"}


def test_all_nine_experiments_ship():
    assert NINE <= set(experiment_names())


@pytest.mark.parametrize("name", sorted(NINE))
def test_spec_opens_with_command_and_paper_result(name):
    text = spec_path(name, None).read_text().splitlines()
    head = "\n".join(line for line in text[:12] if line.startswith("#"))
    assert "emarule " in head and ("Reported" in head or "reported" in head)


@pytest.mark.parametrize("name", sorted(NINE))
def test_specs_and_presets_validate(name):
    assert load_spec(name)["name"] == name
    for preset in read_yaml(spec_path(name, None)).get("presets", {}) or {}:
        assert load_spec(name, preset=preset)["preset"] == preset


def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


BASE = """
name: mine
task: byol
batch: {size: 256}
optimizer: {name: sgd, lr: 0.1}
ema: {momentum: 0.99}
"""


def test_own_spec_loads(tmp_path):
    assert load_spec(path=write(tmp_path, BASE))["name"] == "mine"


@pytest.mark.parametrize("extra,needle", [
    ("schedule: {epochs: 10, warmup_epoch: 1}", "schedule.warmup_epoch: unknown key"),
    ("optimizer2: {}", "optimizer2: unknown key"),
    ("norm: {bn_momentum: 1.0}", "norm.bn_momentum: must be < 1"),
    ("precision: fp8", "precision: must be one of"),
    ("schedule: {epochs: ten}", "schedule.epochs: expected number"),
])
def test_bad_specs_name_the_key(tmp_path, extra, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        load_spec(path=write(tmp_path, BASE + extra + "\n"))


def test_wrong_list_item_names_the_index(tmp_path):
    text = BASE.replace("optimizer: {name: sgd, lr: 0.1}", "optimizer: {name: adam, lr: 0.1, betas: [0.9, 1.5]}")
    with pytest.raises(UserError, match=r"optimizer.betas\[1\]: must be < 1"):
        load_spec(path=write(tmp_path, text))


def test_bool_is_not_a_number(tmp_path):
    with pytest.raises(UserError, match="optimizer.lr: expected number"):
        load_spec(path=write(tmp_path, BASE.replace("lr: 0.1", "lr: true")))


def test_malformed_yaml_names_line(tmp_path):
    with pytest.raises(UserError, match="line"):
        load_spec(path=write(tmp_path, "name: [unclosed\n"))


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(UserError, match=r"bin.yaml: not UTF-8 text \(byte 0xff at offset 0\); save the spec"):
        load_spec(path=p)
    p.write_bytes(BASE.encode("latin-1") + b"# caf\xe9\n")
    with pytest.raises(UserError, match=r"byte 0xe9 at offset"):
        read_yaml(p)
    p.write_bytes((BASE + "# ρ, κ: UTF-8 is read as such whatever the locale\n").encode())
    assert load_spec(path=p)["name"] == "mine"


def test_not_a_mapping(tmp_path):
    with pytest.raises(UserError, match="mapping"):
        load_spec(path=write(tmp_path, "- 1\n- 2\n"))


def test_missing_file_and_unknown_experiment(tmp_path):
    with pytest.raises(UserError, match="spec file not found"):
        load_spec(path=tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="unknown experiment 'nope'"):
        load_spec("nope")


def test_overrides_apply_and_are_validated():
    assert load_spec("byol-r18", overrides=["optimizer.lr=0.05"])["optimizer"]["lr"] == 0.05
    with pytest.raises(UserError, match="--set optimizer.lrr: unknown key"):
        load_spec("byol-r18", overrides=["optimizer.lrr=0.05"])
    with pytest.raises(UserError, match="ema.momentum: must be < 1"):
        load_spec("byol-r18", overrides=["ema.momentum=1.2"])
    with pytest.raises(UserError, match="key=value"):
        load_spec("byol-r18", overrides=["ema.momentum"])


def test_unknown_preset():
    with pytest.raises(UserError, match="no preset 'huge'"):
        load_spec("byol-r18", preset="huge")


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    # PyYAML's YAML 1.1 rules read 5e-4 as a string; specs and --set follow YAML 1.2
    assert load_spec("byol-r18", overrides=["optimizer.weight_decay=5e-4"])["optimizer"]["weight_decay"] == 5e-4
    text = BASE.replace("lr: 0.1", "lr: 1e-3")
    assert load_spec(path=write(tmp_path, text))["optimizer"]["lr"] == 1e-3
