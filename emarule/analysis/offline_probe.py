"""Does the tracking probe measure the teacher? An offline linear probe of each run's final teacher.

The tracking probe (`emarule.vision.probe`) learns alongside the run, so at κ = 4 it gets a quarter of the
steps; a gap in `probe_top1` could be the probe's lag rather than the teacher's quality. This
check takes the final teacher of a finished run (the EMA in its checkpoint), computes its
representation of the train and test evaluation views — the same `represent(teacher, x)` the
tracking probe reads, captured through the task's own evaluation — and fits a multinomial logistic
regression on standardized train features to convergence (scikit-learn, L-BFGS). Its test top-1 is
`offline_probe_top1`: a measure of the final teacher alone, the same for every κ.

The same probe on the raw pixels of the same evaluation views (`pixel_probe`) is the other reference:
a teacher that learned something a linear probe can see beats both its own initialization and the
pixels. The teacher at initialization is probed with BatchNorm statistics estimated on the train views
(`batchnorm_statistics`): as built, its BatchNorm layers would not normalize at all.

Cached as offline_probe.json (offline_probe_init.json, offline_probe_pixels.json) in the run directory
(keyed by the checkpoint's step), so a reused reproduction does not recompute it. Each cache is sealed: a
digest of its reading and of what it was fitted on (the checkpoint's bytes, the run's hparams.json, or the
data settings for the pixels). A cache that cannot be read (damaged, not a probe's reading), or whose seal
does not match (edited by hand, or left by a run that was trained again), is fitted again and rewritten.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from emarule.analysis.reproduce import render as T
from emarule.analysis.reproduce.claims import OFFLINE_PROBE
from emarule.engine.cache import sha256
from emarule.engine.rundir import CHECKPOINT, HPARAMS, atomic_write_text, read_json
from emarule.errors import UserError

CACHE, CACHE_INIT, CACHE_PIXELS = OFFLINE_PROBE.file, "offline_probe_init.json", "offline_probe_pixels.json"
BAR = 15.0  # top-1 points a trained teacher should gain over both its initialization and the pixels


@contextlib.contextmanager
def captured_features(store: list):
    """The probe's `predict` records its input (the teacher's representation) and predicts nothing."""
    from emarule.vision import probe as P

    original = P.ProbeModule.predict

    def record(self, h):
        store.append(h.detach().float().cpu())
        return torch.zeros(len(h), 1)

    P.ProbeModule.predict = record
    try:
        yield
    finally:
        P.ProbeModule.predict = original


def _features(evaluation, teacher, data) -> tuple[torch.Tensor, torch.Tensor]:
    feats, labels = [], []
    with torch.no_grad(), captured_features(feats):
        for start, end in _chunks(len(data), 256):
            items = [data[i] for i in range(start, end)]
            x = torch.stack([torch.as_tensor(a) for a, _ in items])
            y = torch.as_tensor([int(b) for _, b in items])
            evaluation.score(teacher, (x, y), None)
            labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) of batches of `size`, a last batch of one item joined to the one before: BatchNorm in
    train mode (`batchnorm_statistics`) refuses a batch of one, and in eval mode the split changes nothing."""
    out = [(a, min(a + size, n)) for a in range(0, n, size)]
    if len(out) > 1 and out[-1][1] - out[-1][0] == 1:
        out[-2:] = [(out[-2][0], n)]
    return out


def _cached(path: Path, key: str, source: str) -> dict | None:
    """A cache's reading, or None when it is missing, damaged or not sealed for `source`: a cache is only ever
    refitted, so a bad one costs a fit rather than the command, and never a verdict."""
    got = read_json(path)
    v = got.get(key) if isinstance(got, dict) else None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    return got if got.get("seal") == _seal(got, source) else None


def _seal(reading: dict, source: str) -> str:
    body = json.dumps({k: v for k, v in reading.items() if k != "seal"}, sort_keys=True, default=str)
    return hashlib.sha256(f"{body}\n{source}".encode()).hexdigest()


def _sealed(reading: dict, source: str) -> dict:
    return {**reading, "seal": _seal(reading, source)}


def _text(reading: dict) -> str:
    return json.dumps(reading, indent=1) + "\n"


def _source(run_dir: Path, kind: str) -> str:
    """What a cache of `kind` was fitted on: the final teacher's checkpoint, the run's settings (the teacher as
    initialized is built from them) or its data settings (the pixels, shared by the baseline seeds)."""
    name = {"final": CHECKPOINT, "init": HPARAMS}.get(kind)
    if name is not None:
        return f"{name} " + (sha256(run_dir / name) if (run_dir / name).is_file() else "missing")
    h = read_json(run_dir / HPARAMS)
    if not isinstance(h, dict) or not isinstance(h.get("spec"), dict):
        return "data missing"
    return "data " + json.dumps([h["spec"].get("task"), h["spec"].get("data")], sort_keys=True, default=str)


def teacher_step(ck, path: Path) -> int:
    """The step of a checkpoint `emarule run` wrote, checked for what the probes read (its clock and the
    EMA teacher's weights): a foreign or damaged file is a one-line error, not a KeyError mid-probe."""
    clock = ck.get("clock") if isinstance(ck, dict) else None
    ema = ((ck.get("emas") or {}).get("ema") or {}) if isinstance(ck, dict) else {}
    step = clock.get("step") if isinstance(clock, dict) else None
    if (not isinstance(step, int) or isinstance(step, bool) or not isinstance(ema, dict)
            or not isinstance(ema.get("module"), dict)):
        raise UserError(f"{path} is not an emarule checkpoint (no training clock or EMA teacher): it is damaged or "
                        f"was written by another program; run the run again to its end")
    return step


def offline_probe(run_dir: Path, at_init: bool = False) -> dict | None:
    """{"offline_probe_top1", "step", ...} for a finished self-supervised run, or None when the task
    has no tracking probe. `at_init`: the same probe on the run's teacher as initialized (step 0),
    the reference a trained teacher should beat."""
    run_dir = Path(run_dir)
    ck_path = run_dir / CHECKPOINT
    cache = run_dir / (CACHE_INIT if at_init else CACHE)
    if at_init:  # built from the run's settings: no checkpoint needed
        ck, step = None, 0
    elif not ck_path.is_file():
        # A root kept without its checkpoints (judged with `reproduce --judge-only`): the final teacher's
        # cache is its only record, read as it is; its seal names a checkpoint no longer there to check.
        got = read_json(cache)
        v = got.get("offline_probe_top1") if isinstance(got, dict) else None
        ok = _fresh(got, "final") and isinstance(v, (int, float)) and not isinstance(v, bool)
        return got if ok else None
    else:
        ck = torch.load(ck_path, map_location="cpu", weights_only=False)
        step = teacher_step(ck, ck_path)
    source = _source(run_dir, "init" if at_init else "final")
    got = _cached(cache, "offline_probe_top1", source)
    if _fresh(got, "init" if at_init else "final") and got.get("step") == step:
        return got
    from emarule.vision.probe import EvalImages

    built = _build(run_dir)
    if built is None:
        return None
    parts, evaluation = built
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        teacher = copy.deepcopy(parts.ema_source if parts.ema_source is not None else parts.model)
        if not at_init:  # the task built the initial weights from the run's seed
            teacher.load_state_dict(ck["emas"]["ema"]["module"])
        train = EvalImages(parts.train_set.source, evaluation.data.size)
        if at_init:
            batchnorm_statistics(teacher, lambda: _features(evaluation, teacher, train))
        teacher.eval()
        xtr, ytr = _features(evaluation, teacher, train)
        xte, yte = _features(evaluation, teacher, evaluation.data)
    finally:
        torch.set_num_threads(threads)
    top1 = fit_and_score(xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy())
    tracking = None if at_init else (ck.get("final_metrics") or {}).get("probe_top1")
    out = {"offline_probe_top1": top1, "step": step, "train_size": len(ytr), "test_size": len(yte),
           "features": int(xtr.shape[1]), "tracking_probe_top1": tracking, "method": _method(at_init)}
    out = _sealed(out, source)
    atomic_write_text(cache, _text(out))
    return out


METHOD = "multinomial logistic regression (L-BFGS, C=1) on standardized frozen teacher features"
METHOD_INIT = METHOD + "; BatchNorm statistics estimated on the train views"


def _method(at_init: bool) -> str:
    return METHOD_INIT if at_init else METHOD


def batchnorm_statistics(model: torch.nn.Module, forward: Callable[[], object]) -> None:
    """Give `model`'s BatchNorm layers the running statistics of the data `forward` passes through them.

    A network as built holds mean 0 and variance 1, so in eval mode its BatchNorm layers pass activations
    through unnormalized: a function that training never computes (the student's first step normalizes with
    its batch's statistics), which a linear probe read 10 to 63 points higher than the same weights with
    their statistics on this project's data (docs/data.md). The trained teacher is probed with the
    statistics its run gave it; the teacher at initialization gets those of the train views, averaged over
    every batch (momentum None), with every other module in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    model.eval()
    kept = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    try:
        forward()
    finally:
        for m, momentum in zip(norms, kept, strict=True):
            m.momentum = momentum
        model.eval()


def _build(run_dir: Path):
    """(task parts, the teacher's evaluation) of a byol or dino run as its hparams.json describes it, else None."""
    from emarule.engine.context import RunContext, rule_of_hparams
    from emarule.scaling import plan
    from emarule.tasks import byol, dino

    h = json.loads((run_dir / HPARAMS).read_text())
    spec = h["spec"]
    builders = {"byol": byol.build, "dino": dino.build}
    if spec.get("task") not in builders:
        return None
    rule = rule_of_hparams(h)
    ctx = RunContext(spec=spec, kappa=float(h["kappa"]), ema_rule=rule, plan=plan(spec, float(h["kappa"]), rule),
                     out=run_dir, seed=int(h.get("seed") or 0), preset=h.get("preset"))
    parts = builders[spec["task"]](ctx)
    return parts, next(e for e in parts.evaluations if e.models == "teacher")


def _views(data) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(data[i] for i in range(len(data))), strict=True)
    return torch.stack([torch.as_tensor(x).flatten() for x in xs]), torch.as_tensor([int(y) for y in ys])


def pixel_probe(run_dir: Path) -> dict | None:
    """{"pixels_probe_top1", ...}: the offline probe fitted on the raw pixels of the evaluation views (the
    normalized train and test images the teacher is probed on), or None when the task has no tracking probe."""
    run_dir = Path(run_dir)
    cache = run_dir / CACHE_PIXELS
    if not (run_dir / HPARAMS).is_file():
        return None
    # The pixels depend on the data settings alone: the baseline seeds of one reproduction share one fit.
    key = _source(run_dir, "pixels")
    got = _cached(cache, "pixels_probe_top1", key)
    if got is not None:
        _PIXELS.setdefault(key, _text(got))
        return got
    from emarule.vision.probe import EvalImages

    if key in _PIXELS:
        atomic_write_text(cache, _PIXELS[key])
        return json.loads(_PIXELS[key])
    built = _build(run_dir)
    if built is None:
        return None
    parts, evaluation = built
    xtr, ytr = _views(EvalImages(parts.train_set.source, evaluation.data.size))
    xte, yte = _views(evaluation.data)
    top1 = fit_and_score(xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy())
    out = {"pixels_probe_top1": top1, "train_size": len(ytr), "test_size": len(yte), "features": int(xtr.shape[1]),
           "method": "multinomial logistic regression (L-BFGS, C=1) on standardized pixels of the evaluation views"}
    out = _sealed(out, key)
    _PIXELS[key] = _text(out)
    atomic_write_text(cache, _PIXELS[key])
    return out


_PIXELS: dict = {}


def fit_and_score(xtr, ytr, xte, yte) -> float:
    """Test top-1 of the probe, fitted with one BLAS thread: its products are too small to share (on 2
    cores a fit on 64 features took 3× as long with two threads), and the fits already run side by side."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        scaler = StandardScaler().fit(xtr)
        clf = LogisticRegression(max_iter=5000).fit(scaler.transform(xtr), ytr)
        return float(100.0 * (clf.predict(scaler.transform(xte)) == yte).mean())


def _warm(run_dir: Path, kind: str) -> None:
    """In a worker: fill one of a run's caches ("final", "init" or "pixels")."""
    torch.set_num_threads(1)
    if kind == "pixels":
        pixel_probe(run_dir)
    else:
        offline_probe(run_dir, at_init=kind == "init")


_CACHE_OF = {"final": CACHE, "init": CACHE_INIT, "pixels": CACHE_PIXELS}
_TOP1 = {"final": "offline_probe_top1", "init": "offline_probe_top1", "pixels": "pixels_probe_top1"}


def _work(path: Path, is_baseline: bool, first_baseline: bool) -> list[tuple[Path, str]]:
    """The fits `probe_check` reads for one run that are not cached yet (the pixels once, on the first
    baseline: the others share its data and so its fit). A cache of another step is left to `offline_probe`,
    which checks it."""
    kinds = ["final"] + (["init"] if is_baseline else []) + (["pixels"] if first_baseline else [])
    return [(path, k) for k in kinds if not _fresh(_cached(path / _CACHE_OF[k], _TOP1[k], _source(path, k)), k)]


def _fresh(got: dict | None, kind: str) -> bool:
    """Whether a cache's reading (`_cached`) is this code's fit of `kind`: a teacher probed by another method
    (an initialization without its BatchNorm statistics) is fitted again. The step is `offline_probe`'s to
    check, against the checkpoint."""
    return got is not None and (kind == "pixels" or got.get("method") == _method(kind == "init"))


def follow_up(runs: list, arms: bool = False) -> Callable[[int, Path], list]:
    """For a sweep's workers (`emarule.analysis.sweep.execute`): the fits of sweep run i, once it has
    finished, as picklable work. An arm's final teacher only with `arms` (a family with a claim on the final
    teachers, which may compare arms); `probe_check` groups by κ and rule and leaves arms out."""
    first = next((i for i, r in enumerate(runs) if r.baseline and r.arm is None), None)

    def work(i: int, run_dir: Path) -> list:
        if runs[i].arm is not None and not arms:
            return []
        return [(f"probe {run_dir.name} ({kind})", _warm, (run_dir, kind))
                for _, kind in _work(run_dir, runs[i].baseline, i == first)]
    return work


def warm_caches(runs: list, jobs: int) -> None:
    """Fit the probes `probe_check` reads `jobs` at a time, each in a single-threaded spawned worker (the
    fits are independent; one after another they were a third of a self-supervised reproduction's wall
    time). A fit whose cache is there (a sweep's workers fitted it) is not started again."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from emarule.analysis.parallel import exit_with_parent

    first = next((r for r in runs if r.is_baseline), None)
    work = [w for r in runs for w in _work(Path(r.path), r.is_baseline, r is first)]
    if not work:
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        for f in [pool.submit(_warm, Path(p), kind) for p, kind in work]:
            f.result()


def probe_check(runs: list, jobs: int = 1) -> dict:
    """The offline probe of every run's final teacher, and of the baseline teachers at initialization,
    beside the tracking probe's last reading; grouped by setting. `jobs` > 1 fits them side by side first."""
    from emarule.analysis.reproduce.paired import loo_spread

    if jobs > 1 and runs:
        warm_caches(runs, jobs)
    rows: dict = {}
    for r in runs:
        got = offline_probe(r.path)
        if got is None:
            continue
        key = "baseline" if r.is_baseline else f"κ={r.kappa:g} {r.rule_label}"
        row = rows.setdefault(key, {"offline": [], "tracking": [], "init": [], "pixels": []})
        row["offline"].append(got["offline_probe_top1"])
        row["tracking"].append(got["tracking_probe_top1"])
        if r.is_baseline:
            row["init"].append(offline_probe(r.path, at_init=True)["offline_probe_top1"])
            row["pixels"].append(pixel_probe(r.path)["pixels_probe_top1"])
    if "baseline" not in rows:
        return {}
    out = {"settings": {k: {name: _stats(v) for name, v in row.items() if v} for k, row in rows.items()},
           "offline_baseline_spread": loo_spread(rows["baseline"]["offline"])}
    out["bar"] = bar(out["settings"]["baseline"])
    out["summary"] = summary(out)
    return out


def _stats(values: list) -> dict:
    vals = [v for v in values if v is not None]
    m = sum(vals) / len(vals) if vals else None
    sd = (sum((v - m) ** 2 for v in vals) / len(vals)) ** 0.5 if len(vals) > 1 else None
    return {"mean": m, "std": sd, "values": vals}


def bar(base: dict) -> dict:
    """Whether the baseline's trained teachers beat both their initialization and the raw pixels by BAR points."""
    trained, init, pixels = (base[k]["mean"] for k in ("offline", "init", "pixels"))
    margin = trained - max(init, pixels)
    return {"trained": trained, "init": init, "pixels": pixels, "margin": margin, "required": BAR,
            "met": bool(margin >= BAR)}


def summary(check: dict) -> str:
    s = check["settings"]
    base = s["baseline"]
    parts = [f"a converged linear probe of the final teachers reads {T.mean_sd(base['offline'])} (baseline)"]
    parts += [f"{T.mean_sd(v['offline'])} ({k})" for k, v in s.items() if k != "baseline"]
    text = ", ".join(parts) + (f"; the teachers at initialization read {T.mean_sd(base['init'])}, the raw pixels "
                               f"{T.mean_sd(base['pixels'])}; the tracking probe read ")
    text += ", ".join(f"{T.mean_sd(v['tracking'])} ({k})" for k, v in s.items())
    b = check["bar"]
    notes = [f"the trained teachers beat the better of initialization and pixels by {b['margin']:.1f} points "
             f"({'meets' if b['met'] else 'misses'} the {b['required']:g}-point bar)"]
    if base["init"]["mean"] >= base["offline"]["mean"]:
        notes.append("the trained teachers are no more linearly separable than at initialization, so on this data a "
                     "linear probe cannot measure what the teacher learned")
    spread = check["offline_baseline_spread"]
    if spread is not None:
        close = [k for k, v in s.items() if k != "baseline"
                 and abs(v["offline"]["mean"] - base["offline"]["mean"]) <= 2 * spread]
        if close:
            notes.append(f"by the converged probe {', '.join(close)} end within 2× the baseline seeds' spread "
                         f"({spread:.3g}) of the baseline")
    return text + ("; " + "; ".join(notes) if notes else "")
