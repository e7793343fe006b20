"""What every plan reads cannot be removed by `--set`, a preset or a spec file; `--set` never drops keys
silently (a section's mapping, a new task): each is one UserError naming the key and the fix."""

import pytest

from emarule.config.load import load_spec
from emarule.errors import UserError


@pytest.mark.parametrize("override,needle", [
    ("batch=null", "batch: missing or null"),
    ("optimizer=null", "optimizer: missing or null"),
    ("ema=null", "ema: missing or null"),
    ("batch={}", "batch is a section holding size, unit, which a mapping would drop"),
    ("ema={}", "ema is a section holding momentum"),
    ("optimizer={lr: 0.1}", "optimizer is a section holding name, momentum, weight_decay"),
])
def test_a_set_that_removes_a_required_section_is_refused(override, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")) as e:
        load_spec("byol-r18", overrides=[override])
    assert str(e.value).startswith("--set ") or "missing or null" in str(e.value)


def _spec(tmp_path, batch="{size: 256}", ema="{momentum: 0.99}", task="byol"):
    p = tmp_path / "s.yaml"
    p.write_text(f"name: mine\ntask: {task}\nbatch: {batch}\noptimizer: {{name: sgd, lr: 0.1}}\nema: {ema}\n")
    return p


def test_a_spec_without_batch_size_names_the_file_and_the_key(tmp_path):
    p = _spec(tmp_path, batch="{unit: samples}")
    with pytest.raises(UserError, match=r"s\.yaml: batch\.size: missing; give the reference batch"):
        load_spec(path=p)


def test_a_training_task_needs_ema_momentum_and_a_study_does_not(tmp_path):
    with pytest.raises(UserError, match="ema.momentum: missing; a byol run trains with a model EMA"):
        load_spec(path=_spec(tmp_path, ema="{update_from: post}"))
    assert load_spec(path=_spec(tmp_path, ema="{update_from: pre}", task="precision"))["task"] == "precision"


def test_a_mapping_that_keeps_every_key_of_its_section_is_taken():
    # byol-r18 has `progressive: null`: a mapping drops nothing there, and the existing corpus relies on it
    s = load_spec("byol-r18", overrides=["progressive={kind: step, epoch: 3}"])
    assert s["progressive"] == {"kind": "step", "epoch": 3}
    s = load_spec("byol-vit", overrides=["progressive={kind: step, epoch: 3}"])  # the same keys, new values
    assert s["progressive"] == {"kind": "step", "epoch": 3}


def test_an_overlap_is_named_before_a_mapping_is_refused():
    with pytest.raises(UserError, match="given in two overlapping --set options"):
        load_spec("byol-r18", overrides=["ema={momentum: 0.9}", "ema.momentum=0.99"])


def test_the_task_cannot_be_set():
    with pytest.raises(UserError, match="--set task=byol: task cannot be changed.*pick another experiment"):
        load_spec("dino-vit", overrides=["task=byol"])


def test_an_unknown_key_points_at_the_page_that_lists_the_keys():
    with pytest.raises(UserError, match="unknown key for a byol spec; docs/spec-keys.md lists the keys"):
        load_spec("byol-r18", overrides=["nosuch=1"])
