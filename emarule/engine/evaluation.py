"""Named evaluations: shard a split over ranks, score the target and every EMA, reduce once, name the metrics.

A task describes each evaluation with `emarule.engine.interface.Evaluation` (data, cadence, a scoring
function that returns additive sums, and `finish` to turn sums into metrics). This module owns
everything that makes that distributed and uniform: which model is scored, eval mode, autocast,
sharding item i to rank i mod W, the one all-reduce per (evaluation, model), and the metric names
(`top1` for the target, `ema_top1` for the main EMA, `ema_top1/0.9999` for a further EMA,
`wer/test-clean` for a second split).
"""

from __future__ import annotations

import contextlib
import math

import torch

from emarule.engine import distributed
from emarule.engine.baditems import Guarded, guarded_collate
from emarule.errors import UserError
from emarule.engine.interface import MAIN_EMA, Evaluation, Now


def metric_name(name: str, ema: str | None, split: str = "") -> str:
    """`name` as reported for the target (ema=None), the main EMA, or a further EMA, on `split`."""
    prefix = "" if ema is None else "ema_"
    suffix = "" if ema in (None, MAIN_EMA) else f"/{ema}"
    return f"{prefix}{name}{suffix}" + (f"/{split}" if split else "")


def every_epochs(ev: Evaluation, base_batch: float, epoch_measure: float) -> float:
    """The evaluation's cadence in epochs (base steps are points on the clock: steps × base batch)."""
    if ev.every_base_steps:
        return ev.every_base_steps * base_batch / epoch_measure
    return float(ev.every_epochs or 1.0)


def next_due(epoch: float, every: float) -> float:
    """The first multiple of `every` strictly after `epoch`."""
    return (math.floor(epoch / every + 1e-9) + 1) * every


def nets(ev: Evaluation, source, emas: dict, teacher: str | None) -> list[tuple[str | None, torch.nn.Module]]:
    """(EMA name or None for the target, module) pairs this evaluation scores."""
    if ev.models == "teacher":
        return [(None, emas[teacher].module)] if teacher in emas else [(None, source)]
    return [(None, source)] + [(name, e.module) for name, e in emas.items()]


@contextlib.contextmanager
def eval_mode(*modules: torch.nn.Module):
    saved = [(m, m.training) for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, was in saved:
            m.train(was)


@torch.no_grad()
def score(ev: Evaluation, net: torch.nn.Module, now: Now, device: torch.device, autocast,
          workers: int = 0) -> dict[str, float]:
    """Sums over this rank's shard, then over ranks (one collective), then `finish`."""
    from torch.utils.data import DataLoader, default_collate

    world, rank = distributed.world_size(), distributed.rank()
    shard = list(range(rank, len(ev.data), world))
    # The same worker processes and pinned memory as training: decoding a validation split of
    # JPEGs in the training process would take as long as an epoch on a GPU.
    loader = DataLoader(Guarded(torch.utils.data.Subset(ev.data, shard)), batch_size=ev.batch_size,
                        collate_fn=guarded_collate(ev.collate or default_collate), num_workers=workers if shard else 0,
                        pin_memory=device.type == "cuda")
    sums: dict[str, torch.Tensor] = {}
    for loaded in loader:
        if loaded.bad:  # never skipped: a score over fewer items would not be the split's
            b = loaded.bad[0]
            raise UserError(f"cannot decode {b.path} ({b.why}), an item of an evaluation split; fix or remove the "
                            f"file (evaluation items are never skipped)")
        batch = loaded.batch
        with autocast():
            out = ev.score(net, distributed.to_device(batch, device), now)
        for k, v in out.items():
            v = torch.as_tensor(v, dtype=torch.float64, device=device)
            sums[k] = sums[k] + v if k in sums else v
    keys = sorted(sums) if world == 1 else sorted(set().union(*distributed.gather_objects(sorted(sums))))
    vec = torch.stack([sums.get(k, torch.zeros((), dtype=torch.float64, device=device)) for k in keys]) \
        if keys else torch.zeros(0, dtype=torch.float64, device=device)
    distributed.all_reduce_sum_(vec)
    return {k: float(v) for k, v in ev.finish(dict(zip(keys, vec.tolist(), strict=True))).items()}


def run(due: list[Evaluation], model, source, emas: dict, teacher: str | None, now: Now, device, autocast,
        workers: int = 0) -> dict:
    """Every due evaluation on every model it covers; the target and EMAs in eval mode throughout."""
    metrics: dict[str, float] = {}
    with eval_mode(model, *(e.module for e in emas.values())):
        for ev in due:
            for ema, net in nets(ev, source, emas, teacher):
                for k, v in score(ev, net, now, device, autocast, workers).items():
                    metrics[metric_name(k, ema, ev.split)] = v
    return metrics
