"""`memory_format: channels_last`: the model and its EMAs train in NHWC, a resumed run is the uninterrupted run
bit for bit, and the layout changes only the rounding of the trajectory, not the trajectory."""

import json
from pathlib import Path

import pytest
import torch

from emarule.config.load import load_spec
from emarule.engine.context import RunContext
from emarule.scaling import plan
from emarule.tasks import build_parts, run_task
from engine_util import load_checkpoint, one_thread, tensors_equal, train_until_sigterm


def context(tmp: Path, out: str, layout: str, resume: bool = False) -> RunContext:
    spec = load_spec("polyak-r50", preset="tiny", overrides=[f"memory_format={layout}"])
    return RunContext(spec=spec, kappa=2.0, ema_rule="exponential", plan=plan(spec, 2.0, "exponential", None),
                      out=tmp / out, preset="tiny", quiet=True, resume=resume, checkpoint_every_epochs=100.0)


def convolutions(state: dict) -> dict:
    return {k: v for k, v in state.items() if v.dim() == 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    with one_thread():
        for layout in ("channels_last", "contiguous"):
            run_task(context(tmp, layout, layout))
    return tmp


def test_the_model_and_its_ema_are_channels_last(runs):
    ck = load_checkpoint(runs / "channels_last")
    for state in (ck["model"], ck["emas"]["ema"]["module"]):
        convs = convolutions(state)
        assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs.values())
        assert any(not w.is_contiguous() for w in convs.values())  # 3×3 kernels: the two layouts differ
    plain = convolutions(load_checkpoint(runs / "contiguous")["model"])
    assert all(w.is_contiguous() for w in plain.values())


def test_the_layout_changes_rounding_not_the_trajectory(runs):
    def rows(name):
        return [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]

    nhwc, nchw = rows("channels_last"), rows("contiguous")
    assert [(r["kind"], r["step"]) for r in nhwc] == [(r["kind"], r["step"]) for r in nchw]
    assert nhwc[0]["loss"] == pytest.approx(nchw[0]["loss"], rel=1e-6)  # the same first batch, model and loss
    for a, b in zip(nhwc, nchw, strict=True):
        for k in ("loss", "val_loss", "ema_val_loss"):
            if k in b:
                assert a[k] == pytest.approx(b[k], rel=1e-3), (a["step"], k)
    a, b = load_checkpoint(runs / "channels_last")["model"], load_checkpoint(runs / "contiguous")["model"]
    assert not tensors_equal(a, b)  # two layouts do round differently: the comparison above is not vacuous


def test_a_resumed_channels_last_run_is_the_uninterrupted_run_bit_for_bit(tmp_path, runs):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = context(tmp_path, "cut", "channels_last")
        train_until_sigterm(ctx, build_parts(ctx), at_call=1)  # SIGTERM mid-run
        assert not load_checkpoint(tmp_path / "cut")["finished"]
        run_task(context(tmp_path, "cut", "channels_last", resume=True))
    finally:
        torch.set_num_threads(threads)
    got, want = load_checkpoint(tmp_path / "cut"), load_checkpoint(runs / "channels_last")
    assert got["finished"] and got["clock"] == want["clock"]
    for key in ("model", "emas", "optimizer"):
        assert tensors_equal(got[key], want[key]), key
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convolutions(got["model"]).values())
