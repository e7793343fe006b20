"""Processes, devices and data order: the one module that reads the torchrun environment.

`python -m emarule run ...` runs as one process; `torchrun --nproc_per_node N -m emarule run ...`
sets RANK / WORLD_SIZE / LOCAL_RANK and `setup()` joins the process group (gloo on CPU, nccl on
GPU). Everything else in the engine asks this module for the rank, the device and the share of
a global batch that this process computes.

Data order depends only on (seed, epoch, sample index), never on the world size or on the
micro-batching: every epoch has one global permutation drawn from a generator seeded by
(seed, epoch); global batch i is the contiguous slice [i·B, (i+1)·B) of it; rank r takes the
r-th of W equal shares of that slice and cuts it into micro-batches of at most
`--max-device-batch` samples. The loss of a micro-batch is weighted by its size over the global
batch size, the weighted gradients are summed over micro-batches and over ranks (all-reduce SUM),
so every optimizer step sees the gradient of the mean loss over the global batch.

Exact equivalence across world sizes and micro-batchings (up to the order of floating-point
sums) therefore holds for models without BatchNorm, and for SyncBatchNorm without
accumulation; BatchNorm normalizes each micro-batch by its own statistics, so per-device batch
composition then changes the function being trained.

We sum gradients with an explicit all-reduce after the last micro-batch instead of wrapping the
model in DistributedDataParallel: a task's loss calls submodules of the model and the EMA teacher
directly (BYOL's online network, predictor and probe), which DDP's forward-hook bookkeeping does
not follow. `wrap_ddp` is kept for tasks that forward through the root module only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from emarule.errors import UserError


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized_here: bool  # this module called init_process_group (and will destroy it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_STATE: Dist | None = None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer; "
                        f"unset it or run under torchrun") from None


def setup() -> Dist:
    """Join the process group when launched by torchrun; a single process otherwise. Idempotent."""
    global _STATE
    if _STATE is not None:
        return _STATE
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", 0)
    if torch.cuda.is_available():
        device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    here = False
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        if not dist.is_available():
            raise UserError("WORLD_SIZE > 1 but this torch build has no torch.distributed; run one process")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30),
                                **({"device_id": device} if device.type == "cuda" else {}))
        here = True
    _STATE = Dist(rank, world, local, device, here)
    return _STATE


def state() -> Dist:
    return setup()


def teardown() -> None:
    """Leave the process group if `setup` joined it (so tests can call train() twice)."""
    global _STATE
    if _STATE is not None and _STATE.initialized_here and dist.is_initialized():
        dist.destroy_process_group()
    _STATE = None


def world_size() -> int:
    return state().world_size


def rank() -> int:
    return state().rank


def is_main() -> bool:
    return state().is_main


def device() -> torch.device:
    return state().device


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if _active():
        dist.barrier()


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (no-op in one process)."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, src: int = 0):
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (on every rank)."""
    if not _active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


_BUCKET_ELEMENTS = 2**24  # 64 MB of fp32 per all-reduce call


def _buckets(tensors: list[torch.Tensor]):
    by_key: dict = {}
    for t in tensors:
        by_key.setdefault((t.device, t.dtype), []).append(t)
    for group in by_key.values():
        bucket, size = [], 0
        for t in group:
            bucket.append(t)
            size += t.numel()
            if size >= _BUCKET_ELEMENTS:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket


def all_reduce_grads_(params: list[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks, flattened into large buckets (one collective per bucket)."""
    if not _active():
        return
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    for bucket in _buckets(grads):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for g, r in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            g.copy_(r)


def _broadcast_(tensors: list[torch.Tensor], src: int) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    with torch.no_grad():
        for bucket in _buckets(tensors):
            flat = _flatten_dense_tensors(bucket)
            dist.broadcast(flat, src=src)
            for t, r in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                t.copy_(r)


def broadcast_module_(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank start from rank 0's parameters and buffers (as DDP does at construction)."""
    if _active():
        _broadcast_([t.data for t in list(module.parameters()) + list(module.buffers())], src)


def broadcast_buffers_(module: torch.nn.Module, src: int = 0) -> None:
    """Rank 0's BatchNorm running statistics win, as with DDP(broadcast_buffers=True)."""
    if _active():
        _broadcast_([b.data for b in module.buffers()], src)


def sync_batchnorm_possible(sync_bn: bool) -> bool:
    """SyncBatchNorm needs several replicas and an accelerator (torch has no CPU kernel for it)."""
    return sync_bn and world_size() > 1 and device().type != "cpu"


def maybe_sync_batchnorm(model: torch.nn.Module, sync_bn: bool) -> torch.nn.Module:
    """SyncBatchNorm across replicas when the spec asks for it and it can run here.

    Children are replaced in place, so references a task holds to submodules stay valid. On CPU
    (gloo) the spec's sync_bn is dropped with a warning: each process then normalizes by its own
    share of the batch, as plain BatchNorm under DDP does.
    """
    if sync_bn and world_size() > 1 and device().type == "cpu" and is_main():
        import sys

        print("warning: norm.sync_bn is set, but SyncBatchNorm has no CPU implementation; "
              "each process normalizes its own share of the batch", file=sys.stderr)
    if not sync_batchnorm_possible(sync_bn):
        return model
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def wrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    """DistributedDataParallel for tasks that forward only through the root module (unused here)."""
    if world_size() <= 1:
        return model
    d = device()
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[d.index] if d.type == "cuda" else None)


# --- batch arithmetic and data order -----------------------------------------------------------


@dataclass(frozen=True)
class BatchLayout:
    """How one global batch is computed: W ranks × A micro-batches of (nearly) equal size."""

    global_batch: int
    world_size: int
    accumulation: int  # micro-batches per rank per optimizer step
    per_rank: int  # global_batch / world_size

    @property
    def micro_sizes(self) -> list[int]:
        """Sizes of this rank's micro-batches (they differ by at most one sample)."""
        q, r = divmod(self.per_rank, self.accumulation)
        return [q + 1 if i < r else q for i in range(self.accumulation)]

    @property
    def max_micro(self) -> int:
        return max(self.micro_sizes)


def layout(global_batch: float, world: int, max_device_batch: int | None) -> BatchLayout:
    """The accumulation needed to fit `global_batch` on `world` devices of `max_device_batch` samples."""
    if abs(global_batch - round(global_batch)) > 1e-6 or round(global_batch) < 1:
        raise UserError(f"the scaled batch κB = {global_batch:g} is not a whole number of samples; "
                        f"choose κ so that κ × batch.size is an integer (or pass --batch-size)")
    b = int(round(global_batch))
    if b % world:
        raise UserError(f"the global batch {b} does not split over {world} processes; use a world size "
                        f"that divides it (or a κ whose batch is a multiple of {world})")
    per_rank = b // world
    acc = 1 if not max_device_batch else math.ceil(per_rank / max_device_batch)
    return BatchLayout(b, world, acc, per_rank)


def _mix(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64), so (seed, epoch) pairs never collide trivially."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
        x = x * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 29
    return x & 0x7FFFFFFFFFFFFFFF


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_mix(seed, epoch, 0xDA7A))
    return torch.randperm(n, generator=g)


def rank_micro_batches(perm: torch.Tensor, batch_index: int, lay: BatchLayout, rank_: int) -> list[list[int]]:
    """This rank's micro-batches (lists of sample indices) of global batch `batch_index`."""
    start = batch_index * lay.global_batch + rank_ * lay.per_rank
    mine = perm[start:start + lay.per_rank].tolist()
    out, i = [], 0
    for size in lay.micro_sizes:
        out.append(mine[i:i + size])
        i += size
    return out
