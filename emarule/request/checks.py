"""Checks that `run`, `sweep` and `compare` make before they write anything.

Output paths, `--resume`, `--data`, batch sizes in samples, whether a task can run, and metric
names: each failure is a UserError naming the option and the fix, raised while nothing has been
created yet. Pure Python (no torch), and nothing here writes: a directory's writability is probed
with a temporary file that is gone before the call returns.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from emarule import extras
from emarule.request import suggest
from emarule.errors import UserError
from emarule.engine.rundir import (CHECKPOINT, HPARAMS, METRICS, STUDY_RECORD, UNSAVED, holds_a_run, nothing_to_resume,
                                  read_json)
from emarule.engine.runlock import check_free
from emarule.config.schema import get, task_keys, value
from emarule import registry

# data.source values that ship with the package or are generated: there is nothing for --data to
# point at. The one list of them (the schema lists every source a task accepts).
BUNDLED_DATA = frozenset({"digits", "shapes", "synthetic", "textures"})

# data.source values read from a local directory (--data or data.path): what each one needs there,
# and each task's source when the spec names none (the tasks' own defaults).
LOCAL_DATA = {
    "cifar10": ("CIFAR-10 is read from a local directory: pass --data DIR holding cifar-10-batches-py/ "
                "(nothing is downloaded)"),
    "imagenet": "ImageNet is read from a local directory: pass --data DIR holding train/<class>/ and val/<class>/",
    "librispeech": ("{name} reads LibriSpeech: pass --data ROOT holding {labeled}/<speaker>/<chapter>/*.flac "
                    "(nothing is downloaded)"),
}
LOOP_METRICS = ("loss", "grad_norm")


def __getattr__(name: str):
    """Views of the registry, read at use (a family registered later is in them):
    DEFAULT_SOURCE (each task's source when the spec names none), STUDIES (tasks that sweep κ or ρ themselves,
    with no metrics.jsonl: a κ sweep of them means nothing) and TASK_METRICS (what each training task logs
    besides LOOP_METRICS, so that `sweep --metric` is checked before anything trains; EMA and split variants,
    `ema_X` and `X/suffix`, need no entry; tests hold each list to what a run logs)."""
    if name == "DEFAULT_SOURCE":
        return {t.name: t.default_source for t in registry.REGISTRY.values() if t.default_source}
    if name == "STUDIES":
        return frozenset(t.name for t in registry.REGISTRY.values() if t.kind == "study")
    if name == "TASK_METRICS":
        return {t.name: t.metrics for t in registry.training()}
    raise AttributeError(f"module 'emarule.request.checks' has no attribute {name!r}")


def _existing_ancestor(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not os.path.lexists(p):
        p = p.parent
    return p


def _writable(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _kind(p: Path) -> str:
    """What a path that is not a directory is, for a message."""
    return "a broken symbolic link" if p.is_symlink() and not p.exists() else "a file"


def _brief(name: str) -> str:
    return name if len(name) <= 40 else f"{name[:16]}…{name[-8:]} ({len(name)} characters)"


def _fits(p: Path, flag: str) -> None:
    """Every name of the path within the file system's NAME_MAX, and the whole within its PATH_MAX: refused
    here, so that no parent is created before the name that cannot be."""
    anc = _existing_ancestor(p)
    try:
        name_max, path_max = os.pathconf(anc, "PC_NAME_MAX"), os.pathconf(anc, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096  # Linux's
    full = os.path.abspath(p)
    for part in Path(full).parts:
        if len(os.fsencode(part)) > name_max:
            raise UserError(f"{flag} {_brief(str(p))}: the name {_brief(part)} is longer than the file system's "
                            f"limit of {name_max} bytes; pass a shorter path")
    if len(os.fsencode(full)) >= path_max:
        raise UserError(f"{flag} {_brief(str(p))}: the path is longer than the file system's limit of "
                        f"{path_max - 1} bytes; pass a shorter path")


def out_dir(path: Path | str | None, flag: str = "--out") -> Path | None:
    """A directory that exists and is writable, or that can be created (it is not created here)."""
    if path is None:
        return None
    if str(path).strip() == "":
        raise UserError(f"{flag} is empty; give a directory, e.g. {flag} runs/my-run")
    p = Path(path)
    _fits(p, flag)
    if os.path.lexists(p) and not p.is_dir():
        fix = "remove the link or pass another directory" if _kind(p) != "a file" else "pass a directory"
        raise UserError(f"{flag} {p} is {_kind(p)}, not a directory; {fix} (it is created if missing)")
    anc = _existing_ancestor(p)
    if not anc.is_dir():
        raise UserError(f"{flag} {p}: {anc} is {_kind(anc)}, so nothing can be created under it; pass another path")
    if not _writable(anc):
        raise UserError(f"{flag} {p}: cannot write in {anc} (no permission or a read-only file system); "
                        f"pass a directory you can write to")
    return p


def out_file(path: Path | str, flag: str = "--out", fix: str = "pass another path", example: str = "compare.png"
             ) -> Path:
    """A file path whose folder exists and is writable, or can be created (it is not created here)."""
    if str(path).strip() == "":
        raise UserError(f"{flag} is empty; give a file path, e.g. {flag} {example}")
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        kind = "a directory" if p.is_dir() else "a directory's path (it ends in '/')"
        raise UserError(f"{flag} {path} is {kind}; {fix}, e.g. {p / example}")
    _fits(p, flag)
    anc = _existing_ancestor(p.parent)
    if not anc.is_dir():
        raise UserError(f"{flag} {p}: {anc} is {_kind(anc)}, so nothing can be written under it; {fix}")
    if not _writable(anc):
        raise UserError(f"{flag} {p}: cannot write in {anc} (no permission or a read-only file system); {fix}")
    return p


RUN_RECORD = (HPARAMS, METRICS, CHECKPOINT, UNSAVED, *STUDY_RECORD)


def made_by_emarule(out: Path, kind: str, records: frozenset = frozenset()) -> None:
    """`out` is new, empty, or a folder emarule made for a `kind` ("run", "sweep" or "reproduction"): a folder
    of the user's own files is refused before anything is written, since a run, a sweep or a reproduction
    writes figures/, report.md and compare-*.png under names the user's files may have. A run's folder holds
    a run's record; a sweep's or a reproduction's root, emarule's lock or experiment folders (`emarule list`);
    `records` are further names that mark the folder as emarule's (a reproduction's verdict and ledger, which
    its caller names: this layer lies below analysis/)."""
    from emarule.config.load import experiment_names
    from emarule.engine.runlock import LOCK

    if not out.is_dir():
        return
    names = sorted(e.name for e in os.scandir(out))
    if not names:
        return
    marks = ({LOCK, *RUN_RECORD} if kind == "run" else {LOCK}) | set(records)
    if kind != "run":
        marks |= set(experiment_names())
    if not marks & set(names) and not (kind != "run" and any(_holds_runs(out / n) for n in names)):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise UserError(f"--out {out} holds files emarule did not write ({shown}); pass an empty or new folder, or "
                        f"one emarule made for a {kind}")


def _holds_runs(folder: Path) -> bool:
    """An experiment folder of a sweep's root: it holds emarule's lock, or runs (`<run>/hparams.json`, ...)."""
    from emarule.engine.runlock import LOCK

    if not folder.is_dir() or folder.is_symlink():
        return False
    if (folder / LOCK).exists():
        return True
    return any(e.is_dir(follow_symlinks=False) and any((Path(e.path) / n).exists() for n in (LOCK, *RUN_RECORD))
               for e in os.scandir(folder))


def not_a_run(root: Path, fix: str) -> None:
    """A run's own directory is no root for a sweep's (or a reproduction's) runs: they would be nested in it, and
    its record mixed with theirs."""
    held = [n for n in RUN_RECORD if (root / n).exists()]  # a training run's record, or a study's
    if held:
        raise UserError(f"--out {root} is a run's directory (it holds {held[0]}); pass another --out {fix}")


def run_dir(out: Path, resume: bool, experiment: str | None = None) -> None:
    """`--resume` needs a run to continue; a new run needs a directory that holds none.

    A run's record is its checkpoint, hparams.json or metrics.jsonl, or a study's results.json or
    run.json: a directory holding any of them is never written over by a new run (its checkpoint may
    have been deleted; the record stays), unless a training run marked it as stopped before its first
    checkpoint (`rundir.UNSAVED`). A study has no checkpoint, so `--resume` refuses its directory too.
    A directory another live process has locked is named with its holder.
    Only `emarule run` calls this: a sweep resumes its own runs where a checkpoint is, restarts those
    stopped before their first one, reads a finished one whose checkpoint is gone from its records
    (`sweep.kept_by_records`), and refuses an unfinished one whose checkpoint is gone (`sweep.check_before_training`).
    """
    check_free(out, "run")
    # a sweep or reproduction holds its experiment folder: a run started in it would take one of its runs'
    # directories from under it
    check_free(out.parent, "sweep")
    study = [n for n in STUDY_RECORD if (out / n).exists()]
    record = [n for n in (HPARAMS, METRICS) if (out / n).exists()] + study
    if (out / UNSAVED).exists() and not (out / CHECKPOINT).exists() and not study:
        return  # stopped before its first checkpoint: nothing to keep; the run starts again from scratch
    if resume:
        if not out.exists():
            raise UserError(f"--resume: {out} does not exist; pass --out with the directory of the run to "
                            f"continue, or drop --resume to start a new run")
        if not (out / CHECKPOINT).exists():
            if record:
                raise UserError(f"--resume: no checkpoint in {out} (it holds {' and '.join(record)} of a run that "
                                f"cannot be continued); pass --out NEW_DIR to start a new run, or delete {out}")
            raise nothing_to_resume(out)
    elif (out / CHECKPOINT).exists():
        other = _experiment_of(out)
        if experiment is not None and other is not None and other != experiment:  # --resume could not continue it
            raise UserError(f"{out} holds a run of {other}, not {experiment}; pass --out NEW_DIR")
        raise holds_a_run(out)
    elif record:
        raise UserError(f"{out} already holds a run ({' and '.join(record)}, no checkpoint to resume from); "
                        f"pass --out NEW_DIR to start another, or delete {out} to start over")


def _experiment_of(run: Path) -> str | None:
    """The experiment a run directory's hparams.json names (None where it names none, or cannot be read)."""
    h = read_json(run / HPARAMS)
    name = h.get("experiment") if isinstance(h, dict) else None
    return name if isinstance(name, str) else None


def _bundled_presets(spec: dict) -> list[str]:
    """The presets of the spec's file that train on bundled data (`cpu` first), none where unreadable."""
    from emarule.config.load import load_spec, read_yaml

    source = spec.get("source")
    try:
        names = list((read_yaml(Path(source)).get("presets") or {}) if source else [])
    except UserError:
        return []
    out = []
    for name in names:
        if name == spec.get("preset"):
            continue
        try:
            resolved = load_spec(path=source, preset=name)  # applied as `--preset` applies it
        except UserError:
            continue
        if get(resolved, "data.source") in BUNDLED_DATA:
            out.append(str(name))
    return sorted(out, key=lambda n: (n != "cpu", n))


def local_data(spec: dict) -> None:
    """A data set read from disk needs --data (or data.path): said before anything is written, with
    a fix this spec has (a preset of its own on bundled data, else `--set data.source=...`)."""
    task = spec.get("task")
    if "data" not in task_keys(task):
        return  # a task that makes its own data
    source = value(spec, "data.source")
    if source not in LOCAL_DATA or get(spec, "data.path"):
        return
    field = get(task_keys(task), "data.source")
    bundled = [c for c in (getattr(field, "choices", None) or ()) if c in BUNDLED_DATA]
    presets = _bundled_presets(spec)
    if presets:
        fix = f"use --preset {presets[0]} (bundled data, no download)"
    elif bundled:
        fix = f"add --set data.source={bundled[0]} (bundled, no download)"
    else:
        fix = "set data.path in the spec"
    labeled = value(spec, "data.labeled") if source == "librispeech" else None
    what = LOCAL_DATA[source].format(name=spec.get("name", "?"), labeled=labeled)
    raise UserError(f"{what}, or {fix}")


def data(spec: dict, path: Path | None) -> None:
    """--data only where the run reads a data set from disk, and there it is needed (or data.path)."""
    if path is None:
        local_data(spec)
        return
    name, task = spec.get("name", "?"), spec.get("task")
    if "data" not in task_keys(task):
        raise UserError(f"--data: {name} reads no data set (its {task!r} task makes its own); drop --data")
    source = get(spec, "data.source")
    if source in BUNDLED_DATA:
        preset = spec.get("preset")
        fix = f"drop --preset {preset} to train on your own data" if preset else "set data.source to your data's"
        raise UserError(f"--data: {name}{f' --preset {preset}' if preset else ''} uses bundled data "
                        f"(data.source: {source}); drop --data, or {fix}")


def whole_batches(spec: dict, plan, batch_size: float | None, runs: bool, batch_option: bool = True) -> None:
    """A batch counted in samples is at least one sample, and a whole number of them.

    `batch_size` is an explicit --batch-size; every batch the plan holds (κB and each Progressive
    Scaling stage's) must be at least one sample; with `runs`, each must be a whole number too, as
    `plan` may show a fractional κB. `batch_option`: the command has --batch-size to offer as the fix.
    """
    if value(spec, "batch.unit") != "samples":
        return  # seconds of audio may be fractional
    name, base = spec.get("name", "?"), spec["batch"]["size"]
    if batch_size is not None and not float(batch_size).is_integer():
        raise UserError(f"--batch-size {batch_size:g}: {name} counts its batch in samples; give a whole number")
    batches = [(plan.kappa, plan["batch_size"])]
    batches += [(st.kappa, st.batch_size) for st, _ in (plan.stages or [])]
    for k, b in batches:
        if b < 1 and not math.isclose(b, 1.0, rel_tol=0, abs_tol=1e-6):
            raise UserError(f"κ={k:g} gives a batch of {b:g} samples (κ × {base:g}), below one sample; "
                            f"choose κ ≥ {1 / base:.4g} (κB ≥ 1)"
                            + (", or pass --batch-size N with N ≥ 1" if batch_option else ""))
    if not runs:
        return
    if not float(base).is_integer():
        raise UserError(f"batch.size {base:g}: {name} counts its batch in samples; give a whole number")
    for k, b in batches:
        if not math.isclose(b, round(b), rel_tol=0, abs_tol=1e-6):
            raise UserError(f"κ={_exact(k)} gives a batch of {_exact(b)} samples (κ × {base:g}); choose κ so that "
                            f"κB is a whole number" + (", or pass --batch-size N" if batch_option else ""))


def _exact(x: float) -> str:
    """x as `:g` writes it where that is x (2.3), else every digit it needs (2.0000001, not 2): a message
    about a batch a hair from a whole number must not print the whole number."""
    from emarule.console import exact

    short = f"{x:g}"
    return short if float(short) == float(x) else exact(x)


def runnable(spec: dict, runnable_tasks, sweep: bool = False) -> None:
    """The task can run here, its extras installed (and, for a sweep, trains at one κ per run)."""
    name, task = spec.get("name", "?"), spec.get("task")
    if task not in runnable_tasks:
        ready = ", ".join(sorted(runnable_tasks))
        raise UserError(f"{name}: the {task!r} task cannot run yet (runnable tasks: {ready}); "
                        f"`{suggest.plan_command(spec)} --kappa K` shows its scaled recipe")
    t = registry.lookup(task)
    if t is not None:
        extras.require(name, t.extras)
    unit = value(spec, "batch.unit")
    if t is not None and t.kind == "training" and unit not in t.units:
        fix = t.units[0]
        raise UserError(f"{name}: batch.unit {unit} is not a unit the {task} task batches by "
                        f"({', '.join(t.units)}); set batch.unit: {fix} in the spec or --set batch.unit={fix}")
    if sweep and t is not None and t.kind == "study":
        raise UserError(f"{name} sweeps κ itself and has no κ=1 baseline to compare with; "
                        f"use `emarule run {name}` instead of `emarule sweep`")


def metric(spec: dict, name: str | None) -> None:
    """`sweep --metric` names something a run of this spec logs, whole (checked where the task's metrics are
    known): `ema_X` only for an X its EMAs are scored on, `/<ρ>` only for a momentum of ema.also, `/<split>`
    only for a split of data.eval_splits after the first."""
    if name is None:
        return
    t = registry.lookup(spec.get("task"))
    if t is None or t.kind != "training":
        return
    if name not in logged_metrics(spec, t):
        target = ", ".join((*LOOP_METRICS, *_spec_metrics(spec, t)))
        emas = (f"ema_<name> for {', '.join(t.ema_metrics)}" if t.ema_metrics else
                "no ema_<name>: its evaluations score the teacher alone")
        also = [_extra_name(r) for r in value(spec, "ema.also")]
        extra = f"; /<ρ> after ema_<name> for ema.also {', '.join(also)}" if also and t.ema_metrics else ""
        splits = _splits(spec, t)
        extra += f"; /<split> for {', '.join(splits)}" if splits else ""
        raise UserError(f"--metric {name!r}: {spec.get('name', '?')} logs {target} ({emas}{extra}); pass one of them")


def _extra_name(rho: float) -> str:
    from emarule.scaling.plan import extra_ema_name

    return extra_ema_name(rho)


def _splits(spec: dict, task) -> list[str]:
    """The evaluation splits after the first, whose metrics end in /<split>."""
    data = task.config.get("data") or {}
    if "eval_splits" not in data or not task.ema_metrics:
        return []
    return [str(s) for s in value(spec, "data.eval_splits")[1:]]


def logged_metrics(spec: dict, task) -> set[str]:
    """Every metric name a run of `spec` with training task `task` logs (emarule.engine.evaluation.metric_name)."""
    names = {*LOOP_METRICS, *_spec_metrics(spec, task)}
    also = [_extra_name(r) for r in value(spec, "ema.also")]
    for base in task.ema_metrics:
        for split in ["", *(f"/{s}" for s in _splits(spec, task))]:
            names |= {f"{base}{split}", f"ema_{base}{split}", *(f"ema_{base}/{a}{split}" for a in also)}
    return names


def _spec_metrics(spec: dict, task) -> tuple[str, ...]:
    """The task's metrics that a run of this spec logs: those tied to a spec section only where it has one."""
    absent = {m for section, names in task.section_metrics.items() if not spec.get(section) for m in names}
    return tuple(m for m in task.metrics if m not in absent)


def batch_multiple(spec: dict) -> int:
    """What every Progressive Scaling ramp batch of a run launched here is a multiple of, so that it splits over
    the run's processes: its world size (1 for one process). A micro-batch needs no multiple: a rank's share
    splits into micro-batches that differ by at most one sample. A study trains no batches (and imports no torch)."""
    from emarule import registry

    task = registry.lookup(spec.get("task"))
    if task is None or task.kind != "training":
        return 1
    from emarule.engine import distributed

    return distributed.world_size()
