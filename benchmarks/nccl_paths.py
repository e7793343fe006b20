"""The nccl code paths on one GPU: one short run trained three times, the checkpoints compared.

Two processes on one GPU are not a test of nccl, and with one process `emarule run` joins no group. So
one run is started by torchrun (one process) inside a 1-rank nccl group with the engine's collectives
switched on (`distributed._active`): the all-reduce of the loss and metrics at every step and the
broadcast of the weights at the start go through nccl on CUDA tensors (the gradients' all-reduce runs
only with world size > 1, so it is not covered). Over one rank a sum and a broadcast are the identity,
so that run must differ from a plain run no more than two plain runs differ from each other (cuDNN's
kernels are not all deterministic: that is the floor).

    python benchmarks/nccl_paths.py [EXPERIMENT] [--preset tiny]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(argv: list[str]) -> None:
    """Inside torchrun: join nccl with one rank, force the collectives on, run the CLI."""
    import torch
    import torch.distributed as dist

    from emarule.cli.main import main
    from emarule.engine import distributed

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    calls = {"n": 0}  # every all-reduce of the engine goes through here
    inner = dist.all_reduce

    def counted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:  # the run may end with os._exit (distributed.exit_process): say it now
            print(f"an all-reduce through {dist.get_backend()} on {a[0].device}", flush=True)
        return inner(*a, **k)

    dist.all_reduce = counted
    distributed._active = lambda: True
    sys.argv = ["emarule", *argv]
    try:
        main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="?", default="polyak-r50")
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("nccl_paths: needs a CUDA GPU")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "WANDB_MODE": "disabled"}
    with tempfile.TemporaryDirectory() as tmp:
        run = ["run", args.experiment, "--preset", args.preset]
        cmds = {name: [sys.executable, "-m", "emarule", *run, "--out", f"{tmp}/{name}"] for name in ("plain", "again")}
        cmds["nccl"] = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                        __file__, "--worker", *run, "--out", f"{tmp}/nccl"]
        for cmd in cmds.values():
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            print(r.stdout[-600:], r.stderr[-2000:] if r.returncode else "", sep="")
            if r.returncode:
                raise SystemExit(f"nccl_paths: {' '.join(cmd[:6])} … failed ({r.returncode})")
        ckpt = {n: torch.load(f"{tmp}/{n}/checkpoint.pt", map_location="cpu", weights_only=False) for n in cmds}
        floor, got = gap(ckpt["plain"], ckpt["again"]), gap(ckpt["plain"], ckpt["nccl"])
        ok = got <= floor
        print(f"nccl_paths {args.experiment} --preset {args.preset}: largest |Δ| over the weights and EMAs, "
              f"nccl run − plain run {got:.3g}, plain run − the same run again {floor:.3g}: "
              f"{'within' if ok else 'ABOVE'} the floor")
        if not ok:
            raise SystemExit(1)


def gap(a: dict, b: dict) -> float:
    worst = 0.0
    for part in ("model", "emas"):
        flat_a, flat_b = flatten(a[part]), flatten(b[part])
        assert flat_a.keys() == flat_b.keys(), part
        for k, v in flat_a.items():
            if v.is_floating_point():
                worst = max(worst, (v.double() - flat_b[k].double()).abs().max().item())
    return worst


def flatten(tree, prefix: str = "") -> dict:
    import torch

    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}/{k}"))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(ROOT))
        worker(sys.argv[2:])
    else:
        main()
