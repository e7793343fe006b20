"""The report of a sweep family links the figures this invocation drew, and no other."""

import json

from typer.testing import CliRunner

from emarule.cli.main import app

runner = CliRunner()


def test_a_compare_figure_an_earlier_command_left_is_not_linked(tmp_path):
    import torch

    torch.set_num_threads(1)
    # `emarule sweep ... --metric ema_top1` into the same root would leave this; the reproduction draws top1's
    stale = tmp_path / "polyak-r50" / "compare-ema_top1.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\x89PNG\r\n\x1a\n not this reproduction's figure")
    res = runner.invoke(app, ["reproduce", "polyak", "--preset", "tiny", "--seeds", "1", "--kappas", "1,2", "--jobs",
                              "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    v = json.loads((tmp_path / "verdict.json").read_text())
    assert v["figures"] == ["figures/polyak.png", "polyak-r50/compare-top1.png"]
    assert all((tmp_path / f).is_file() for f in v["figures"])
    report = (tmp_path / "report.md").read_text()
    assert "compare-top1.png" in report and "compare-ema_top1" not in report
