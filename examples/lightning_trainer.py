"""A Lightning `Trainer` with an EMA: Lightning's own `EMAWeightAveraging` callback ported to emarule's
`EmaCallback`, which reads the global batch from the trainer (per-device batch × processes × accumulation)
and applies ρ^(global batch / base batch) at every optimizer step.

`train_lightning` uses Lightning's callback as its docs show; `train_emarule` is the port. Needs
`pip install 'emarule[lightning]'`. The example prints the diff size and the results; run it with

    .venv/bin/python examples/lightning_trainer.py      # a few seconds on a CPU

Measured here (that command, with the Makefile's torch 2.14.1; another torch or CPU moves the last digits):

    Lightning EMAWeightAveraging → emarule EmaCallback
    the port changes 2 lines of the peer's loop (2 removed, 2 added; `train_lightning` → `train_emarule`)
    held-out digits; distance = mean total variation to the κ=1 EMA's predictions
      κ=1 Lightning EMAWeightAveraging   EMA accuracy 0.872  distance 0.000
      κ=1 emarule EmaCallback            EMA accuracy 0.872  distance 0.000
      κ=4 EMAWeightAveraging (no rule)   EMA accuracy 0.836  distance 0.378
      κ=4 emarule EmaCallback (ρ^κ)      EMA accuracy 0.861  distance 0.037
"""

import logging
import warnings

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

import emarule
from _common import X_TRAIN, Y_TRAIN, mlp, report
from emarule.integrations.lightning import EmaCallback

RECIPE = {"batch": {"size": 32}, "optimizer": {"name": "sgd", "lr": 0.05}, "ema": {"momentum": 0.99}}
BASE, RHO, EPOCHS = RECIPE["batch"]["size"], RECIPE["ema"]["momentum"], 10


class Classifier(L.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.net, self.lr = mlp(), lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(batch):
    """The same sample order at every batch size: one seeded permutation per epoch, grouped by `batch`."""
    return DataLoader(TensorDataset(X_TRAIN, Y_TRAIN), batch_size=batch, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(0))


def trainer(callbacks):
    return L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)


def train_lightning(batch, lr):
    model = Classifier(lr)
    ema = EMAWeightAveraging(decay=RHO)
    trainer([ema]).fit(model, loader(batch))
    return model.net


def train_emarule(batch, lr):
    model = Classifier(lr)
    ema = EmaCallback(RHO, base_batch_size=BASE)
    trainer([ema]).fit(model, loader(batch))
    return ema.ema.module.net


def run(kappa, train):
    plan = emarule.scale(RECIPE, kappa)  # the optimizer's rule (SGD: lr × κ) in both
    return train(int(plan["batch_size"]), plan["optimizer.lr"])


def main():
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # Lightning's advice about DataLoader workers
    base = run(1, train_emarule)
    report("Lightning EMAWeightAveraging → emarule EmaCallback", train_lightning, train_emarule, [
        ("κ=1 Lightning EMAWeightAveraging", run(1, train_lightning)),
        ("κ=1 emarule EmaCallback", base),
        ("κ=4 EMAWeightAveraging (no rule)", run(4, train_lightning)),
        ("κ=4 emarule EmaCallback (ρ^κ)", run(4, train_emarule)),
    ], base)


if __name__ == "__main__":
    main()
