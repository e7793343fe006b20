"""The CUDA variants: the loop on a GPU with bf16 autocast, a float32 EMA and pinned-memory loaders with
workers. Skipped without a GPU; the rest of the suite keeps a GPU machine's runs on the CPU (tests/conftest.py
sets EMARULE_DEVICE=cpu), where its exactness checks hold."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from emarule.cli.main import app
from engine_util import load_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_bf16_run_on_the_gpu_keeps_a_float32_ema_and_loads_with_pinned_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("EMARULE_DEVICE", "cuda")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "polyak-r50", "--preset", "tiny", "--set", "precision=bf16",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    hp = json.loads((out / "hparams.json").read_text())
    assert hp["device"].startswith("cuda") and hp["num_workers"] >= 1  # workers, so pin_memory is on
    ckpt = load_checkpoint(out)
    assert all(v.dtype == torch.float32 for v in ckpt["emas"]["ema"]["module"].values() if v.is_floating_point())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all(math.isfinite(r["top1"]) and math.isfinite(r["ema_top1"]) for r in evals)


def test_more_torchrun_processes_than_gpus_is_refused_on_a_gpu_machine(monkeypatch):
    from emarule.engine import distributed as D
    from emarule.errors import UserError

    monkeypatch.setenv("EMARULE_DEVICE", "cuda")
    here = torch.cuda.device_count() + 1
    for k, v in {"WORLD_SIZE": str(here), "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(here),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(D, "_STATE", None)
    with pytest.raises(UserError, match="processes on this node"):
        D.setup()
