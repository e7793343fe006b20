"""docs/spec-keys.md is what `python -m emarule.config.keys` writes from the schema, and its example is true."""

import re

from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.config import keys


def test_the_committed_page_is_the_generated_one():
    assert keys.PAGE.read_text(encoding="utf-8") == keys.page(), "run `python -m emarule.config.keys`"


def test_every_key_of_every_task_is_on_the_page():
    from emarule.registry import REGISTRY

    text = keys.PAGE.read_text(encoding="utf-8")
    for spec in REGISTRY.values():
        for path, _ in keys.rows(spec.config):
            assert f"| `{path}` |" in text, (spec.name, path)
    assert "| `ema.momentum` | number | ≥ 0; < 1 |" in text


def test_the_pages_example_error_is_what_plan_prints():
    text = keys.PAGE.read_text(encoding="utf-8")
    command = re.search(r"`(emarule plan [^`]+)` prints", text).group(1)
    shown = re.search(r"```text\n(.*?)\n```", text, re.S).group(1)
    args = ["plan", "byol-vit", "--kappa", "2", "--set", "optimizer.betas=[0.9, 1.2]"]
    assert command == 'emarule plan byol-vit --kappa 2 --set "optimizer.betas=[0.9, 1.2]"'
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.output.strip() == shown
