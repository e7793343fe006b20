"""A Hugging Face `Trainer` with an EMA. transformers has no EMA of its own; the usual pattern is a
`TrainerCallback` around torch's `AveragedModel` with `get_ema_multi_avg_fn`, updated at every optimizer
step. Its port is emarule's `EmaCallback`, which reads the global batch from the TrainingArguments
(per-device batch × processes × gradient accumulation) and applies ρ^(global batch / base batch).

`train_torch_ema` is that pattern; `train_emarule` is the port. Needs `pip install 'emarule[hf]'`. The
example prints the diff size and the results; run it with

    .venv/bin/python examples/hf_trainer.py      # a few seconds on a CPU

Measured here (that command, with the Makefile's torch 2.14.1; another torch or CPU moves the last digits):

    torch AveragedModel in a TrainerCallback → emarule EmaCallback
    the port changes 6 lines of the peer's loop (6 removed, 1 added; `train_torch_ema` → `train_emarule`)
    held-out digits; distance = mean total variation to the κ=1 EMA's predictions
      κ=1 AveragedModel callback         EMA accuracy 0.869  distance 0.000
      κ=1 emarule EmaCallback            EMA accuracy 0.869  distance 0.000
      κ=4 AveragedModel (no rule)        EMA accuracy 0.834  distance 0.378
      κ=4 emarule EmaCallback (ρ^κ)      EMA accuracy 0.859  distance 0.037
"""

import tempfile
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

import emarule
from _common import X_TRAIN, Y_TRAIN, mlp, report
from emarule.integrations.hf import EmaCallback

RECIPE = {"batch": {"size": 32}, "optimizer": {"name": "sgd", "lr": 0.05}, "ema": {"momentum": 0.99}}
BASE, RHO, EPOCHS = RECIPE["batch"]["size"], RECIPE["ema"]["momentum"], 10


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Digits(torch.utils.data.Dataset):
    def __len__(self):
        return len(X_TRAIN)

    def __getitem__(self, i):
        return {"x": X_TRAIN[i], "labels": Y_TRAIN[i]}


def trainer(model, batch, lr, callbacks, out):
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, num_train_epochs=EPOCHS,
                             learning_rate=lr, lr_scheduler_type="constant", optim="sgd", weight_decay=0.0,
                             dataloader_drop_last=True, use_cpu=True, report_to=[], disable_tqdm=True,
                             logging_strategy="no", save_strategy="no", remove_unused_columns=False, seed=0)
    t = Trainer(model=model, args=args, train_dataset=Digits(), callbacks=callbacks)
    t.remove_callback(PrinterCallback)  # it prints the run's timings
    return t


def train_torch_ema(batch, lr, out):
    class EmaCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(RHO))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.ema.update_parameters(model)

    ema = EmaCallback()
    trainer(Classifier(), batch, lr, [ema], out).train()
    return ema.ema.module.net


def train_emarule(batch, lr, out):
    ema = EmaCallback(RHO, base_batch_size=BASE)
    trainer(Classifier(), batch, lr, [ema], out).train()
    return ema.ema.module.net


def run(kappa, train):
    plan = emarule.scale(RECIPE, kappa)  # the optimizer's rule (SGD: lr × κ) in both
    with tempfile.TemporaryDirectory() as out:
        return train(int(plan["batch_size"]), plan["optimizer.lr"], out)


def main():
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    base = run(1, train_emarule)
    report("torch AveragedModel in a TrainerCallback → emarule EmaCallback", train_torch_ema, train_emarule, [
        ("κ=1 AveragedModel callback", run(1, train_torch_ema)),
        ("κ=1 emarule EmaCallback", base),
        ("κ=4 AveragedModel (no rule)", run(4, train_torch_ema)),
        ("κ=4 emarule EmaCallback (ρ^κ)", run(4, train_emarule)),
    ], base)


if __name__ == "__main__":
    main()
