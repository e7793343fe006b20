"""`EmaCallback` for Lightning's Trainer: an `emarule.ModelEma` of the LightningModule, updated once per
optimizer step with ρ^(samples of that step / base_batch_size).

    from emarule.integrations.lightning import EmaCallback
    ema = EmaCallback(0.999, base_batch_size=256)        # ρ as tuned at a global batch of 256
    trainer = L.Trainer(callbacks=[ema], devices=8, accumulate_grad_batches=4)
    trainer.fit(model, loader)                           # loader's batch_size: per device
    ema.ema.module                                       # the averaged model

Each update is charged the samples of the batches trained since the previous one (each batch's length,
× trainer.world_size), so a short last batch or a short accumulation window at the end of an epoch counts
what it held, and under manual optimization two optimizers stepping on one batch charge it once. The EMA's
clock goes on from where it was, so a resume with other devices or accumulation continues it. The EMA is
built in `on_fit_start`, after Lightning has moved and cast the model. Its state is saved in Lightning
checkpoints (the callback's state_dict) and restored on resume. With `validate_with_ema=True` the
validation loop runs with the EMA's weights swapped into the LightningModule (`ModelEma.swap_into`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the extra is not installed
    try:
        import pytorch_lightning as pl
    except ImportError:
        raise ImportError("emarule.integrations.lightning needs Lightning: pip install 'emarule[lightning]'") from None

from emarule.integrations import bound_model, check_ema_args, global_batch


def _per_device_batch(trainer: "pl.Trainer") -> int | None:
    loader = trainer.train_dataloader
    size = getattr(loader, "batch_size", None)
    if size is None:  # a DataLoader built from a batch_sampler
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size


def _batch_length(batch) -> int | None:
    """The first dimension of the batch's first tensor (Lightning's own guess for logging), or None."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = _batch_length(item)
        if n is not None:
            return n
    return None


class EmaCallback(pl.Callback):
    """`momentum`: ρ at `base_batch_size` (global samples). `batch_size`: the per-device batch, when the
    train DataLoader does not state it. `validate_with_ema`: validate with the EMA's weights. Other keyword
    arguments go to `emarule.ModelEma`."""

    def __init__(self, momentum: float, base_batch_size: float, *, batch_size: int | None = None,
                 validate_with_ema: bool = False, **ema_kwargs):
        from emarule.engine.ema import ModelEma  # noqa: F401  (fail here, not mid-fit, if torch is missing)

        if batch_size is not None:
            global_batch(batch_size, 1, 1)
        if not isinstance(validate_with_ema, bool):
            raise ValueError(f"validate_with_ema must be True or False, got {validate_with_ema!r}")
        check_ema_args(momentum, base_batch_size, ema_kwargs)
        self.validate_with_ema = validate_with_ema
        self._model: int | None = None  # the id of the model the EMA averages
        self._swapped = contextlib.ExitStack()
        self.momentum, self.base_batch_size, self.batch_size = momentum, base_batch_size, batch_size
        self.ema_kwargs = ema_kwargs
        self.ema = None
        self.global_batch: int | None = None  # the nominal one: a full accumulation window on every device
        self._per_device: int | None = None
        self._last_step = 0
        self._unsettled = 0  # samples (this process) trained since the last update
        self._pending: dict | None = None

    @property
    def state_key(self) -> str:
        # Two EMAs at different momenta in one Trainer keep separate states in the checkpoint.
        return self._generate_state_key(momentum=self.momentum, base_batch_size=self.base_batch_size)

    def on_fit_start(self, trainer, pl_module) -> None:
        # Not in `setup`: the strategy moves the model to its device and casts it (precision="64-true",
        # "bf16-true") between the two, and an EMA copied before would stay on the CPU in the old dtype.
        self._model = bound_model(self._model, pl_module)
        if self.ema is None:
            from emarule import ModelEma

            self.ema = ModelEma(pl_module, self.momentum, base_batch_size=self.base_batch_size, **self.ema_kwargs)
            if self._pending is not None:
                self._restore(self._pending)

    def on_train_start(self, trainer, pl_module) -> None:
        per_device = self.batch_size or _per_device_batch(trainer)
        if per_device is None:
            raise ValueError("EmaCallback cannot read the per-device batch from the train DataLoader; "
                             "pass EmaCallback(..., batch_size=B) with the batch each device sees")
        self._per_device = per_device
        self.global_batch = global_batch(per_device, trainer.world_size, trainer.accumulate_grad_batches)
        self._last_step, self._unsettled = trainer.global_step, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = _batch_length(batch)
        # A batch whose first dimension is not its samples (longer than the loader's batch) counts as full.
        self._unsettled += n if n is not None and 0 < n <= self._per_device else self._per_device
        # global_step counts optimizer.step() calls: every N batches under accumulation, once per optimizer
        # under manual optimization. Either way the EMA moves once, by the samples trained since the last move.
        if trainer.global_step > self._last_step:
            self.ema.update(pl_module, batch_size=self._unsettled * trainer.world_size)
            self._last_step, self._unsettled = trainer.global_step, 0

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if self.validate_with_ema and self.ema is not None:
            self._swapped.enter_context(self.ema.swap_into(pl_module))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._swapped.close()  # the model's own weights back

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._swapped.close()

    def state_dict(self) -> dict:
        return {} if self.ema is None else {"ema": self.ema.state_dict(), "last_step": self._last_step}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if not isinstance(state, Mapping) or not isinstance(state.get("ema"), Mapping) or isinstance(
                state.get("last_step"), bool) or not isinstance(state.get("last_step"), int):
            raise ValueError("the checkpoint's EmaCallback state is not one an EmaCallback saved (it needs 'ema' and "
                             "'last_step'); resume from a checkpoint of a fit with this callback")
        if self.ema is None:  # restored before on_fit_start: applied once the EMA exists
            self._pending = state
        else:
            self._restore(state)

    def _restore(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
        self._last_step = int(state["last_step"])
        self._pending = None
