"""ModelEma's global clock (samples seen, from which each update infers its batch), its momentum
schedules composed with the EMA Scaling Rule, updates every N calls, and its input checks."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import emarule
from emarule.engine.ema import ModelEma

TESTS = Path(__file__).resolve().parent


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def shift(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))


def weights(ema: ModelEma) -> list:
    return [p.clone() for p in ema.module.parameters()]


def test_samples_seen_gives_each_update_its_batch():
    model = net()
    ema = ModelEma(model, 0.9, base_batch_size=32)
    assert ema.update(model, samples_seen=64) == pytest.approx(0.81)
    assert ema.update(model, samples_seen=96) == pytest.approx(0.9)
    assert ema.update(model, samples_seen=96 + 128, batch_size=128) == pytest.approx(0.9**4)
    with pytest.raises(ValueError, match="samples_seen must grow"):
        ema.update(model, samples_seen=224)


def test_a_local_batch_against_the_global_clock_is_refused():
    """Two ranks of 32: the clock says 64 more samples, a local batch_size=32 would give ρ^(1/2) too little."""
    model = net()
    ema = ModelEma(model, 0.999, base_batch_size=64)
    before = weights(ema)
    with pytest.raises(ValueError, match="both must count the global batch"):
        ema.update(model, samples_seen=64, batch_size=32)
    assert all(torch.equal(a, b) for a, b in zip(before, weights(ema), strict=True))
    assert ema.update(model, samples_seen=64, batch_size=64) == 0.999


def test_every_n_calls_raises_rho_to_the_samples_seen_in_between():
    model = net()
    every = ModelEma(model, 0.9, base_batch_size=32, every=3)
    once = ModelEma(model, 0.9, base_batch_size=32)
    shift(model)
    for _ in (1, 2):
        before = weights(every)
        assert every.update(model, batch_size=32) == 1.0  # skipped: nothing moves
        assert all(torch.equal(a, b) for a, b in zip(before, weights(every), strict=True))
    assert every.update(model, batch_size=32) == pytest.approx(0.9**3)
    assert every.momentum_at(batch_size=32) == 1.0  # the next call is a skipped one
    assert once.update(model, batch_size=96) == pytest.approx(0.9**3)
    assert all(torch.equal(a, b) for a, b in zip(weights(once), weights(every), strict=True))
    # with the clock alone, the skipped calls' samples count as well
    clocked = ModelEma(model, 0.9, base_batch_size=32, every=2)
    assert clocked.update(model, samples_seen=40) == 1.0
    assert clocked.update(model, samples_seen=80) == pytest.approx(0.9 ** (80 / 32))


def test_warmup_matches_timms_model_ema_v3_at_the_base_batch_and_is_raised_to_kappa():
    timm_utils = pytest.importorskip("timm.utils")
    model = net()
    timm_ema = timm_utils.ModelEmaV3(model, decay=0.999, update_after_step=2, use_warmup=True, warmup_power=0.75)
    ours = ModelEma(model, 0.999, base_batch_size=8, start_steps=3, warmup_power=0.75)
    for step in range(1, 40):
        assert ours.momentum_at(samples_seen=8 * step, batch_size=8) == pytest.approx(
            timm_ema.get_decay(step), rel=1e-12), step
        ours.update(model, samples_seen=8 * step)
    at4 = ModelEma(model, 0.999, base_batch_size=8, start_steps=3, warmup_power=0.75)
    for step in range(4, 40, 4):  # κ=4: the base-batch warm-up at this clock, to the 4th power
        assert at4.update(model, samples_seen=8 * step) == pytest.approx(timm_ema.get_decay(step) ** 4, rel=1e-12)


def test_cosine_ramp_to_one_byol_dino_style():
    model = net()
    total, rho = 1000, 0.99
    ema = ModelEma(model, rho, base_batch_size=10, schedule="cosine", total_samples=total)
    for s in range(20, total + 1, 20):
        tau = 1 - (1 - rho) * (math.cos(math.pi * s / total) + 1) / 2  # BYOL's τ at base step s / 10
        assert ema.update(model, samples_seen=s) == pytest.approx(tau**2, rel=1e-12)
    shift(model)
    before = weights(ema)
    ema.update(model, samples_seen=total + 20)  # past the end ρ stays 1: the EMA is frozen
    assert all(torch.equal(a, b) for a, b in zip(before, weights(ema), strict=True))


def test_start_delay_then_a_scaled_momentum_of_your_own():
    model = net()
    ema = ModelEma(model, 0.99, base_batch_size=16, start_samples=32)
    assert ema.update(model, samples_seen=32) == 0.0  # a copy until the start
    assert ema.update(model, samples_seen=64, momentum=0.9) == pytest.approx(0.81)
    with pytest.raises(ValueError, match="start_samples must be a finite number ≥ 0"):
        ModelEma(model, 0.9, start_samples=-1)


@pytest.mark.parametrize("kwargs, message", [
    ({"momentum": 1.0}, "ρ = 1 never moves the EMA"),
    ({"momentum": 0.9, "dtype": "fp32"}, "use one of float32, bfloat16, float16, float64"),
    ({"momentum": 0.9, "base_batch_size": True}, "base_batch_size must be a finite number > 0, got True"),
    ({"momentum": 0.9, "base_batch_size": "256"}, "got '256' \\(a str\\)"),
    ({"momentum": 0.9, "schedule": "cosine", "base_batch_size": 8}, "give total_samples"),
    ({"momentum": 0.9, "warmup_power": 0.75}, "give base_batch_size"),
    ({"momentum": 0.9, "every": 0}, "every must be a whole number of calls ≥ 1"),
    ({"momentum": 0.9, "buffers": "mean"}, "buffers must be one of copy, average"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        ModelEma(net(), **kwargs)
    assert "--" not in str(err.value)  # no CLI wording in an API error


def test_bad_clock_values_are_named():
    model = net()
    ema = ModelEma(model, 0.9, base_batch_size=32)
    for bad in (True, "64", -1, math.nan):
        with pytest.raises(ValueError, match="batch_size must be a finite number > 0"):
            ema.update(model, batch_size=bad)
    with pytest.raises(ValueError, match="samples_seen must be a finite number ≥ 0"):
        ema.update(model, samples_seen="64")


@pytest.mark.slow
def test_two_ddp_ranks_and_two_fsdp2_shards_give_the_one_process_ema(tmp_path):
    """torchrun, 2 gloo processes: the EMA of DDP and of FSDP2 (shard-local shadow) equals one process's."""
    sys.path.insert(0, str(TESTS))
    try:
        import ema_worker
    finally:
        sys.path.remove(str(TESTS))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(TESTS / "ema_worker.py"), str(tmp_path)]
    gloo = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # FSDP2 would take a GPU
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=gloo)
    assert r.returncode == 0, r.stderr[-3000:]
    one = ema_worker.train("one")
    for mode in ("ddp", "fsdp"):
        got = torch.load(tmp_path / f"{mode}.pt")
        assert list(got) == list(one)
        for k, v in one.items():
            torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6)
    assert emarule.ModelEma is ModelEma
