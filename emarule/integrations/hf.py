"""`EmaCallback` for Hugging Face's `transformers.Trainer`: an `emarule.ModelEma` of the model, updated once per
optimizer step with ρ^(global batch / base_batch_size).

    from emarule.integrations.hf import EmaCallback
    ema = EmaCallback(0.999, base_batch_size=256)        # ρ as tuned at a global batch of 256
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[ema])
    trainer.train()
    ema.ema.module                                       # the averaged model

The global batch is what TrainingArguments make it: train_batch_size (per-device batch × GPUs of
DataParallel) × world_size × gradient_accumulation_steps; samples seen after step t are t × that batch.
At every checkpoint the EMA's state is saved beside it as `ema.pt`.
"""

from __future__ import annotations

import os

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - the extra is not installed
    raise ImportError("emarule.integrations.hf needs transformers: pip install 'emarule[hf]'") from None

from emarule.integrations import global_batch

CHECKPOINT_FILE = "ema.pt"


class EmaCallback(TrainerCallback):
    """`momentum`: ρ at `base_batch_size` (global samples). `resume_from`: a checkpoint folder whose `ema.pt`
    the EMA starts from (pass the folder given to `trainer.train(resume_from_checkpoint=...)`). Other keyword
    arguments go to `emarule.ModelEma`."""

    def __init__(self, momentum: float, base_batch_size: float, *, resume_from: str | None = None, **ema_kwargs):
        from emarule.engine.ema import ModelEma  # noqa: F401  (fail here, not mid-training, if torch is missing)

        if resume_from is not None and not os.path.isfile(os.path.join(resume_from, CHECKPOINT_FILE)):
            raise FileNotFoundError(f"no {CHECKPOINT_FILE} in {resume_from}; "
                                    f"pass a checkpoint folder this callback saved")
        self.momentum, self.base_batch_size, self.ema_kwargs = momentum, base_batch_size, ema_kwargs
        self.resume_from = resume_from
        self.ema = None
        self.global_batch: int | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from emarule import ModelEma

        self.global_batch = global_batch(args.train_batch_size, args.world_size, args.gradient_accumulation_steps)
        if self.ema is None:
            self.ema = ModelEma(model, self.momentum, base_batch_size=self.base_batch_size, **self.ema_kwargs)
            if self.resume_from is not None:
                import torch

                self.ema.load_state_dict(torch.load(os.path.join(self.resume_from, CHECKPOINT_FILE),
                                                    weights_only=False))
        saved = self.ema.get_extra_state()["samples_seen"]
        if self.resume_from is not None and saved is not None and state.global_step * self.global_batch < saved:
            # The EMA's clock is global samples; a Trainer that starts again from step 0 would move it backwards.
            raise ValueError(f"the EMA from {self.resume_from} has seen {saved:g} samples but the Trainer starts at "
                             f"step {state.global_step}: pass the same folder to "
                             f"trainer.train(resume_from_checkpoint=...)")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # Called once per optimizer step, after the accumulation: global_step counts those steps.
        self.ema.update(model, samples_seen=state.global_step * self.global_batch, batch_size=self.global_batch)

    def on_save(self, args, state, control, **kwargs):
        import torch

        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                tmp = os.path.join(folder, f".{CHECKPOINT_FILE}.tmp")
                torch.save(self.ema.state_dict(), tmp)
                os.replace(tmp, os.path.join(folder, CHECKPOINT_FILE))
