"""`EmaCallback` for Hugging Face's `transformers.Trainer`: an `emarule.ModelEma` of the model, updated once per
optimizer step with ρ^(samples of that step / base_batch_size).

    from emarule.integrations.hf import EmaCallback
    ema = EmaCallback(0.999, base_batch_size=256)        # ρ as tuned at a global batch of 256
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[ema])
    trainer.train()
    ema.ema.module                                       # the averaged model

An optimizer step is charged the batch the Trainer trains with (state.train_batch_size under
auto_find_batch_size, which lowers it after an out-of-memory error; else args.train_batch_size: per-device
batch × GPUs of DataParallel) × world_size × the micro-batches it accumulated (fewer than
gradient_accumulation_steps at the end of an epoch). Callbacks never see the batches, so a short last batch
(dataloader_drop_last=False) is charged in full. The EMA's clock goes on from where it was, so a resume
with other devices or accumulation continues it. At every checkpoint the EMA's state is saved beside it
as `ema.pt`.
"""

from __future__ import annotations

import json
import os

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - the extra is not installed
    raise ImportError("emarule.integrations.hf needs transformers: pip install 'emarule[hf]'") from None

from emarule.integrations import bound_model, check_ema_args, global_batch

CHECKPOINT_FILE = "ema.pt"
TRAINER_STATE = "trainer_state.json"  # written by the Trainer into the same checkpoint folder


def _saved_step(folder: str) -> int | None:
    """The optimizer step of the checkpoint in `folder`, from the Trainer's own state file (None: none)."""
    try:
        with open(os.path.join(folder, TRAINER_STATE)) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class EmaCallback(TrainerCallback):
    """`momentum`: ρ at `base_batch_size` (global samples). `resume_from`: a checkpoint folder whose `ema.pt`
    the EMA starts from (pass the folder given to `trainer.train(resume_from_checkpoint=...)`). Other keyword
    arguments go to `emarule.ModelEma`."""

    def __init__(self, momentum: float, base_batch_size: float, *, resume_from: str | None = None, **ema_kwargs):
        from emarule.engine.ema import ModelEma  # noqa: F401  (fail here, not mid-training, if torch is missing)

        if resume_from is not None and not isinstance(resume_from, str | os.PathLike):
            raise TypeError(f"resume_from must be a checkpoint folder's path, got {type(resume_from).__name__}")
        if resume_from is not None and not os.path.isfile(os.path.join(resume_from, CHECKPOINT_FILE)):
            raise FileNotFoundError(f"no {CHECKPOINT_FILE} in {resume_from}; "
                                    f"pass a checkpoint folder this callback saved")
        check_ema_args(momentum, base_batch_size, ema_kwargs)
        self._model: int | None = None  # the id of the model the EMA averages
        self.momentum, self.base_batch_size, self.ema_kwargs = momentum, base_batch_size, ema_kwargs
        self.resume_from = resume_from
        self.ema = None
        self.global_batch: int | None = None  # a full accumulation window on every process
        self._micro = 0  # micro-batches accumulated since the last optimizer step

    def _batch(self, args, state) -> int:
        """Per process and micro-batch. auto_find_batch_size lowers the batch after an out-of-memory error and
        records it in state.train_batch_size; otherwise that field may be the resumed checkpoint's, not ours."""
        if args.auto_find_batch_size and state.train_batch_size:
            return state.train_batch_size
        return args.train_batch_size

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from emarule import ModelEma

        self.global_batch = global_batch(self._batch(args, state), args.world_size, args.gradient_accumulation_steps)
        self._micro = 0
        self._model = bound_model(self._model, model)
        if self.ema is None:
            self.ema = ModelEma(model, self.momentum, base_batch_size=self.base_batch_size, **self.ema_kwargs)
            if self.resume_from is not None:
                self._resume()
                saved = _saved_step(self.resume_from)
                if saved is not None and saved != state.global_step:
                    # The EMA belongs to that step's weights; a Trainer at another step trains other ones.
                    raise ValueError(f"the EMA in {self.resume_from} was saved at step {saved} but the Trainer "
                                     f"starts at step {state.global_step}: pass the same folder to "
                                     f"trainer.train(resume_from_checkpoint=...)")

    def _resume(self) -> None:
        """The saved EMA, or one error naming the file: a damaged or foreign ema.pt leaves the fresh EMA as it is."""
        import torch

        path = os.path.join(self.resume_from, CHECKPOINT_FILE)
        try:
            state = torch.load(path, weights_only=False)
        except Exception:  # a cut-short or foreign file: torch's and pickle's errors are of many kinds
            self.ema = None
            raise ValueError(f"{path} cannot be read (cut short, damaged, or not saved by this callback); resume "
                             f"from a checkpoint folder this callback saved") from None
        try:
            self.ema.load_state_dict(state)
        except (ValueError, TypeError) as e:
            self.ema = None
            raise ValueError(f"{path}: {e}") from None

    def on_substep_end(self, args, state, control, **kwargs):
        self._micro += 1  # a micro-batch that did not end an accumulation window

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # Once per optimizer step, after the micro-batches it accumulated (this one included). The EMA's clock
        # advances by them from wherever it stands: a resume with another global batch continues it.
        micro, self._micro = self._micro + 1, 0
        self.ema.update(model, batch_size=micro * self._batch(args, state) * args.world_size)

    def on_save(self, args, state, control, **kwargs):
        import torch

        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                tmp = os.path.join(folder, f".{CHECKPOINT_FILE}.tmp")
                torch.save(self.ema.state_dict(), tmp)
                os.replace(tmp, os.path.join(folder, CHECKPOINT_FILE))
