"""Defaults live beside the types (emarule/config/): no spec read outside it carries a default of its own."""

import ast
from pathlib import Path

from emarule.config.schema import COMMON, value
from emarule.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = set(COMMON) | {s for t in REGISTRY.values() for s in t.config}


READS = {"get", "value", "_get", "spec_value"}  # config.schema's readers, under the names modules import them as


def spec_read(node: ast.AST) -> str | None:
    """The dotted key of `get(spec, "section.key", ...)` / `value(spec, "section.key")`, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READS):
        return None
    args = node.args
    key = args[1].value if len(args) >= 2 and isinstance(args[1], ast.Constant) else None
    return key if isinstance(key, str) and key.split(".")[0] in SECTIONS else None


def inline_defaults(path: Path) -> list[str]:
    src = path.read_text()
    out = []
    for node in ast.walk(ast.parse(src)):
        # get(spec, "section.key") or default, value(spec, "section.key") or default
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and spec_read(node.values[0]):
            out.append(f"{path}:{node.lineno}: {ast.get_source_segment(src, node)}")
        if not isinstance(node, ast.Call):
            continue
        f, args = node.func, node.args
        # get(spec, "section.key", default)
        if spec_read(node) and f.id in ("get", "_get") and len(args) == 3:
            out.append(f"{path}:{node.lineno}: {ast.get_source_segment(src, node)}")
        # spec["section"].get("key", default)
        if (isinstance(f, ast.Attribute) and f.attr == "get" and len(args) == 2 and isinstance(f.value, ast.Subscript)
                and isinstance(f.value.slice, ast.Constant) and f.value.slice.value in SECTIONS):
            out.append(f"{path}:{node.lineno}: {ast.get_source_segment(src, node)}")
    return out


def test_no_spec_read_outside_the_config_carries_an_inline_default():
    found = [hit for f in sorted((ROOT / "emarule").rglob("*.py")) if "config" not in f.parts
             for hit in inline_defaults(f)]
    assert not found, "give the key its default in emarule/config/ and read it with value():\n" + "\n".join(found)


def test_the_checker_finds_both_forms(tmp_path):
    f = tmp_path / "reads.py"
    f.write_text('a = get(spec, "data.num_classes", 10)\nb = spec["batch"].get("unit", "samples")\n'
                 'c = get(spec, "data.path")\nd = value(spec, "batch.unit")\n'
                 'e = float(get(s, "eval.every_epochs") or 1.0)\nf = value(s, "ema.also") or []\n'
                 'g = ck.get("final") or {}\nh = get(s, "data.path") is None or x\n')
    assert sorted(int(hit.split(":")[1]) for hit in inline_defaults(f)) == [1, 2, 5, 6]


def test_a_missing_key_reads_its_default_and_an_unknown_one_is_an_error():
    import pytest

    spec = {"task": "byol", "batch": {"size": 256}, "data": {"image_size": 64}}
    assert value(spec, "data.image_size") == 64 and value(spec, "data.num_classes") == 10
    assert value(spec, "batch.unit") == "samples" and value({"task": "dino"}, "data.image_size") == 224
    with pytest.raises(KeyError, match="data.nope"):
        value(spec, "data.nope")


def test_the_ctc_vocabulary_default_is_the_tokenizers():
    from emarule.speech.tokens import VOCAB

    assert value({"task": "ctc"}, "model.vocab") == VOCAB
