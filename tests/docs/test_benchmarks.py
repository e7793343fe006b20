"""Every script `make bench` runs works in its --quick mode and prints its measured ratio."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RATIO = re.compile(r"ratio [^:]*: median \d+\.\d+x\s+min \d+\.\d+x")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["loop_overhead", "parabola_speed", "startup", "augment_speed", "memory_format"])
def test_quick_mode_prints_a_ratio(script, capsys):
    threads = torch.get_num_threads()
    try:
        load(script).main(["--quick"])
    finally:
        torch.set_num_threads(threads)  # loop_overhead pins the thread count
    out = capsys.readouterr().out
    assert RATIO.search(out), out


def test_ema_update_benchmark_quick_mode_prints_each_method_relative_to_emarule(capsys):
    load("run").main(["--quick", "--device", "cpu"])
    out = capsys.readouterr().out
    assert re.search(r"emarule\s+[\d.]+ ms\s+[\d.]+ ms\s+1\.00x\s+1\.00x", out), out
    assert "naive per-tensor loop" in out


def test_recipe_steps_quick_mode_times_the_engines_own_steps(capsys):
    load("recipe_steps").main(["--quick", "polyak-r50", "ctc-polyak", "--warmup", "1", "--steps", "2"])
    out = capsys.readouterr().out
    assert re.search(r"polyak-r50: [\d.]+ samples/s \(compute [\d.]+\), [\d.]+ s/step, peak nan GiB, batch 32 as "
                     r"1 × micro 32, 0 workers, cpu", out), out
    assert re.search(r"ctc-polyak: [\d.]+ audio s/s \(compute [\d.]+\)", out), out


def test_recipe_steps_on_a_gpu_machine_held_on_the_cpu_reports_no_gpu_memory(capsys, monkeypatch):
    # On the H100, with EMARULE_DEVICE=cpu (as the suite sets it), the run trained on the CPU but the script
    # asked torch whether CUDA existed, synchronised a GPU it did not use and printed a peak of 0.0 GiB.
    import torch

    monkeypatch.setenv("EMARULE_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    load("recipe_steps").main(["--quick", "polyak-r50", "--warmup", "1", "--steps", "1"])
    out = capsys.readouterr().out
    assert re.search(r"polyak-r50: .* peak nan GiB, .* cpu", out), out


class Serial:
    def map(self, fn, jobs, chunksize=1):
        return [fn(j) for j in jobs]


def test_recipe_steps_generated_trees_are_what_the_real_loaders_read(tmp_path):
    from emarule.speech.librispeech import list_split, read_audio
    from emarule.vision.data import load_sources

    rs = load("recipe_steps")
    train, val = load_sources("imagenet", rs.imagenet_tree(tmp_path / "in", 3, 2, Serial()), 224, None, None, 1000)
    assert (len(train), len(val)) == (6, 3)
    root = rs.librispeech_tree(tmp_path / "LibriSpeech", 30.0, Serial())
    utts = list_split(root, "train-clean-100")
    assert sum(u.seconds for u in utts) >= 30 and all(10 <= u.seconds <= 16 for u in utts)
    assert read_audio(utts[0].path).shape == (round(utts[0].seconds * 16000),)
    assert [len(list_split(root, s)) for s in ("dev-clean", "dev-other", "test-clean", "test-other")] == [1] * 4


def test_recipe_steps_halves_the_micro_batch_after_each_out_of_memory_error(tmp_path, monkeypatch, capsys):
    rs = load("recipe_steps")
    tried = []

    def measure(ctx, warmup, steps):
        tried.append(ctx.max_device_batch)
        if len(tried) < 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return {"micro": ctx.max_device_batch}

    monkeypatch.setattr(rs, "measure", measure)
    got = rs.fits("polyak-r50", "tiny", None, tmp_path, 1, 1, None, None)  # the tiny preset's batch: 32
    assert tried == [None, 16, 8] and got == {"micro": 8, "oom_tries": 2}
    assert "out of memory at a micro-batch of 32; trying 16" in capsys.readouterr().out


def test_recipe_steps_starts_at_the_micro_batch_it_is_given(capsys):
    load("recipe_steps").main(["--quick", "polyak-r50", "--micro", "polyak-r50=8", "--warmup", "1", "--steps", "1"])
    assert "batch 32 as 4 × micro 8" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["polyak-r50", "polyak-r50=0", "resnet=8"])
def test_recipe_steps_refuses_a_micro_batch_it_cannot_read(bad, capsys):
    with pytest.raises(SystemExit) as e:
        load("recipe_steps").main(["--quick", "--micro", bad])
    assert e.value.code == 2 and f"--micro {bad!r}: use RECIPE=N" in capsys.readouterr().err
