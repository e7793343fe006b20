"""`emarule probe`: the offline linear probe of finished self-supervised runs, and the data bar over them.

For each run: the converged probe of its final teacher, of the same teacher at initialization, and of the
raw pixels (`emarule.analysis.offline_probe`, cached in the run directory), and the margin the
trained teacher holds over the better of the two references. Over all the runs given: the means, and
whether they meet the 15-point bar that `emarule reproduce` asks of a family's κ=1 baselines (runs of more
than one experiment get no mean and no bar).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from emarule.analysis.compare import expand
from emarule.engine.rundir import CHECKPOINT, HPARAMS
from emarule.errors import UserError

TASKS = ("byol", "dino")


def checked(paths: list[Path]) -> list[tuple[Path, dict]]:
    """(run directory, its hparams) for every run the paths name; a path that is not a finished byol or dino
    run is a UserError naming it, raised before any probe is fitted."""
    runs = []
    for p in expand(paths):
        if not p.exists():
            raise UserError(f"{p} does not exist; pass a run directory (an --out of emarule run) or a folder of them")
        if not (p / HPARAMS).is_file():
            raise UserError(f"{p} is not a run directory (no {HPARAMS}); pass a run's --out, or a folder of runs")
        try:
            h = json.loads((p / HPARAMS).read_text())
            task = h["spec"]["task"]
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{p / HPARAMS} cannot be read ({e}); the run directory is damaged, run it again") from e
        if task not in TASKS:
            raise UserError(f"{p} is a {task} run; emarule probe reads self-supervised runs ({', '.join(TASKS)}), "
                            f"whose teacher it probes")
        if not (p / CHECKPOINT).is_file():
            raise UserError(f"{p} has no {CHECKPOINT}: the run never saved its teacher; run it again to its end")
        readable(p / CHECKPOINT, h)
        runs.append((p, h))
    return runs


def readable(checkpoint: Path, hparams: dict) -> None:
    """Mapped, not read: the probes load the checkpoint again, and a full-size one is gigabytes. A truncated
    file has lost the archive's directory, which mapping reads; a foreign one lacks the clock and teacher; one
    of another run (another experiment, preset or κ) has settings other than the run's hparams.json records,
    and its weights would not fit the model the probes build from them."""
    import torch

    from emarule.analysis.offline_probe import teacher_step

    try:
        ck = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # a truncated or foreign file: torch raises several kinds
        raise UserError(f"cannot read {checkpoint} ({type(e).__name__}); run it again to its end") from None
    teacher_step(ck, checkpoint)  # a file torch reads may still be no run's checkpoint
    same_run(checkpoint, ck.get("fingerprint"), hparams.get("fingerprint"))


def same_run(checkpoint: Path, saved, recorded) -> None:
    """The checkpoint's settings are those its run directory's hparams.json records."""
    import json

    from emarule.engine.preflight import differences

    if not isinstance(saved, dict) or not isinstance(recorded, dict):
        return  # a run that recorded none: nothing to compare
    saved, recorded = json.loads(json.dumps(saved)), json.loads(json.dumps(recorded))  # tuples as lists
    diff = differences(saved, recorded)
    if diff:
        theirs = (saved.get("spec") or {}).get("name") if isinstance(saved.get("spec"), dict) else None
        ours = (recorded.get("spec") or {}).get("name") if isinstance(recorded.get("spec"), dict) else None
        whose = f"a run of {theirs}, not {ours}" if theirs != ours else f"another {ours} run ({', '.join(diff[:3])} " \
                                                                      f"differ)"
        raise UserError(f"{checkpoint} is the checkpoint of {whose}, whose {HPARAMS} is beside it; put each run's "
                        f"checkpoint back in its own directory, or run this one again")


def measure(runs: list[tuple[Path, dict]], jobs: int = 1) -> dict:
    """Per-run probe readings and, over them, the means and the bar (`offline_probe.bar`)."""
    from emarule.analysis import offline_probe as P

    if jobs > 1:  # every run's fits, side by side in single-threaded workers
        P.warm_caches([SimpleNamespace(path=p, is_baseline=True) for p, _ in runs], jobs)
    rows = []
    for p, h in runs:
        trained = P.offline_probe(p)["offline_probe_top1"]
        init = P.offline_probe(p, at_init=True)["offline_probe_top1"]
        pixels = P.pixel_probe(p)["pixels_probe_top1"]
        rows.append({"run": str(p), "experiment": h["spec"].get("name"), "seed": h.get("seed"),
                     "kappa": h.get("kappa"), "trained": trained, "init": init, "pixels": pixels,
                     "margin": trained - max(init, pixels)})
    if len({r["experiment"] for r in rows}) > 1:  # a mean over two experiments' teachers measures neither
        return {"runs": rows, "bar": None}
    means = {k: {"mean": sum(r[k] for r in rows) / len(rows)} for k in ("trained", "init", "pixels")}
    return {"runs": rows, "bar": P.bar({"offline": means["trained"], "init": means["init"],
                                        "pixels": means["pixels"]})}


def show(console, result: dict) -> None:
    from rich.table import Table

    t = Table(title="converged linear probe, test top-1 (%)", title_justify="left")
    for name in ("run", "experiment", "seed", "κ", "trained teacher", "teacher at init", "raw pixels", "margin"):
        t.add_column(name, justify="left" if name in ("run", "experiment") else "right")
    for r in result["runs"]:
        t.add_row(Path(r["run"]).name, str(r["experiment"]), str(r["seed"]), f"{float(r['kappa']):g}",
                  f"{r['trained']:.2f}", f"{r['init']:.2f}", f"{r['pixels']:.2f}", f"{r['margin']:+.2f}")
    b = result["bar"]
    if b is None:
        console.print(t)
        console.print("data bar: not judged, the runs come from more than one experiment; give one experiment's runs")
        return
    if len(result["runs"]) > 1:
        t.add_row("mean", "", "", "", f"{b['trained']:.2f}", f"{b['init']:.2f}", f"{b['pixels']:.2f}",
                  f"{b['margin']:+.2f}", style="bold")
    console.print(t)
    over = "the mean over these runs" if len(result["runs"]) > 1 else "this run"
    console.print(f"data bar: the trained teacher beats the better of its initialization and the pixels by "
                  f"{b['margin']:.1f} points for {over}, so it {'meets' if b['met'] else 'misses'} the "
                  f"{b['required']:g}-point bar (docs/data.md)")
