"""Two gloo processes training a model with BatchNorm and no SyncBatchNorm: after every step rank 1 holds
rank 0's running statistics (as DDP's broadcast_buffers does), though each rank normalized its own half
of the batch. Run by torchrun, this file is also the worker: each rank saves its buffers after each step."""

import subprocess
import sys
from pathlib import Path

import torch

# By its package: the torchrun worker, this file run as a script, finds it from the repo root too.
from tests.engine_util import ROOT, env, toy_spec, write_spec

SPEC = toy_spec(**{"toy.batchnorm": True, "norm.sync_bn": False, "schedule.epochs": 2})


def test_every_rank_ends_each_step_with_rank_0s_batchnorm_statistics(tmp_path):
    path = write_spec(tmp_path, SPEC, "bn.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, str(path), str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    zero, one = (torch.load(tmp_path / f"rank{k}.pt", weights_only=True) for k in (0, 1))
    assert len(zero) == len(one) == 8  # 128 samples, a global batch of 32, 2 epochs
    names = {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    for step, (a, b) in enumerate(zip(zero, one, strict=True)):
        assert names <= set(a), sorted(a)
        for n in names:
            assert torch.equal(a[n], b[n]), (step, n)
    # The statistics move with the data: equal because they were sent, not because nothing changed.
    assert not torch.equal(zero[0]["1.running_mean"], zero[-1]["1.running_mean"])


if __name__ == "__main__":
    from emarule.config.load import load_spec
    from emarule.engine import distributed
    from emarule.engine.context import RunContext
    from emarule.engine.loop import train
    from emarule.scaling import plan
    from emarule.tasks import toy

    spec_path, root = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    s = load_spec(path=spec_path)
    ctx = RunContext(spec=s, kappa=2.0, ema_rule="exponential", plan=plan(s, 2.0, "exponential", None),
                     out=root / "two", progressive=None, quiet=True)
    parts = toy.make_parts(ctx)
    snaps, inner = [], parts.on_step

    def on_step(now, reduced):
        # After the step is complete: what the next forward and the EMA teacher read on this rank.
        snaps.append({n: b.detach().clone() for n, b in parts.model.named_buffers()})
        inner(now, reduced)

    parts.on_step = on_step
    rank = distributed.rank()
    train(ctx, parts)
    torch.save(snaps, root / f"rank{rank}.pt")
