"""emarule.integrations.lightning: what each update is charged (short windows, manual optimization), a resume
with another global batch, and when the EMA is built (after Lightning casts the model)."""

import warnings

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from emarule.integrations.lightning import EmaCallback
from test_integrations_lightning import BASE, RHO, Regression, fit, loader


def clock(cb):
    return cb.ema.get_extra_state()["samples_seen"]


def run(model, callbacks, data=None, **trainer_kwargs):
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **trainer_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data or loader())
    return trainer


def test_a_short_window_at_the_end_of_an_epoch_is_charged_its_samples():
    # 8 batches of 8 per epoch at 3 per step: windows of 3, 3 and 2 batches (24, 24, 16 samples).
    cb = EmaCallback(RHO, base_batch_size=BASE)
    x = torch.randn(60, 4, generator=torch.Generator().manual_seed(1))  # the last batch holds 4
    trainer = run(Regression(), [cb], DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8),
                  max_epochs=2, accumulate_grad_batches=3)
    assert trainer.global_step == 6 and cb.global_batch == 24
    assert clock(cb) == 2 * 60  # the samples trained on, not 6 steps × 24


class TwoOptimizers(Regression):
    """Manual optimization, GAN-style: two optimizers step on every batch (global_step moves by 2)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, _):
        x, y = batch
        first, second = self.optimizers()
        loss = nn.functional.mse_loss(self.net(x), y)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()

    def configure_optimizers(self):
        return (torch.optim.SGD([self.net.weight], lr=0.1), torch.optim.SGD([self.net.bias], lr=0.1))


def test_manual_optimization_charges_each_batch_once():
    cb, rhos = EmaCallback(RHO, base_batch_size=BASE), []

    class Spy(L.Callback):
        def on_train_start(self, trainer, pl_module):
            update = cb.ema.update
            cb.ema.update = lambda m, **kw: rhos.append(update(m, **kw))

    trainer = run(TwoOptimizers(), [cb, Spy()], max_epochs=1)
    assert trainer.global_step == 16  # 8 batches × 2 optimizers
    assert clock(cb) == 64 and len(rhos) == 8
    assert rhos == [RHO ** (8 / BASE)] * 8


class Count(L.Callback):
    """The samples each process really trains on."""

    def __init__(self):
        self.samples = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.samples += len(batch[0])


def test_resume_with_another_global_batch_continues_the_clock(tmp_path):
    first = EmaCallback(RHO, base_batch_size=BASE)
    trainer, _ = fit([first], max_steps=4)  # 4 steps of 16
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    assert clock(first) == 64
    for accumulate in (4, 1):  # as after moving to more or fewer devices: the clock went backwards, or jumped
        cb, count = EmaCallback(RHO, base_batch_size=BASE), Count()
        trainer, _ = fit([cb, count], max_steps=6, ckpt_path=tmp_path / "a.ckpt", accumulate=accumulate)
        assert trainer.global_step == 6 and count.samples > 0
        assert clock(cb) == 64 + count.samples


def test_the_ema_is_built_after_lightning_casts_the_model():
    # precision="64-true" casts the model in the strategy's setup, as a GPU run moves it there: the EMA
    # must be copied after, or it stays float32 (on the CPU, on a GPU run).
    cb = EmaCallback(RHO, base_batch_size=BASE)
    x = torch.randn(16, 4, dtype=torch.float64)
    run(Regression(), [cb], DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8), max_steps=1,
        precision="64-true")
    assert cb.ema.module.net.weight.dtype == torch.float64
