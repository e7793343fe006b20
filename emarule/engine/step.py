"""One optimizer step: forward/backward each micro-batch, agree across ranks, check, clip, step, update the EMAs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from emarule.engine import distributed, schedules
from emarule.engine.feed import Batch


@dataclass
class Agreed:
    """What every rank holds the same after a step's backward passes: the sums over ranks."""

    loss: float
    metrics: dict  # the task's scalar metrics
    reduced: dict  # the task's tensor metrics (for TaskParts.on_step)
    stop: bool  # some rank was asked to stop
    checkpoint_due: bool  # rank 0's wall clock says a checkpoint is due


@dataclass
class StepOutcome:
    agreed: Agreed
    grad_norm: float | None = None  # None where the loss was not finite (no norm was taken)
    problem: str | None = None  # a non-finite loss or gradient norm: nothing was stepped

    @property
    def loss(self) -> float:
        return self.agreed.loss

    @property
    def metrics(self) -> dict:
        """What the step's train row averages besides the loss."""
        if self.grad_norm is None:
            return self.agreed.metrics
        return {**self.agreed.metrics, "grad_norm": self.grad_norm}


def agree(loss_sum: torch.Tensor, sums: dict, stop: bool, checkpoint_due: bool, device: torch.device) -> Agreed:
    """The loss, the task's metrics and the two flags, summed over ranks in ONE all-reduce.

    One collective a step, not one per value: each collective is a round trip between the ranks that costs
    about the same for one number as for a few hundred, and the flags must travel with the step's values so
    that every rank takes the same decision (stop, checkpoint) after the same step. The vector is
    [loss, scalars..., tensors flattened..., stop requested, checkpoint due], in the same order on every rank
    (`agree_on_metric_names` gives a rank that had no item the others' names first)."""
    scalars = sorted(k for k, v in sums.items() if not isinstance(v, torch.Tensor))
    tensors = sorted(k for k, v in sums.items() if isinstance(v, torch.Tensor))
    flat = [sums[k].reshape(-1).to(device) for k in tensors]
    vec = torch.cat([torch.tensor([0.0] + [sums[k] for k in scalars], dtype=torch.float64, device=device), *flat,
                     torch.tensor([float(stop), float(checkpoint_due)], dtype=torch.float64, device=device)])
    vec[0] = loss_sum
    distributed.all_reduce_sum_(vec)
    values = vec.tolist()
    reduced, i = {}, 1 + len(scalars)
    for k, f in zip(tensors, flat, strict=True):
        reduced[k] = vec[i:i + f.numel()].reshape(sums[k].shape)
        i += f.numel()
    return Agreed(values[0], dict(zip(scalars, values[1:1 + len(scalars)], strict=True)), reduced,
                  values[-2] > 0, values[-1] > 0)


def agree_on_metric_names(sums: dict, device: torch.device) -> None:
    """Zeros for the metrics other ranks computed and this one did not (it had no item this step), so
    that every rank all-reduces vectors of the same layout."""
    shapes = {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else None) for k, v in sums.items()}
    for theirs in distributed.gather_objects(shapes):
        for k, shape in theirs.items():
            if k not in sums:
                sums[k] = 0.0 if shape is None else torch.zeros(shape, dtype=torch.float64, device=device)


def optimizer_step(run, batch: Batch, stop_requested: Callable[[], bool], checkpoint_due: bool) -> StepOutcome:
    """Forward/backward every micro-batch, agree, check, clip, step, update the EMAs of `run` (the loop's `Run`).

    `stop_requested` is read after the last backward, so a signal that came during the step still stops after
    it on every rank; `checkpoint_due` is rank 0's wall-clock cadence, made every rank's by the agreement."""
    model, parts, d, opt = run.model, run.parts, run.dist, run.optimizer
    teacher = run.emas[parts.teacher].module if parts.teacher in run.emas else None
    now = run.now()
    opt.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=d.device, dtype=torch.float64)
    sums: dict[str, object] = {}
    for micro, measure in zip(batch.micro, batch.measures, strict=True):
        weight = measure / batch.measure  # gradients are summed over micro-batches and ranks
        micro = distributed.to_device(micro, d.device)
        with run.autocast():
            loss, metrics = parts.loss(model, teacher, micro, now)
        (loss if weight == 1.0 else loss * weight).backward()  # × 1.0 is exact: one graph node fewer
        loss_sum += loss.detach().double() * weight
        for k, v in (metrics or {}).items():
            v = v.detach().double() * weight if isinstance(v, torch.Tensor) else float(v) * weight
            sums[k] = sums[k] + v if k in sums else v
    if batch.idle:
        agree_on_metric_names(sums, d.device)
    agreed = agree(loss_sum, sums, stop_requested(), checkpoint_due, d.device)
    if not math.isfinite(agreed.loss):
        return StepOutcome(agreed, problem=f"the loss became {agreed.loss}")
    params = [p for p in run.params if p.requires_grad]
    if d.world_size > 1:
        distributed.all_reduce_grads_(params)  # a parameter no rank gave a gradient keeps grad None
        if not run.sync_bn:  # before the EMA reads them: every rank's teacher gets rank 0's statistics
            distributed.broadcast_buffers_(model)
    grad_norm = clip_gradients(params, run.aux_ids, run.ctx.cfg.optimizer.grad_clip)
    if not math.isfinite(grad_norm):  # a finite loss can still overflow in backward
        return StepOutcome(agreed, grad_norm, f"the gradient norm became {grad_norm}")
    pre = run.ctx.cfg.ema.update_from == "pre"
    if pre:
        update_emas(run, batch.seen_after)  # θ_t: the parameters before the step
    opt.step()
    if not pre:
        update_emas(run, batch.seen_after)  # θ_{t+1}
    return StepOutcome(agreed, grad_norm)


def clip_gradients(params: list, aux_ids: frozenset, clip: float | None) -> float:
    """Global-norm clipping of the model's gradients; a tracking probe is neither clipped nor counted."""
    body = [p for p in params if id(p) not in aux_ids]
    if clip:
        return float(torch.nn.utils.clip_grad_norm_(body, clip))
    return total_norm([p.grad for p in body if p.grad is not None])


def total_norm(grads: list) -> float:
    """torch.nn.utils.get_total_norm's value bit for bit: on one device and dtype it is these two reductions
    (the norm of each tensor, then of their stack); its grouping per call costs a third of the time."""
    if not grads or any(g.device != grads[0].device or g.dtype != grads[0].dtype for g in grads):
        return float(torch.nn.utils.get_total_norm(grads))
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0))


def update_emas(run, seen_after: float) -> None:
    """Each EMA holds the stage's ρ̂ from the momentum schedule (set_momentum) and no base batch, so ρ is raised to
    κ once, in the plan."""
    for name, e in run.emas.items():
        run.momenta[schedules.momentum_log_name(name)] = e.update(run.source, samples_seen=seen_after)
