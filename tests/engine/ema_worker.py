"""Train a small net with ModelEma in one process or under torchrun (DDP, or FSDP2 `fully_shard`).

Every run sees the same global batches in the same order; under torchrun each rank takes its half
and tells the EMA the GLOBAL samples seen. `torchrun --nproc_per_node 2 tests/engine/ema_worker.py DIR`
trains with DDP, then with FSDP2, and rank 0 writes each run's averaged weights, in full, to
DIR/ddp.pt and DIR/fsdp.pt.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from emarule import ModelEma
from emarule.engine.distributed import exit_process

STEPS, BATCH, BASE = 6, 16, 8  # κ = 2 against the base batch


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


def data() -> tuple:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS * BATCH, 6, generator=g), torch.randint(0, 3, (STEPS * BATCH,), generator=g)


def train(mode: str) -> dict:
    """The averaged weights, full, after STEPS steps; `mode` is one, ddp or fsdp."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if mode != "one" else (0, 1)
    model = net()
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ModelEma(model, 0.9, base_batch_size=BASE)
    partial = ModelEma(model, 0.9, base_batch_size=BASE, exclude=["2"])  # the head copied, not averaged
    x, y = data()
    local = BATCH // world
    for step in range(STEPS):
        lo = step * BATCH + rank * local
        loss = F.cross_entropy(model(x[lo:lo + local]), y[lo:lo + local])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(model, samples_seen=(step + 1) * BATCH)
        partial.update(model, samples_seen=(step + 1) * BATCH)
    check_partial(model, ema, partial)
    if mode != "fsdp":
        return {k: v.clone() for k, v in ema.module.state_dict().items()}
    assert not hasattr(ema, "module")  # a rank holds shards only: evaluate with swap_into
    # each rank's saved state holds its own shards, and a new EMA restores them
    again = ModelEma(model, 0.5)
    again.load_state_dict(ema.state_dict())
    pairs = zip(again.state_dict().values(), ema.state_dict().values(), strict=True)
    assert again.base_batch_size == BASE and all(torch.equal(a, b) for a, b in pairs if torch.is_tensor(a))
    with ema.swap_into(model):
        return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def full(model: nn.Module) -> dict:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone() for k, v in model.state_dict().items()}


def check_partial(model: nn.Module, ema: ModelEma, partial: ModelEma) -> None:
    """The EMA with the head excluded: its head is the model's, the rest is the full EMA's."""
    own = full(model)
    with ema.swap_into(model):
        averaged = full(model)
    with partial.swap_into(model):
        got = full(model)
    inner = getattr(model, "module", model)
    for k, v in got.items():
        want = own[k] if k.removeprefix("module.").startswith("2.") else averaged[k]
        assert torch.equal(v, want), k
    head = dict(partial.shards.named_buffers() if partial._sharded else partial.module.named_parameters())
    for name, p in inner[2].named_parameters():
        shadow = head[f"2/{name}" if partial._sharded else f"2.{name}"]
        assert torch.equal(shadow, p.to_local() if hasattr(p, "to_local") else p), name


if __name__ == "__main__":
    dist.init_process_group("gloo")
    for mode in ("ddp", "fsdp"):
        weights = train(mode)
        if dist.get_rank() == 0:
            torch.save(weights, f"{sys.argv[1]}/{mode}.pt")
    # Every rank meets, leaves the group and ends without the interpreter teardown where gloo aborts (only on
    # success: a failure raises above with its traceback and a non-zero exit).
    exit_process(0)
