"""Checkpoints that resume exactly, written atomically; SIGTERM turns into a checkpoint.

A checkpoint holds everything the next optimizer step depends on: model, EMA, optimizer,
every rank's RNG states (torch, CUDA, numpy, python), the clock of data seen and the position in
the data order (epoch, items consumed), the task's own state, and the run's fingerprint (plan +
seed) so `--resume` refuses a directory made with other settings. It also keeps what the log needs to
go on as if never stopped: "window", the steps since the last train row (their count and sums, which the
next row averages) and the κ of the last step (loop.window_state; a checkpoint without it resumes with an
empty window and a row at the first step after the resume), and the log's length and SHA-256 up to the
checkpoint ("log", `MetricsLog.digest`), against which `--resume` checks the file. The stage in force is not
stored: it is a function of the clock. Data order and schedules are functions of (seed, data
seen), so with the RNG states restored
a run killed at any point (SIGKILL included) and resumed from its last checkpoint ends, on CPU in
one process, with bitwise the same weights as a run never interrupted.

Written by rank 0 through a temporary file and `os.replace`, so a kill during the write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import io
import random
import signal
from pathlib import Path

import numpy as np
import torch

from emarule.engine import distributed
from emarule.errors import UserError
from emarule.engine.rundir import CHECKPOINT, atomic_write_bytes


# What every checkpoint `save` writes holds, each a dict: the run's state and its fingerprint.
KEYS = ("model", "emas", "optimizer", "clock", "fingerprint")


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """The states `rng_state` took. torch's generators take their state as a CPU ByteTensor, and `load` maps
    the whole checkpoint onto the run's device (a GPU): the states go back to the CPU first."""
    torch.set_rng_state(state["torch"].cpu())
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def path_in(out: Path) -> Path:
    return Path(out) / CHECKPOINT


def save(out: Path, state: dict, name: str = CHECKPOINT) -> Path | None:
    """Every rank calls this (RNG states are gathered); rank 0 writes OUT/NAME (the run's checkpoint, or a
    baseline's snapshot for the runs that start from it: emarule/engine/fork.py). Returns the path on rank 0."""
    rngs = distributed.gather_objects(rng_state())
    p = Path(out) / name
    if distributed.is_main():
        buf = io.BytesIO()
        torch.save({**state, "rng": rngs}, buf)
        atomic_write_bytes(p, buf.getvalue())
    distributed.barrier()
    return p if distributed.is_main() else None


def load(out: Path, device: torch.device) -> dict:
    """The run's checkpoint; a missing one is the caller's to report before anything is written."""
    p = path_in(out)
    if distributed.is_main():
        for stale in Path(out).glob(f".{p.name}.*.tmp"):  # a write cut short by SIGKILL
            stale.unlink(missing_ok=True)
    if not p.exists():
        raise UserError(f"--resume: no checkpoint in {out}; drop --resume to start the run from scratch")
    # Deleting the file would not start the run over (its hparams.json and metrics.jsonl are still a
    # run's record, which a new run refuses), so the fix is the run's own file or a new directory.
    fix = f"put back the checkpoint the run wrote, or start a new run with --out NEW_DIR (or delete {out})"
    try:
        ck = torch.load(p, map_location=device, weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise UserError(f"--resume: cannot read {p} ({type(e).__name__}); {fix}") from None
    # Anything torch can load loads: a list or another program's dict would otherwise fail later as an
    # AttributeError, or be read as a checkpoint "made with other settings".
    if not isinstance(ck, dict) or not all(isinstance(ck.get(k), dict) for k in KEYS):
        raise UserError(f"--resume: {p} is not an emarule checkpoint (it lacks the model, optimizer, clock or "
                        f"settings of a run); {fix}")
    return ck


def restore_rng(ckpt: dict) -> bool:
    """This rank's RNG states, when the checkpoint was made with the same world size."""
    rngs = ckpt.get("rng") or []
    if len(rngs) != distributed.world_size():
        return False
    set_rng_state(rngs[distributed.rank()])
    return True


class StopSignal:
    """SIGTERM (preemption, `kill`) or Ctrl-C sets a flag; the loop checkpoints at the next step and exits.

    A second Ctrl-C stops at once, as usual, without the checkpoint.
    """

    SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}

    def __init__(self):
        self.requested = False
        self.signal_name = ""
        self._previous: dict = {}

    def _handler(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = self.SIGNALS.get(signum, str(signum))

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread (e.g. a notebook worker): no handler
                pass
        return self

    def __exit__(self, *exc):
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous = {}
        return False
