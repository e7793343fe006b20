"""emarule.integrations.lightning: a few optimizer steps through Lightning's real Trainer on CPU."""

import warnings

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from emarule.integrations.lightning import EmaCallback
from framework_ddp import assert_two_processes_give_the_ema_of_one

RHO, BASE = 0.9, 4  # ρ tuned at a global batch of 4


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Reference(L.Callback):
    """The EMA computed by hand from the weights after each optimizer step, at ρ^(samples trained since the
    last step / BASE): a full step of 8 per device × 2 accumulated is ρ^(16 / BASE)."""

    def __init__(self):
        self.z, self.last, self.samples = None, 0, 0

    def setup(self, trainer, pl_module, stage):
        self.z = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.samples += len(batch[0])
        if trainer.global_step > self.last:
            self.last, rho, self.samples = trainer.global_step, RHO ** (self.samples / BASE), 0
            params = pl_module.parameters()
            self.z = [rho * z + (1 - rho) * p.detach() for z, p in zip(self.z, params, strict=True)]


def loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)  # 8 per device


def fit(callbacks, max_steps, ckpt_path=None, accumulate=2):
    model = Regression()
    trainer = L.Trainer(max_steps=max_steps, accumulate_grad_batches=accumulate, accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about DataLoader workers
        trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return trainer, model


def test_updates_once_per_optimizer_step_with_the_global_batch():
    cb, ref = EmaCallback(RHO, base_batch_size=BASE), Reference()
    trainer, model = fit([cb, ref], max_steps=4)
    assert cb.global_batch == 16  # 8 per device × 1 process × 2 accumulated batches
    assert trainer.global_step == 4 and cb._last_step == 4
    for z, e in zip(ref.z, cb.ema.module.parameters(), strict=True):
        torch.testing.assert_close(e, z)
    assert not torch.equal(next(cb.ema.module.parameters()), next(model.parameters()))


def test_samples_seen_are_steps_times_global_batch():
    cb = EmaCallback(RHO, base_batch_size=BASE)
    calls = []

    class Spy(L.Callback):
        def on_train_start(self, trainer, pl_module):
            update = cb.ema.update
            cb.ema.update = lambda m, **kw: calls.append(kw) or update(m, **kw)

    fit([cb, Spy()], max_steps=3, accumulate=4)
    assert calls == [{"batch_size": 32}] * 3
    assert cb.ema.get_extra_state()["samples_seen"] == 3 * 32


def test_world_size_enters_the_global_batch():
    # The Trainer is built for 2 processes, not launched: world_size and accumulation are read from it.
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", accumulate_grad_batches=3, logger=False)
    cb = EmaCallback(RHO, base_batch_size=BASE, batch_size=8)
    cb.on_train_start(trainer, None)
    assert cb.global_batch == 8 * 2 * 3


def test_resume_from_a_lightning_checkpoint_continues_the_ema(tmp_path):
    first_cb = EmaCallback(RHO, base_batch_size=BASE)
    trainer, _ = fit([first_cb], max_steps=4)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    saved = [p.detach().clone() for p in first_cb.ema.module.parameters()]

    class FromSaved(Reference):  # the hand-made EMA, continued from the saved one over the resumed steps
        def setup(self, trainer, pl_module, stage):
            self.z, self.last = [z.clone() for z in saved], 4

    resumed_cb, ref = EmaCallback(RHO, base_batch_size=BASE), FromSaved()
    trainer, model = fit([resumed_cb, ref], max_steps=6, ckpt_path=tmp_path / "a.ckpt")
    assert resumed_cb._last_step == 6 and ref.last == 6
    for z, e in zip(ref.z, resumed_cb.ema.module.parameters(), strict=True):
        torch.testing.assert_close(e, z)


def test_two_emas_keep_separate_checkpoint_states(tmp_path):
    fast, slow = EmaCallback(0.5, base_batch_size=BASE), EmaCallback(RHO, base_batch_size=BASE)
    trainer, _ = fit([fast, slow], max_steps=4)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    fast2, slow2 = EmaCallback(0.5, base_batch_size=BASE), EmaCallback(RHO, base_batch_size=BASE)
    fit([fast2, slow2], max_steps=4, ckpt_path=tmp_path / "a.ckpt")  # restores, trains no further step
    for before, after in ((fast, fast2), (slow, slow2)):
        for a, b in zip(before.ema.module.parameters(), after.ema.module.parameters(), strict=True):
            torch.testing.assert_close(a, b)


class Validated(Regression):
    """Records the weights that each validation step sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def validation_step(self, batch, _):
        self.seen.append([p.detach().clone() for p in self.parameters()])


def test_validate_with_ema_swaps_the_average_in_and_back():
    runs = {}
    for flag in (True, False):
        cb, model = EmaCallback(RHO, base_batch_size=BASE, validate_with_ema=flag), Validated()
        trainer = L.Trainer(max_steps=4, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, limit_val_batches=1, callbacks=[cb])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, loader(), loader())
        runs[flag] = cb, model
    (cb, model), (_, plain) = runs[True], runs[False]
    assert len(model.seen) == 1 and cb._last_step == 4  # one validation, after the last of 4 steps
    for during, ema, own, reference in zip(model.seen[0], cb.ema.module.parameters(), model.parameters(),
                                           plain.parameters(), strict=True):
        torch.testing.assert_close(during, ema)  # validated with the EMA's weights
        assert not torch.equal(during, own)
        torch.testing.assert_close(own, reference)  # the model's own weights came back: training unchanged
    for during, own in zip(plain.seen[0], plain.parameters(), strict=True):
        torch.testing.assert_close(during, own)  # without the option, validation sees the model
    with pytest.raises(ValueError, match="validate_with_ema must be True or False"):
        EmaCallback(RHO, base_batch_size=BASE, validate_with_ema="yes")


def test_a_loader_without_batch_size_asks_for_it():
    cb = EmaCallback(RHO, base_batch_size=BASE)

    class NoSize:
        batch_size = None

    trainer = type("T", (), {"train_dataloader": NoSize(), "world_size": 1, "accumulate_grad_batches": 1})()
    with pytest.raises(ValueError, match="batch_size=B"):
        cb.on_train_start(trainer, None)
    with pytest.raises(ValueError, match="per-device batch"):
        EmaCallback(RHO, base_batch_size=BASE, batch_size=0)


@pytest.mark.slow
def test_two_ddp_processes_give_the_ema_of_one(tmp_path):
    """A real 2-process run (torchrun, gloo) at 8 per device: the callback reads the global batch 16 and
    ends with the EMA of one process at 16."""
    assert_two_processes_give_the_ema_of_one("lightning_ddp_main.py", tmp_path)


def test_a_callback_fitted_on_one_model_refuses_another():
    cb = EmaCallback(RHO, base_batch_size=BASE)
    fit([cb], max_steps=2)
    averaged = [p.clone() for p in cb.ema.module.parameters()]
    with pytest.raises(ValueError, match="already averages another model.*its own EmaCallback"):
        fit([cb], max_steps=2)  # a new Regression
    assert all(torch.equal(a, p) for a, p in zip(averaged, cb.ema.module.parameters(), strict=True))


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"momentum": 1.5}, ValueError, "momentum 1.5 is not a usable EMA momentum"),
    ({"base_batch_size": "256"}, ValueError, "base_batch_size must be a finite number"),
    ({"device": "nonsense"}, ValueError, "device 'nonsense'"),
    ({"exclude": "net"}, ValueError, "exclude must be a list"),
    ({"colour": "red"}, TypeError, "colour"),
])
def test_bad_arguments_are_refused_when_the_callback_is_made(kwargs, kind, message):
    with pytest.raises(kind, match=message):
        EmaCallback(**{"momentum": RHO, "base_batch_size": BASE, **kwargs})


def test_a_checkpoint_state_that_is_not_the_callbacks_is_refused():
    cb = EmaCallback(RHO, base_batch_size=BASE)
    with pytest.raises(ValueError, match="not one an EmaCallback saved"):
        cb.load_state_dict({"ema": "weights"})
