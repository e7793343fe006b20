"""emarule.integrations.hf: a few optimizer steps through transformers' real Trainer on CPU."""


import pytest
import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from emarule.integrations.hf import CHECKPOINT_FILE, EmaCallback
from framework_ddp import assert_two_processes_give_the_ema_of_one

RHO, BASE = 0.9, 4  # ρ tuned at a global batch of 4


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}


class Reference(TrainerCallback):
    """The EMA computed by hand from the weights after each optimizer step (on_step_end), registered after
    the EmaCallback, plus each step's global step."""

    def __init__(self, batch):
        self.rho, self.z, self.steps = RHO ** (batch / BASE), None, []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.z = [p.detach().clone() for p in model.parameters()]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.steps.append(state.global_step)
        self.z = [self.rho * z + (1 - self.rho) * p.detach() for z, p in zip(self.z, model.parameters(), strict=True)]


def train(tmp_path, callbacks, steps=4, save_steps=None, resume=None, model=None, **kwargs):
    """`kwargs`: TrainingArguments that differ from these (8 per device × 2 accumulated)."""
    args = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=steps, learning_rate=0.1,
                lr_scheduler_type="constant", optim="sgd", weight_decay=0.0, use_cpu=True, report_to=[],
                disable_tqdm=True, logging_strategy="no", save_strategy="steps" if save_steps else "no",
                save_steps=save_steps or 500, remove_unused_columns=False, dataloader_num_workers=0, seed=0)
    model = model or Regression()
    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), **{**args, **kwargs}), train_dataset=Data(),
            callbacks=callbacks).train(resume_from_checkpoint=resume)
    return model


def test_updates_once_per_optimizer_step_with_the_global_batch(tmp_path):
    cb, ref = EmaCallback(RHO, base_batch_size=BASE), Reference(16)
    calls = []

    class Spy(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            update = cb.ema.update
            cb.ema.update = lambda m, **kw: calls.append(kw) or update(m, **kw)

    model = train(tmp_path, [cb, Spy(), ref])
    assert cb.global_batch == 16  # 8 per device × 1 process × 2 accumulated batches
    assert ref.steps == [1, 2, 3, 4]
    assert calls == [{"batch_size": 16}] * 4
    assert cb.ema.get_extra_state()["samples_seen"] == 4 * 16
    for z, e in zip(ref.z, cb.ema.module.parameters(), strict=True):
        torch.testing.assert_close(e, z)
    assert not torch.equal(next(cb.ema.module.parameters()), next(model.parameters()))


def test_checkpoint_saves_the_ema_and_resume_from_loads_it(tmp_path):
    cb = EmaCallback(RHO, base_batch_size=BASE)
    train(tmp_path, [cb], steps=2, save_steps=2)
    folder = tmp_path / "checkpoint-2"
    assert (folder / CHECKPOINT_FILE).is_file() and not list(folder.glob(f".{CHECKPOINT_FILE}*"))
    resumed = EmaCallback(RHO, base_batch_size=BASE, resume_from=str(folder))
    ref = Reference(16)
    saved = [p.detach().clone() for p in cb.ema.module.parameters()]
    ref.on_train_begin = lambda *a, **k: setattr(ref, "z", [z.clone() for z in saved])
    train(tmp_path, [resumed, ref], steps=4, resume=str(folder))  # the Trainer resumes too: steps 3 and 4
    assert ref.steps == [3, 4]
    for z, e in zip(ref.z, resumed.ema.module.parameters(), strict=True):
        torch.testing.assert_close(e, z)


def test_an_ema_resumed_into_a_trainer_that_starts_again_is_refused(tmp_path):
    cb = EmaCallback(RHO, base_batch_size=BASE)
    train(tmp_path, [cb], steps=2, save_steps=2)
    resumed = EmaCallback(RHO, base_batch_size=BASE, resume_from=str(tmp_path / "checkpoint-2"))
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        train(tmp_path / "b", [resumed], steps=2)


def test_resume_from_a_folder_without_ema_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ema.pt"):
        EmaCallback(RHO, base_batch_size=BASE, resume_from=str(tmp_path))


def test_a_callback_trained_on_one_model_refuses_another(tmp_path):
    cb = EmaCallback(RHO, base_batch_size=BASE)
    train(tmp_path / "a", [cb], steps=2)
    averaged = [p.clone() for p in cb.ema.module.parameters()]
    with pytest.raises(ValueError, match="already averages another model.*its own EmaCallback"):
        train(tmp_path / "b", [cb], steps=2)  # a second Trainer with a new Regression
    assert all(torch.equal(a, p) for a, p in zip(averaged, cb.ema.module.parameters(), strict=True))


@pytest.mark.parametrize("damage", [lambda p: p.write_bytes(p.read_bytes()[:40]),
                                    lambda p: torch.save({"module.weight": "w"}, p)])
def test_a_damaged_ema_file_to_resume_from_is_refused_by_its_name(tmp_path, damage):
    cb = EmaCallback(RHO, base_batch_size=BASE)
    train(tmp_path, [cb], steps=2, save_steps=2)
    damage(tmp_path / "checkpoint-2" / CHECKPOINT_FILE)
    resumed = EmaCallback(RHO, base_batch_size=BASE, resume_from=str(tmp_path / "checkpoint-2"))
    with pytest.raises(ValueError, match=f"{tmp_path / 'checkpoint-2' / CHECKPOINT_FILE}"):
        train(tmp_path, [resumed], steps=4, resume=str(tmp_path / "checkpoint-2"))


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"momentum": float("nan")}, ValueError, "momentum must be a finite number"),
    ({"base_batch_size": 0}, ValueError, "base_batch_size must be a finite number > 0"),
    ({"every": 0}, ValueError, "every must be a whole number"),
    ({"resume_from": 3}, TypeError, "resume_from must be a checkpoint folder's path"),
])
def test_bad_arguments_are_refused_when_the_callback_is_made(kwargs, kind, message):
    with pytest.raises(kind, match=message):
        EmaCallback(**{"momentum": RHO, "base_batch_size": BASE, **kwargs})


@pytest.mark.slow
def test_two_ddp_processes_give_the_ema_of_one(tmp_path):
    """A real 2-process run (torchrun, gloo) at 8 per device: the callback reads the global batch 16 from
    the TrainingArguments and ends with the EMA of one process at 16."""
    assert_two_processes_give_the_ema_of_one("hf_ddp_main.py", tmp_path)
