"""emarule.integrations.hf: what each update is charged (the batch the Trainer really trains with, a short
window at the end of an epoch) and a resume with another global batch."""

import pytest
from transformers import TrainerCallback

from emarule.integrations.hf import EmaCallback
from test_integrations_hf import BASE, RHO, Regression, train


def clock(cb):
    return cb.ema.get_extra_state()["samples_seen"]


class FitsFour(Regression):
    """A model whose batches above 4 'run out of memory': auto_find_batch_size halves 16 to 8, then to 4."""

    def forward(self, x, labels=None):
        if len(x) > 4:
            raise RuntimeError("CUDA out of memory. (simulated)")
        return super().forward(x, labels)


class Momenta(TrainerCallback):
    """The ρ each update of `cb` applies (registered after it: its EMA exists by then). on_train_begin comes
    again after each out-of-memory retry: the EMA is wrapped once."""

    def __init__(self, cb):
        self.cb, self.rhos, self.update = cb, [], None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.update is None:
            self.update, self.cb.ema.update = self.cb.ema.update, self.spy

    def spy(self, model, **kw):
        self.rhos.append(self.update(model, **kw))
        return self.rhos[-1]


def test_auto_find_batch_size_charges_the_batch_the_trainer_trains_with(tmp_path):
    cb = EmaCallback(RHO, base_batch_size=BASE)
    spy = Momenta(cb)
    train(tmp_path, [cb, spy], steps=3, model=FitsFour(), per_device_train_batch_size=16,
          gradient_accumulation_steps=1, auto_find_batch_size=True)
    assert cb.global_batch == 4 and clock(cb) == 3 * 4  # not 3 steps × the 16 asked for
    assert spy.rhos == pytest.approx([RHO] * 3)


def test_a_short_window_at_the_end_of_an_epoch_is_charged_its_batches(tmp_path):
    # 8 batches of 8 per epoch at 3 per step: windows of 3, 3 and 2 batches (24, 24, 16 samples).
    cb = EmaCallback(RHO, base_batch_size=BASE)
    spy = Momenta(cb)
    train(tmp_path, [cb, spy], steps=-1, num_train_epochs=1, gradient_accumulation_steps=3)
    assert cb.global_batch == 24 and clock(cb) == 64  # not 3 steps × 24
    assert spy.rhos == pytest.approx([RHO ** 6, RHO ** 6, RHO ** 4])


def test_resume_with_another_global_batch_continues_the_clock(tmp_path):
    first = EmaCallback(RHO, base_batch_size=BASE)
    train(tmp_path, [first], steps=4, save_steps=4)  # 4 steps of 16
    folder = str(tmp_path / "checkpoint-4")
    for accumulate in (4, 1):  # as after moving to more or fewer devices: the clock jumped, or went backwards
        cb = EmaCallback(RHO, base_batch_size=BASE, resume_from=folder)
        train(tmp_path / f"acc{accumulate}", [cb], steps=6, resume=folder, gradient_accumulation_steps=accumulate)
        assert clock(cb) == 64 + 2 * 8 * accumulate
