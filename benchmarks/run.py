"""`make bench`: the time of one model-EMA update on a ResNet-50 (25.6M parameters).

Compares, in one process on the same model and device:
  emarule   emarule.engine.ema.ModelEma (one torch._foreach_lerp_ per device/dtype group; buffers copied)
  timm      timm.utils.ModelEmaV3 (foreach lerp over the whole state_dict, buffers averaged too)
  swa_utils torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn (parameters only)
  naive     a Python loop of ζ ← ρζ + (1 − ρ)θ per tensor (lightly's update_momentum)
  and emarule's features: the samples_seen clock with the rule, warm-up, exclude=, every=4 (4 calls)
Methods take turns; prints the best and the median of repeated updates, each relative to emarule,
and emarule's relative to timm's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emarule.engine.ema import ModelEma  # noqa: E402


def resnet50(name: str = "resnet50") -> torch.nn.Module:
    try:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    except ImportError:  # pragma: no cover
        import timm

        return timm.create_model(name, pretrained=False)


def timed(methods: dict, repeats: int, device: torch.device) -> dict:
    """Median seconds per call; methods take turns so that load from other processes hits all alike."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for fn in methods.values():
        for _ in range(min(3, repeats)):  # warm-up: allocator, kernel selection, grouping caches
            fn()
    sync()
    times: dict = {name: [] for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: (min(ts), statistics.median(ts)) for name, ts in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a smoke test: a ResNet-18, 1 call each")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = 1
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = resnet50("resnet18" if args.quick else "resnet50").to(device)
    n_params = sum(p.numel() for p in model.parameters())
    rho = 0.999

    ours = ModelEma(model, rho)
    methods = {"emarule": lambda: ours.update(model)}
    # the new features' cost: the global clock (with the rule), warm-up, exclude, every=4 (4 calls: 1 update)
    clocked = ModelEma(model, rho, base_batch_size=256)
    warm = ModelEma(model, rho, base_batch_size=256, warmup_power=0.75)
    masked = ModelEma(model, rho, exclude=["fc"])
    every = ModelEma(model, rho, base_batch_size=256, every=4)
    clock = {"s": 0}

    def tick(ema):
        clock["s"] += 256
        return ema.update(model, samples_seen=clock["s"])

    features = {"emarule samples_seen clock": lambda: tick(clocked), "emarule + warm-up": lambda: tick(warm),
                "emarule exclude=['fc']": lambda: masked.update(model),
                "emarule every=4 (4 calls)": lambda: [every.update(model, batch_size=256) for _ in range(4)]}

    try:
        from timm.utils import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=rho)
        methods["timm ModelEmaV3"] = lambda: timm_ema.update(model)
    except ImportError:  # pragma: no cover
        print("timm not installed: skipping ModelEmaV3")

    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    swa = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(rho))
    swa.update_parameters(model)  # the first call only copies; time the averaging calls
    methods["swa_utils AveragedModel"] = lambda: swa.update_parameters(model)

    naive_copy = ModelEma(model, rho).module
    pairs = list(zip(naive_copy.parameters(), model.parameters(), strict=True))

    @torch.no_grad()
    def naive():
        for e, p in pairs:
            e.data = e.data * rho + p.data * (1.0 - rho)

    methods["naive per-tensor loop"] = naive
    methods.update(features)

    print(f"one EMA update of a ResNet-{18 if args.quick else 50} ({n_params / 1e6:.1f}M parameters) on {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} calls each")
    results = timed(methods, args.repeats, device)
    base_best, base_med = results["emarule"]
    width = max(map(len, results))
    print(f"  {'':<{width}}  {'best':>8}      {'median':>8}      best/emarule  median/emarule")
    for name, (best, med) in results.items():
        print(f"  {name:<{width}}  {best * 1e3:8.2f} ms   {med * 1e3:8.2f} ms   {best / base_best:8.2f}x  "
              f"{med / base_med:12.2f}x")
    if "timm ModelEmaV3" in results:
        t_best, t_med = results["timm ModelEmaV3"]
        print("  time relative to timm ModelEmaV3 (below 1: faster):")
        for name in [n for n in results if n.startswith("emarule")]:
            best, med = results[name]
            print(f"    {name:<{width}}  best {best / t_best:.2f}x  median {med / t_med:.2f}x")
    print("  (best = least-disturbed call; on a shared machine the median also measures other processes)")


if __name__ == "__main__":
    main()
