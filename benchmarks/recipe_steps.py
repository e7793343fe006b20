"""The full-size recipes take real steps: throughput, peak GPU memory and the micro-batch that fits.

For each recipe, on generated data of the real shape (an ImageNet folder of 256×256 JPEGs, CIFAR-10's
pickles, a LibriSpeech tree of 16 kHz FLAC), this runs `emarule run RECIPE` through the engine's own
loop (`emarule.engine.loop.train`: data loader, autocast, micro-batches, clipping, optimizer, EMA
update) and stops it after --warmup + --steps optimizer steps. It prints, per recipe:

  rate      samples (or seconds of audio) per second of wall time over the measured steps
  compute   the same over the time spent in the step itself (forward, backward, optimizer, EMA update;
            the GPU synchronised at its end), so that rate < compute means the loader held it back
  peak      torch.cuda.max_memory_allocated
  micro     the per-device micro-batch used; the full per-device batch first, halved after each
            out-of-memory error until it fits

Evaluations and checkpoints are put past the measured steps. Needs a GPU to mean anything; on a CPU
`--quick` runs the tiny presets through the same path as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loop_overhead, beside this file

from loop_overhead import Done, context  # noqa: E402  (the RunContext `emarule run` builds; puts the root on sys.path)

RECIPES = ("polyak-r50", "byol-r18", "byol-vit", "byol-r50-lars", "dino-vit", "ctc-polyak")


def _jpeg(job) -> None:
    from PIL import Image

    path, seed = job
    g = np.random.default_rng(seed)
    # smooth colour fields, so that files and decoding cost are closer to photographs' than noise's
    small = g.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(small).resize((256, 256), Image.BICUBIC).save(path, quality=90)


def imagenet_tree(root: Path, classes: int, per_class: int, pool) -> Path:
    jobs = []
    for split, n in (("train", per_class), ("val", 1)):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True, exist_ok=True)
            jobs += [(d / f"{c}_{i}.JPEG", hash((split, c, i)) & 0xFFFFFFFF) for i in range(n)]
    pool.map(_jpeg, jobs, chunksize=64)
    return root


def cifar_tree(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(0)
    for name, n in [(f"data_batch_{k}", 10000) for k in range(1, 6)] + [("test_batch", 1000)]:
        with open(folder / name, "wb") as f:
            pickle.dump({"data": g.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "labels": [int(v) for v in g.integers(0, 10, n)]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return root


def _flac(job) -> None:
    import soundfile

    path, seconds, seed = job
    g = np.random.default_rng(seed)
    soundfile.write(str(path), 0.1 * g.standard_normal(int(seconds * 16000)), 16000, format="FLAC",
                    subtype="PCM_16")


def librispeech_tree(root: Path, seconds: float, pool) -> Path:
    """train-clean-100 holding `seconds` of utterances of 10–16 s, and one short utterance per eval split."""
    g = np.random.default_rng(0)
    jobs, total, k = [], 0.0, 0
    splits = {"train-clean-100": None, "dev-clean": 2.0, "dev-other": 2.0, "test-clean": 2.0, "test-other": 2.0}
    for split, fixed in splits.items():
        d = root / split / "19" / "198"
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        while (fixed is None and total < seconds) or (fixed is not None and not lines):
            s = fixed or float(g.uniform(10, 16))
            uid = f"19-198-{k:04d}"
            jobs.append((d / f"{uid}.flac", s, k))
            lines.append(f"{uid} " + " ".join(["THE QUICK BROWN FOX JUMPS"] * int(s / 2)))
            total += s if fixed is None else 0.0
            k += 1
        (d / "19-198.trans.txt").write_text("\n".join(lines) + "\n")
    pool.map(_flac, jobs, chunksize=8)
    return root


def prepare(recipe: str, work: Path, steps: int, pool) -> tuple:
    """(data root, first micro-batch to try) for a recipe, generating the data the first time it is needed."""
    if recipe in ("polyak-r50", "byol-vit", "byol-r50-lars"):
        data = work / "imagenet"
        if not data.exists():  # enough for the largest of these batches (4096)
            imagenet_tree(data, 1000, math.ceil(4096 * steps / 1000), pool)
        return data, None
    if recipe in ("byol-r18", "dino-vit"):
        data = work / "cifar"
        return (data if data.exists() else cifar_tree(data)), None
    if recipe == "ctc-polyak":
        data = work / "LibriSpeech"
        if not data.exists():
            librispeech_tree(data, 2320 * (steps + 0.5), pool)
        return data, 290  # data.seconds_per_device: the paper's per-GPU share of the 2320 s batch
    raise SystemExit(f"{recipe}: not a full-size training recipe; choose from {', '.join(RECIPES)}")


def measure(ctx, warmup: int, steps: int) -> dict:
    """Runs the engine's loop until warmup + steps optimizer steps are done; times each step."""
    from emarule.engine import distributed, loop
    from emarule.tasks import build_parts

    # The engine's choice, not torch's: $EMARULE_DEVICE=cpu keeps a GPU machine's run on the CPU, and a CPU
    # run has no peak GPU memory to report (it printed 0.0 GiB on the H100 under the test suite).
    cuda = distributed.device_type() == "cuda"
    stamps: list = []  # (start, end, global measure) per optimizer step
    layout: dict = {}
    inner = loop.optimizer_step

    def timed(run, batch, *args, **kwargs):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outcome = inner(run, batch, *args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        stamps.append((t0, time.perf_counter(), float(batch.measure)))
        layout.update(accumulation=run.layout.accumulation, micro=max(batch.measures),
                      global_batch=run.layout.global_batch, workers=run.workers, device=str(run.dist.device))
        if len(stamps) >= warmup + steps:
            raise Done
        return outcome

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loop.optimizer_step = timed
    try:
        loop.train(ctx, build_parts(ctx))
    except Done:
        pass
    else:
        raise SystemExit(f"{ctx.experiment}: the run ended before {warmup + steps} steps; give it more data")
    finally:
        loop.optimizer_step = inner
    measured = stamps[warmup:]
    amount = sum(m for _, _, m in measured)
    wall = measured[-1][1] - stamps[warmup - 1][1]
    compute = sum(t1 - t0 for t0, t1, _ in measured)
    return {**layout, "steps": len(measured), "measure": amount, "rate": amount / wall, "compute": amount / compute,
            "step_s": wall / len(measured),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")}


def fits(recipe: str, preset, data, work: Path, warmup: int, steps: int, first: int | None, workers,
         sets: tuple = ()) -> dict:
    """measure(), halving the micro-batch after each CUDA out-of-memory error."""
    micro, tries = first, 0
    while True:
        out = work / f"{recipe}-{tries}"
        ctx = context(recipe, preset, out, sets, data=data, max_device_batch=micro, num_workers=workers)
        try:
            got = measure(ctx, warmup, steps)
            got["oom_tries"] = tries
            return got
        except torch.cuda.OutOfMemoryError:
            pass
        # Out of the except block, the traceback is gone, and with it the failed run's model, optimizer and
        # DataLoader: collected now, its GPU memory and its workers' shared-memory batches are freed before
        # the next try starts its own.
        import gc

        from emarule.engine import batching, distributed

        gc.collect()
        torch.cuda.empty_cache()
        distributed.teardown()
        full = batching.layout(ctx.plan["batch_size"], 1, micro, ctx.cfg.batch.unit)
        now = micro or math.ceil(full.global_batch)
        micro, tries = max(1, now // 2), tries + 1
        print(f"  {recipe}: out of memory at a micro-batch of {now:g}; trying {micro}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="*", default=list(RECIPES))
    ap.add_argument("--warmup", type=int, default=2, help="steps before the timed ones")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the engine's)")
    ap.add_argument("--quick", action="store_true", help="the tiny presets on their own data: a smoke test")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a spec value, as `emarule run --set` does")
    ap.add_argument("--data", type=Path, default=None, help="a data root of your own instead of generated data")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--micro", action="append", default=[], metavar="RECIPE=N",
                    help="the first micro-batch to try for RECIPE, instead of its full per-device batch")
    args = ap.parse_args(argv)
    micros = {}
    for item in args.micro:
        name, _, n = item.partition("=")
        if name not in RECIPES or not n.isdigit() or int(n) < 1:
            ap.error(f"--micro {item!r}: use RECIPE=N with a positive N and one of {', '.join(RECIPES)}")
        micros[name] = int(n)
    results = {}
    with tempfile.TemporaryDirectory() as tmp, multiprocessing.Pool() as pool:
        work = Path(tmp)
        for recipe in args.recipes:
            t0 = time.perf_counter()
            preset, data, first = ("tiny" if args.quick else None), args.data, None
            if data is None and not args.quick:
                data, first = prepare(recipe, work, args.warmup + args.steps + 1, pool)
            first = micros.get(recipe, first)
            made = time.perf_counter() - t0
            try:
                r = fits(recipe, preset, data, work, args.warmup, args.steps, first, args.workers, tuple(args.sets))
            except Exception as e:  # one recipe's failure is reported; the others still run
                print(f"{recipe}: FAILED {type(e).__name__}: {e}", flush=True)
                results[recipe] = {"error": f"{type(e).__name__}: {e}"}
                continue
            unit = "audio s/s" if recipe.startswith("ctc") else "samples/s"
            r["data_s"] = made
            results[recipe] = r
            print(f"{recipe}: {r['rate']:.1f} {unit} (compute {r['compute']:.1f}), {r['step_s']:.2f} s/step, "
                  f"peak {r['peak_gib']:.1f} GiB, batch {r['global_batch']:g} as {r['accumulation']} × micro "
                  f"{r['micro']:g}, {r['workers']} workers, {r['device']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
