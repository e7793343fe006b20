"""What a trainable task hands the shared training loop (`emarule/engine/loop.py`), and what it gets back.

A task module builds a `TaskParts` from the RunContext; the loop owns everything else: the clock,
schedules, Progressive Scaling, the optimizer, the model EMAs, data order across ranks and
micro-batches, evaluation sharding, checkpoints and logs. Plain data and a few functions; no
callback framework. Every function a task hands over is called on every rank, with the same
arguments, so that all ranks take the same decisions.

The calls, in the order the loop makes them:

    loss(model, teacher, batch, now) -> (loss, metrics)      every micro-batch
    on_step(now, reduced)                                    once per optimizer step
    evaluations[i].score(net, batch, now) -> sums            at each evaluation's cadence

`now` is a `Now`: where training is (units seen, epoch, base-step equivalent, step), the κ and
the plan of the stage in force, and the run's EMAs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

MAIN_EMA = "ema"  # the first EMA: metrics `ema_<name>`, momentum logged as `ema_momentum`


@dataclass(frozen=True)
class Now:
    """Where training is. Step-counted recipe values are points on this clock: compare
    `base_step` with the spec's base value (`specaug.start_steps`, `pseudo_label.pretrain_steps`),
    which stays right under Progressive Scaling, where the optimizer-step count does not."""

    seen: float  # units of the batch measure seen: samples, or seconds of audio
    samples: int  # training items seen
    epoch: float  # fractional epoch (seen / one epoch's measure)
    base_step: float  # seen / the base batch: the κ=1 step this point corresponds to
    step: int  # optimizer steps taken
    kappa: float  # κ of the stage in force
    plan: Any  # emarule.scaling.Plan of the stage in force (scaled values for κ)
    emas: dict = field(default_factory=dict)  # name -> emarule.engine.ema.ModelEma, the main one first
    unit: str = "samples"


@dataclass
class Evaluation:
    """One named evaluation: a data split, a cadence, and a scoring function.

    The loop shards `data` over ranks (item i on rank i mod W), batches it, calls `score` on every
    batch for each model evaluated, sums the returned values over batches and ranks in one
    reduction, and turns the sums into metrics with `finish`. Return additive quantities from
    `score` (correct and count, errors and words, loss sum and count), never means.

    Metric names: the target model's are `finish`'s keys (`top1`), the main EMA's are prefixed
    `ema_` (`ema_top1`), further EMAs add `/<ema name>` (`ema_top1/0.9999`), and a split other than
    the main one adds `/<split>` (`wer/test-clean`). With `models="teacher"` only the task's
    teacher is evaluated and the names stay bare: a tracking probe measures the teacher by
    definition (`probe_top1`).
    """

    data: Any  # map-style: data[i] is one item
    score: Callable[..., dict]  # score(net, batch, now) -> {name: sum (float or 0-d tensor)}
    finish: Callable[[dict], dict] = lambda sums: sums  # sums -> {metric: value}
    split: str = ""  # "" for the main split, else a suffix: "test-clean"
    models: str = "all"  # "all": the target and every EMA; "teacher": the task's teacher only
    every_epochs: float | None = 1.0
    every_base_steps: float | None = None  # wins over every_epochs when set
    batch_size: int = 256
    collate: Callable[[list], Any] | None = None


@dataclass
class TaskParts:
    # The trainable module: every parameter is optimized (student, heads, tracking probe).
    model: Any  # torch.nn.Module
    # Map-style training set. `train_set[i]` must be a pure function of (i, epoch, seed) —
    # augmentation randomness included — so that data order and views do not depend on the
    # world size or micro-batching. The loop calls `train_set.set_epoch(e)` if it exists.
    train_set: Any
    # loss(model, teacher, batch, now) -> (scalar loss, {name: value}) on one micro-batch. The loss
    # is a mean per unit of the batch measure (per sample; per second of audio for seconds
    # batches), or of `loss_measure` where the task gives one, so that weighting micro-batches by
    # that measure gives the global batch's mean.
    # Metric values are floats (logged) or tensors (not logged): each is averaged over the global
    # batch with the same weights and the results reach `on_step` as `reduced`.
    loss: Callable[..., tuple]
    # The submodule of `model` whose EMAs the run keeps (default: the whole model).
    ema_source: Any = None
    # Which EMA `loss` receives as `teacher`: the main one by default; None passes None.
    teacher: str | None = MAIN_EMA
    # The named evaluations (see Evaluation); each runs at its own cadence and at the end.
    evaluations: list = field(default_factory=list)
    # on_step(now, reduced) once per optimizer step, after the optimizer and EMA updates, on every
    # rank with the same global-batch means (DINO's center, phase changes).
    on_step: Callable[..., None] | None = None
    # Task state that must survive a resume (an object with state_dict / load_state_dict).
    state: Any = None
    # Seconds batches: duration(i) -> seconds of training item i (its measure). None: samples.
    duration: Callable[[int], float] | None = None
    # loss_measure(batch) -> what the loss of this collated micro-batch is a mean over, where that is not
    # its items' measure (a slot planned by its own seconds that trains on audio of another length). The
    # loop weights each micro-batch by it over the step's total, summed over ranks; the clock still counts
    # the batch measure. None: the batch measure weights.
    loss_measure: Callable[[Any], float] | None = None
    # The metric the progress bar shows (the task's own loss, not loss plus auxiliary terms).
    progress_metric: str = "loss"
    # Parameters that get no weight decay (biases and norms when the recipe skips them).
    no_decay: set = field(default_factory=set)  # names of parameters of `model`
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
    # DataLoader worker processes (None: the loop decides; 0 on CPU, up to 8 on GPU).
    num_workers: int | None = None
