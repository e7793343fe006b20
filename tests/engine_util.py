"""Shared helpers for the training-engine tests: toy specs, contexts and subprocess runs."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from emarule.engine.context import RunContext
from emarule.scaling import plan
from emarule.config.load import load_spec

ROOT = Path(__file__).resolve().parent.parent

TOY = {
    "name": "toy",
    "task": "toy",
    "precision": "fp32",
    "batch": {"size": 16},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1.0e-4,
                  "weight_decay_skip_bias": True, "grad_clip": 1.0},
    "schedule": {"kind": "cosine", "epochs": 4, "warmup_epochs": 1, "min_lr": 0.001},
    "ema": {"momentum": 0.9, "update_from": "post", "start_steps": 0, "buffers": "copy"},
    "toy": {"samples": 128, "teacher_weight": 0.5, "augment": 0.1, "threads": 1, "quiet": True},
    "eval": {"every_epochs": 1},
}


def toy_spec(**overrides) -> dict:
    """The toy spec with dotted overrides: toy_spec(**{"schedule.epochs": 2})."""
    s = copy.deepcopy(TOY)
    for key, value in overrides.items():
        node = s
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return s


def write_spec(tmp: Path, spec: dict, name: str = "spec.yaml") -> Path:
    p = Path(tmp) / name
    p.write_text(yaml.safe_dump(spec))
    return p


def make_ctx(tmp: Path, spec: dict, kappa: float = 1.0, out: str = "run", progressive: dict | None = None,
             ema_rule: str | None = "exponential", **kw) -> RunContext:
    s = load_spec(path=write_spec(tmp, spec, f"{out}.yaml"))
    p = plan(s, kappa, ema_rule, progressive)
    return RunContext(spec=s, kappa=kappa, ema_rule=ema_rule, plan=p, out=Path(tmp) / out, progressive=progressive,
                      quiet=True, **kw)


def run_toy(tmp: Path, spec: dict, kappa: float = 1.0, out: str = "run", **kw) -> tuple[dict, RunContext]:
    from emarule.tasks import run_task

    torch.set_num_threads(1)
    ctx = make_ctx(tmp, spec, kappa, out, **kw)
    return run_task(ctx), ctx


def crash_toy(tmp: Path, spec: dict, out: str, *, checkpoint_every_epochs: float, at_call: int,
              error: Exception) -> None:
    """Train the toy in this process, checkpointing every `checkpoint_every_epochs`, until the loss's call
    `at_call` raises `error`: a process that dies mid-run, with only its periodic checkpoints behind it."""
    import pytest

    from emarule.engine.loop import train
    from emarule.tasks import toy

    torch.set_num_threads(1)
    ctx = make_ctx(tmp, spec, out=out)
    ctx.checkpoint_every_epochs = checkpoint_every_epochs
    parts = toy.make_parts(ctx)
    inner, calls = parts.loss, {"n": 0}

    def loss(model, teacher, batch, now=None):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise error
        return inner(model, teacher, batch, now)

    parts.loss = loss
    with pytest.raises(type(error)) as raised:
        train(ctx, parts)
    assert raised.value is error  # the injected death, not another failure of the same type


# metrics.jsonl keys that time the machine, not the run
WALL_CLOCK = frozenset({"samples_per_s", "wall_s", "data_wait_s"})


def without_wall_clock(jsonl: Path) -> list[dict]:
    """The rows of a metrics file without the keys that differ between two identical runs."""
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK}
            for line in jsonl.read_text().splitlines()]


def rows_without_wall_clock(run_dir: Path) -> list[dict]:
    return without_wall_clock(run_dir / "metrics.jsonl")


def load_checkpoint(run_dir: Path) -> dict:
    return torch.load(Path(run_dir) / "checkpoint.pt", map_location="cpu", weights_only=False)


def env() -> dict:
    e = dict(os.environ)
    e["WANDB_MODE"] = "disabled"
    e["OMP_NUM_THREADS"] = "1"
    e["CUDA_VISIBLE_DEVICES"] = ""  # two-process tests are gloo tests: one GPU has no room for rank 1
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "emarule", "run", *args]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cli(*args), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def tensors_equal(a, b) -> bool:
    """Bitwise equality of nested state dicts."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively.

    The full-size tests check that a recipe's real model builds and takes a step; without native bf16
    (AVX2-only CPUs) oneDNN emulates it, and one backward pass of ViT-B/16 takes 100 s instead of 3 s.
    The bf16 path itself is tested on a small model (test_bf16_autocast_trains_on_cpu_with_fp32_ema)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def full_size_autocast():
    """bf16 autocast where the CPU multiplies bf16 natively, else fp32 (`native_bf16`)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())


def train_until_sigterm(ctx: RunContext, parts, at_call: int) -> None:
    """Train `parts` in this process until the `at_call`-th call of its loss sends SIGTERM: the loop checkpoints at
    that step and exits 143 (checked)."""
    import signal

    import pytest

    from emarule.engine.loop import train

    loss, calls = parts.loss, []

    def cut(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss(*args, **kwargs)

    parts.loss = cut
    with pytest.raises(SystemExit) as stopped:
        train(ctx, parts)
    assert stopped.value.code == 143


@contextlib.contextmanager
def one_thread():
    """torch on one thread inside the block (runs compared bit for bit), its thread count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
