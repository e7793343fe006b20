"""Run by tests/integrations/test_integrations_lightning.py, alone or under torchrun: fit 4 optimizer steps of a tiny
regression with EmaCallback and save the EMA (rank 0). Global batch 16 either way: 16 per device in one
process, or 8 per device in each of 2 (each rank takes every other sample: the same batches)."""

import logging
import os
import sys
import warnings

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from emarule.integrations.lightning import EmaCallback
from emarule.engine.distributed import exit_process


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


def main(out: str, processes: int) -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, x.sum(1, keepdim=True))
    # In order on each rank (Lightning's own sampler would shuffle): rank r takes samples r, r + 2, ...
    sampler = (DistributedSampler(data, processes, int(os.environ["RANK"]), shuffle=False) if processes > 1
               else None)
    loader = DataLoader(data, batch_size=16 // processes, sampler=sampler)
    cb = EmaCallback(0.9, base_batch_size=4)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=processes, strategy="ddp" if processes > 1 else "auto",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb], use_distributed_sampler=False)
    trainer.fit(Regression(), loader)
    if trainer.global_rank == 0:
        torch.save({"ema": cb.ema.module.state_dict(), "global_batch": cb.global_batch,
                    "world_size": trainer.world_size}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    # A launched rank leaves as emarule's own do: barrier, destroy, and no interpreter teardown (gloo aborts there).
    exit_process(0)
