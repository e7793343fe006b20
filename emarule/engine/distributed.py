"""Processes and devices: the one module that reads the torchrun environment and knows about ranks.

`python -m emarule run ...` runs as one process; `torchrun --nproc_per_node N -m emarule run ...`
sets RANK / WORLD_SIZE / LOCAL_RANK and `setup()` joins the process group (gloo on CPU, nccl on
GPU). Everything else in the engine asks this module for the rank, the device and the collectives;
which items a rank computes is `emarule.engine.batching`'s arithmetic over (seed, epoch, position).

Gradients are summed with an explicit all-reduce after the last micro-batch instead of wrapping
the model in DistributedDataParallel: a task's loss calls submodules of the model and the EMA
teacher directly (BYOL's online network, predictor and probe), which DDP's forward-hook
bookkeeping does not follow. Exact equivalence across world sizes and micro-batchings (up to the
order of floating-point sums) holds for models without BatchNorm, and for SyncBatchNorm without
accumulation; BatchNorm normalizes each micro-batch by its own statistics, so per-device batch
composition then changes the function being trained.

Reading the environment (`rank`, `world_size`, `is_main`) imports no torch: the CLI, the run-directory lock
and the studies ask it too, and a torch-free command stays torch-free. torch is imported by the functions
that need it.
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from emarule.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    local_world_size: int = 1  # processes on this node (torchrun's LOCAL_WORLD_SIZE)

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


RENDEZVOUS_ENV = ("RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets beside WORLD_SIZE


def check_launch() -> None:
    """A WORLD_SIZE above 1 needs the rendezvous torchrun sets up; without it torch fails deep in its own
    rendezvous (or waits for peers that were never started), so it is refused here in the launcher's words.
    Torch-free: the command line asks before it writes anything."""
    world, rank, local = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world < 1:
        raise UserError(f"environment variable WORLD_SIZE={world} must be ≥ 1; unset it to run one process")
    if world == 1:
        return
    missing = [n for n in RENDEZVOUS_ENV if not os.environ.get(n)]
    if missing:
        raise UserError(f"WORLD_SIZE={world} is set but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        f"not: launch with torchrun (e.g. torchrun --nproc-per-node {world} -m emarule run ...), or "
                        f"unset WORLD_SIZE to run one process")
    if not 0 <= rank < world or local < 0:
        raise UserError(f"RANK={rank} (LOCAL_RANK={local}) does not fit WORLD_SIZE={world}; launch with torchrun, "
                        f"which sets them, or unset WORLD_SIZE to run one process")


DEVICE_ENV = "EMARULE_DEVICE"  # auto (the default), cpu or cuda


def device_type() -> str:
    """"cuda" or "cpu": $EMARULE_DEVICE, or a GPU when torch sees one. `cpu` keeps a GPU machine's runs on the
    CPU (the test suite's bit-exact checks are CPU checks; cuDNN's kernels are not deterministic)."""
    import torch

    asked = os.environ.get(DEVICE_ENV, "").strip().lower() or "auto"
    if asked not in ("auto", "cpu", "cuda"):
        raise UserError(f"{DEVICE_ENV}={asked!r}: use auto, cpu or cuda")
    if asked == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if asked == "cuda":
        raise UserError(f"{DEVICE_ENV}=cuda, but torch {torch.__version__} sees no CUDA GPU; unset it to train on "
                        f"the CPU")
    return "cpu"


def setup() -> Dist:
    """Join the process group when launched by torchrun; a single process otherwise. Idempotent."""
    global _STATE
    if _STATE is not None:
        return _STATE
    import torch
    import torch.distributed as dist

    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", 0)
    here = _env_int("LOCAL_WORLD_SIZE", 0)  # 0: not set (a launcher other than torchrun)
    check_launch()
    if device_type() == "cuda":
        gpus = torch.cuda.device_count()
        if world > 1 and here > gpus:  # two ranks on one GPU: nccl refuses it only at the first collective
            raise UserError(f"torchrun started {here} processes on this node, which has {gpus} GPU(s); use "
                            f"--nproc-per-node {gpus}, or CUDA_VISIBLE_DEVICES= to train on the CPU with gloo")
        device = torch.device("cuda", local % gpus)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        if not dist.is_available():
            raise UserError("WORLD_SIZE > 1 but this torch build has no torch.distributed; run one process")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30),
                                **({"device_id": device} if device.type == "cuda" else {}))
        atexit.register(_leave_group)
    # Without LOCAL_WORLD_SIZE every process is taken to share this node's cores.
    _STATE = Dist(rank, world, local, device, local_world_size=here or world)
    return _STATE


def state() -> Dist:
    return setup()


def teardown() -> None:
    """Forget this run's state (so a sweep, or a test, can call train() again in this process).

    The process group itself stays joined until the process exits: a sweep under torchrun trains run
    after run, and joining the launcher's store again after leaving it could wait forever at the
    rendezvous of the second run.
    """
    global _STATE
    _STATE = None


def _group():
    """torch.distributed when this process is in a process group, else None. Imports nothing: a process
    that never imported torch.distributed is in no group."""
    d = sys.modules.get("torch.distributed")
    return d if d is not None and d.is_available() and d.is_initialized() else None


def _leave_group(timeout_s: float | None = None) -> None:
    dist = _group()
    if dist is not None:
        # gloo can abort a process ("terminate called without an active exception") that tears the group
        # down while a peer's last messages are in flight: meet every rank first. Bounded, because a peer
        # that already failed never arrives.
        try:
            dist.barrier(async_op=True).wait(timeout=timedelta(seconds=timeout_s or LEAVE_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - a failed or timed-out peer: leave without tearing down
            # destroy_process_group waits for the collectives in flight, and a peer blocked in one (its
            # all-reduce of a step this rank never reached) would keep this process alive forever
            return
        dist.destroy_process_group()


LEAVE_TIMEOUT_S = 60
# An error that one rank alone met (a file only its shard reads) leaves its peers in a collective: they never
# reach the barrier, so a failing process waits for them only briefly.
ERROR_LEAVE_TIMEOUT_S = 10


def peer_stopped(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another process of the launch went away (it ended on
    an error of its own, which it has printed)."""
    if _group() is None or not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return any(s in text for s in ("connection closed by peer", "connection reset by peer", "broken pipe",
                                   "socket closed"))


def exit_process(code: int) -> None:
    """End a process of a launch now: leave the group, flush, and skip the interpreter's teardown, where
    gloo's worker threads can still free work objects that need the GIL and the process aborts ("terminate
    called without an active exception") after its work was done and saved. Returns at once for a
    process that is in no group."""
    if _group() is None:
        return
    _leave_group(ERROR_LEAVE_TIMEOUT_S if code else None)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def world_size() -> int:
    return _STATE.world_size if _STATE is not None else _env_int("WORLD_SIZE", 1)


def rank() -> int:
    # Outside training (before or after it: the CLI deciding who prints) the launcher's
    # environment answers; asking must not join a process group that nothing would leave.
    return _STATE.rank if _STATE is not None else _env_int("RANK", 0)


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    return state().device


def _active() -> bool:
    dist = _group()
    return dist is not None and dist.get_world_size() > 1


def in_group() -> bool:
    """Whether this process is one of several in a process group (reads no environment, imports no torch)."""
    return _active()


def barrier() -> None:
    if _active():
        import torch.distributed as dist

        dist.barrier()


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (no-op in one process)."""
    if _active():
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (on every rank)."""
    if not _active():
        return [obj]
    import torch.distributed as dist

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
    """Sum gradients over ranks, flattened into large buckets (one collective per bucket).

    A parameter with no gradient (grad None: nothing in the batch reached it) is what one process over the
    whole batch would see only when no rank gave it one: a flag per parameter, summed over ranks first,
    decides. Given by some rank, the others add zeros; given by none, it keeps grad None on every rank,
    so the optimizer leaves it alone (no weight decay, no step count), as in one process.
    """
    if not _active() or not params:
        return
    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    has_grad = [p.grad is not None for p in params]
    given = torch.tensor(has_grad, dtype=torch.float32, device=state().device)
    dist.all_reduce(given, op=dist.ReduceOp.SUM)
    anyone = [n > 0 for n in given.tolist()]
    for p, m, a in zip(params, has_grad, anyone, strict=True):
        if a and not m:  # the all-reduce needs the same tensors on every rank
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p, a in zip(params, anyone, strict=True) if a]
    for bucket in _buckets(grads):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for g, r in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            g.copy_(r)


def _broadcast_(tensors: list[torch.Tensor], src: int) -> None:
    import torch
    import torch.distributed as dist
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
        print("warning: norm.sync_bn is set, but SyncBatchNorm has no CPU implementation; "
              "each process normalizes its own share of the batch", file=sys.stderr)
    if not sync_batchnorm_possible(sync_bn):
        return model
    import torch

    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def to_device(batch, device: torch.device):
    """Tensors of a (nested) batch onto `device`; the loop moves each batch once, tasks never do."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
