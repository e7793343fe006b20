"""What a trainable task hands the shared training loop (`emarule/train.py`).

A task module builds these parts from the RunContext; the loop owns everything else
(samples-seen clock, schedules, Progressive Scaling, the optimizer, the model EMA,
distributed data order, checkpoints, logs). Plain data, no callbacks beyond the loss and
the evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class TaskParts:
    # The trainable module: every parameter is optimized (student, heads, tracking probe).
    model: Any  # torch.nn.Module
    # The submodule of `model` whose EMA the task needs (BYOL: online backbone + projector).
    # The loop keeps its EMA copy and passes it to `loss` and `evaluate` as `teacher`.
    ema_source: Any  # torch.nn.Module
    # Map-style training set. `train_set[i]` must be a pure function of (i, epoch, seed) —
    # augmentation randomness included — so that data order and views do not depend on the
    # world size or micro-batching. The loop calls `train_set.set_epoch(e)` if it exists.
    train_set: Any
    # loss(model, teacher, batch) -> (scalar loss tensor, {name: float}) on one micro-batch.
    # The loss is a mean over the micro-batch; the loop weights micro-batches by their size.
    loss: Callable[..., tuple]
    # evaluate(model, teacher) -> {name: float}; called on every rank, logged on rank 0.
    evaluate: Callable[..., dict] | None = None
    # Parameters that get no weight decay (biases and norms when the recipe skips them).
    no_decay: set = field(default_factory=set)  # set of parameter names of `model`
    # Collate a list of `train_set` items into a batch (default: torch's default_collate).
    collate: Callable[[list], Any] | None = None
    # Free-form description logged in hparams.json (architecture, parameter count, data set).
    info: dict = field(default_factory=dict)
    # Parameters of a separate objective trained alongside (a tracking probe), by name: they take
    # `aux_lr_ratio` × the scaled learning rate (so they follow the same optimizer rule), no
    # weight decay and no trust ratio, and stay out of global-norm gradient clipping, so that a
    # probe never eats into the clipping budget of the model it watches.
    aux_params: set = field(default_factory=set)
    aux_lr_ratio: float = 1.0
    # DataLoader worker processes for train_set (None: the loop decides; 0 on CPU, up to 8 on GPU).
    num_workers: int | None = None
