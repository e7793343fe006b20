"""Run by tests/integrations/test_integrations_hf.py, alone or under torchrun: 4 optimizer steps of a tiny regression
through transformers' Trainer with EmaCallback, the EMA saved by rank 0. Global batch 16 either way: 16 per
device in one process, or 8 per device in each of 2 (the batches of a sequential sampler, dealt out to the
ranks in turn, cover the same samples)."""

import sys
import warnings

import torch
from torch import nn
from torch.utils.data import SequentialSampler
from transformers import Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

from emarule.integrations.hf import EmaCallback
from emarule.engine.distributed import exit_process


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


class Data(torch.utils.data.Dataset):
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}


class InOrder(Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def main(out: str, processes: int) -> None:
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=out + ".d", per_device_train_batch_size=16 // processes, max_steps=4,
                             learning_rate=0.1, lr_scheduler_type="constant", optim="sgd", weight_decay=0.0,
                             use_cpu=True, report_to=[], disable_tqdm=True, logging_strategy="no",
                             save_strategy="no", remove_unused_columns=False, dataloader_num_workers=0, seed=0,
                             ddp_find_unused_parameters=False)
    cb = EmaCallback(0.9, base_batch_size=4)
    InOrder(model=Regression(), args=args, train_dataset=Data(), callbacks=[cb]).train()
    if args.process_index == 0:
        torch.save({"ema": cb.ema.module.state_dict(), "global_batch": cb.global_batch,
                    "world_size": args.world_size}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    # A launched rank leaves as emarule's own do: barrier, destroy, and no interpreter teardown (gloo aborts there).
    exit_process(0)
