"""Launch and cluster faults: RNG states resumed on a GPU, a signal during a step, loader workers per node, two
builders of one cache folder, the launcher's environment read in one place, and the Slurm template."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from emarule.engine import checkpoint
from emarule.errors import UserError
from engine_util import ROOT, env, load_checkpoint, run_toy, toy_spec


class Elsewhere(torch.Tensor):
    """A tensor on another device, as `torch.load(map_location=cuda)` makes of a saved RNG state: torch refuses
    it as a generator's state (not a CPU ByteTensor); `.cpu()` gives its data back."""

    @staticmethod
    def __new__(cls, data):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device="meta")
        t.held = data
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and (kwargs or {}).get("device") == torch.device("cpu"):
            return args[0].held.clone()
        raise NotImplementedError(f"{func} on a tensor that is not on the CPU")


def test_rng_states_mapped_to_the_run_device_are_restored(monkeypatch):
    """`--resume` on a GPU: checkpoint.load maps the whole file to the device, RNG states included."""
    state = checkpoint.rng_state()
    expected = torch.rand(4)
    with pytest.raises(TypeError, match="ByteTensor"):  # what torch does with such a state
        torch.set_rng_state(Elsewhere(state["torch"]))
    cuda_states = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", cuda_states.extend)
    moved = {**state, "torch": Elsewhere(state["torch"]), "cuda": [Elsewhere(torch.zeros(16, dtype=torch.uint8))]}
    assert checkpoint.restore_rng({"rng": [moved]})
    assert torch.equal(torch.rand(4), expected)
    assert [(s.device.type, s.dtype) for s in cuda_states] == [("cpu", torch.uint8)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rng_states_of_a_checkpoint_loaded_on_the_gpu_are_restored(tmp_path):
    state = checkpoint.rng_state()
    expected = torch.rand(4)
    torch.save({"rng": [state]}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", map_location=torch.device("cuda", 0), weights_only=False)
    assert ck["rng"][0]["torch"].device.type == "cuda"
    assert checkpoint.restore_rng(ck) and torch.equal(torch.rand(4), expected)


def test_a_signal_during_a_step_checkpoints_after_that_step(tmp_path, monkeypatch):
    """One process: SIGTERM while step 3 runs (after the loop passed its flag in) stops after step 3."""
    from emarule.engine import loop

    inner, steps = loop.optimizer_step, []

    def step_then_signal(*args, **kwargs):
        got = inner(*args, **kwargs)
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return got

    monkeypatch.setattr(loop, "optimizer_step", step_then_signal)
    with pytest.raises(SystemExit) as e:
        run_toy(tmp_path, toy_spec(**{"schedule.epochs": 2}))
    ck = load_checkpoint(tmp_path / "run")
    assert e.value.code == 143 and len(steps) == 3 and ck["clock"]["step"] == 3 and not ck["finished"]


def test_loader_workers_share_the_cores_of_their_node(monkeypatch):
    """2 nodes × 8 GPUs × 64 cores: 7 workers a rank (64 ÷ 8 ranks on the node, less one), not 64 ÷ 16 − 1."""
    import torch.distributed as dist

    from emarule.engine import distributed as D
    from emarule.engine import loop

    for k, v in {"WORLD_SIZE": "16", "RANK": "9", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
                 "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(D, "_STATE", None)
    assert D.setup().local_world_size == 8
    monkeypatch.setattr(D, "_STATE", None)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert D.setup().local_world_size == 16  # no torchrun to say: every rank is taken to be on this node
    monkeypatch.setattr(D, "_STATE", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    unset = SimpleNamespace(num_workers=None)
    for nodes in (1, 2, 4):
        d = D.Dist(rank=0, world_size=8 * nodes, local_rank=0, device=torch.device("cuda", 0), local_world_size=8)
        assert loop.parts_workers(unset, unset, d) == 7, nodes


def test_a_builder_that_finishes_second_keeps_the_first_builders_folder(tmp_path):
    """Two ranks build the same cache folder: the second, done after the first renamed its folder into place,
    must not replace a folder the first is already reading."""
    from emarule.engine.cache import build_once

    root = tmp_path / "cache" / "key"

    def complete(r):
        return (r / "manifest").is_file()

    def builder(name, during=None):
        def build(tmp):
            if during is not None:
                during()  # the other builder starts and finishes while this one builds
            (tmp / "manifest").write_text(name)
        return build

    first = []

    def other():
        build_once(root, builder("first"), complete, "{cache} {reason}")
        first.append((root / "manifest").stat().st_ino)

    assert build_once(root, builder("second", other), complete, "{cache} {reason}") == root
    assert (root / "manifest").read_text() == "first" and (root / "manifest").stat().st_ino == first[0]
    assert [p.name for p in root.parent.iterdir()] == ["key"]  # the second build is gone


@pytest.mark.parametrize("value,main", [("", True), ("0", True), ("1", False)])
def test_the_launchers_rank_reads_the_same_in_every_module(monkeypatch, value, main):
    from emarule.engine import distributed, runlock

    monkeypatch.setenv("RANK", value)
    assert runlock._main_rank() is main and distributed.is_main() is main


def test_a_rank_that_is_not_a_number_is_one_line_everywhere(tmp_path, monkeypatch):
    """RANK=abc: the lock, a study and a training run all refuse it (none takes it for another rank)."""
    from emarule.engine import runlock

    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(UserError, match="RANK='abc' is not an integer"):
        runlock.lock_dir(tmp_path / "d", "run")
    for argv in (["parabola", "--preset", "tiny"], ["dino-vit", "--preset", "tiny"]):
        r = subprocess.run([sys.executable, "-m", "emarule", "run", *argv, "--out", str(tmp_path / argv[0])],
                           cwd=ROOT, env={**env(), "RANK": "abc"}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "error: environment variable RANK='abc' is not an integer; unset it or run under torchrun"], r.stderr
        assert not (tmp_path / argv[0]).exists()


# --- the Slurm template, run by bash with srun and scontrol stood in for --------------------------------------

SBATCH = ROOT / "scripts" / "slurm_a100.sbatch"


def sbatch(tmp_path: Path, *args: str, restarts: int = 0, **extra_env: str) -> list[str]:
    """The arguments the template gives `srun` (one a line); srun's environment's shutdown timeout first."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "srun").write_text('#!/bin/sh\necho "timeout=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT" > "$SRUN_LOG"\n'
                               'for a in "$@"; do echo "$a" >> "$SRUN_LOG"; done\n')
    (bin_ / "scontrol").write_text("#!/bin/sh\necho node0\n")
    for f in ("srun", "scontrol"):
        (bin_ / f).chmod(0o755)
    log = tmp_path / "srun.log"
    e = {k: v for k, v in env().items() if k not in ("RESUME", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")}
    e.update(PATH=f"{bin_}{os.pathsep}{e['PATH']}", PYTHON=sys.executable, SRUN_LOG=str(log), SLURM_JOB_ID="77",
             SLURM_JOB_NODELIST="node0", SLURM_NNODES="1", SLURM_RESTART_COUNT=str(restarts), **extra_env)
    r = subprocess.run(["bash", str(SBATCH), *args], cwd=tmp_path, env=e, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def test_the_slurm_template_gives_torchrun_time_to_checkpoint(tmp_path):
    got = sbatch(tmp_path, "dino-vit", "--preset", "tiny", "--out", "runs/a")
    assert got[0] == "timeout=110" and "--resume" not in got  # 110 s of the 120 s --signal gives


def test_a_requeued_job_resumes_only_a_run_that_wrote_a_checkpoint(tmp_path):
    """Preempted before the first checkpoint (while starting), the job starts the run again."""
    for out in (["--out", "runs/a"], ["--out=runs/a"], []):
        assert "--resume" not in sbatch(tmp_path, "dino-vit", "--preset", "tiny", *out, restarts=1), out
    assert "--resume" in sbatch(tmp_path, "dino-vit", "--preset", "tiny", "--out", "runs/a", RESUME="1")
    for run_dir, out in (("runs/a", ["--out", "runs/a"]), ("runs/b", ["--out=runs/b"]),
                         ("runs/dino-vit/tiny-k2-rule-s0", ["--kappa", "2"])):  # the directory `run` chooses
        (tmp_path / run_dir).mkdir(parents=True)
        (tmp_path / run_dir / "checkpoint.pt").write_bytes(b"")
        assert "--resume" in sbatch(tmp_path, "dino-vit", "--preset", "tiny", *out, restarts=1), out


def test_a_bad_file_one_rank_meets_ends_every_process_with_its_line(tmp_path):
    """One rank's shard holds a truncated JPEG: it stops with its one line while its peer waits in the step's
    all-reduce. Tearing the group down would wait for that collective forever, so the failing rank leaves
    without it, and the peer's collective fails and is said in one line: the launch ends, nothing hangs."""
    import time

    from vision_util import image_folder

    data = image_folder(tmp_path / "inet")
    bad = data / "train" / "n01" / "3.JPEG"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    # torchrun's agent stops the other processes once one has failed, at its next look (--monitor-interval,
    # 0.1 s by default): on a loaded machine that can come before the peer's collective fails and it says so.
    # Looking every 5 s leaves the peers' own end to be seen, which is what this test checks.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--monitor-interval", "5",
           "-m", "emarule", "run", "byol-r18", "--preset", "tiny", "--set", "data.source=imagenet",
           "--data", str(data), "--out", str(tmp_path / "run")]
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=170)
    assert time.monotonic() - start < 150, "the launch did not end promptly"
    assert r.returncode != 0
    errors = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 2, r.stderr[-3000:]  # one line from each process, the cause first
    assert errors[0].startswith(f"error: cannot decode {bad}") and "another process of this launch" in errors[1]
    assert "exitcode  : 2" in r.stderr  # both processes ended on exit code 2 (torchrun's report of them)
    assert not [x for x in r.stderr.splitlines() if x.startswith("[rank") and "Traceback" in x]


WEIGHTS = """import json, sys
from emarule.engine import distributed, loop
step = loop.optimizer_step
def record(run, batch, *a, **k):
    with open(sys.argv[1] + f".{distributed.rank()}", "a") as f:
        f.write(json.dumps([run.clock.step, [m / batch.measure for m in batch.measures]]) + "\\n")
    return step(run, batch, *a, **k)
loop.optimizer_step = record
from emarule.cli.main import main
main(sys.argv[2:])
"""


def test_with_several_processes_a_skipped_item_leaves_each_micro_batch_its_planned_weight(tmp_path):
    """docs/faults.md: the step's total comes from the plan summed over ranks, so the rank that skipped an item
    weighs its micro-batch as planned, and the step's weights add up to 1 (not 31/32)."""
    import json

    from vision_util import image_folder

    data = image_folder(tmp_path / "inet")
    bad = data / "train" / "n01" / "3.JPEG"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    (tmp_path / "weights.py").write_text(WEIGHTS)
    log = tmp_path / "weights"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp_path / "weights.py"), str(log), "run", "byol-r18", "--preset", "tiny", "--set",
           "data.source=imagenet", "--set", "data.skip_bad_items=true", "--data", str(data),
           "--out", str(tmp_path / "run")]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    steps: dict = {}
    for rank in (0, 1):
        for line in Path(f"{log}.{rank}").read_text().splitlines():
            step, weights = json.loads(line)
            steps.setdefault(step, []).extend(weights)
    assert steps and all(sum(w) == pytest.approx(1.0) for w in steps.values()), steps
    assert "skipped" in r.stderr  # the truncated file was met and skipped, so the test is not vacuous
