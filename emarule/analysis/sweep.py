"""`emarule sweep`: the κ=1 baseline and every κ with and without the EMA Scaling Rule, then compare.

For each seed: the baseline at κ=1 once (with and without the rule are the same run there:
ρ^1 = ρ), then each κ ≠ 1 once per rule. Runs go one after another in this process, each into
ROOT/<experiment>/<name> with `emarule.engine.context.default_run_name` names (tiny-k1-rule-s0,
tiny-k4-norule-s0, ...). Every run is resolved and checked before the first one trains. A run
directory that already holds a checkpoint is resumed — a finished run is kept as it is — so an
interrupted sweep picks up where it stopped with the same command; a finished run kept as its records alone
(its checkpoint gone) is read from them and not trained again. A run that diverges
(`TrainingDiverged`) is recorded as such and the sweep goes on: compare shows it as stopped early, with an
infinite gap (run again, it resumes from its last good checkpoint). Each run ends with its figures
and summary (`emarule.analysis.run_report`); at the end the runs are compared (`emarule.analysis.compare`) on the
task's headline metric and on the training loss, with one figure per metric in ROOT/<experiment>/.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from emarule import registry
from emarule.request import checks
from emarule.engine.context import EMA_RULE_NAMES, rule_from_word, rule_names
from emarule.errors import UserError
from emarule.engine.rundir import CHECKPOINT
from emarule.analysis.parallel import DIVERGED_KEY  # noqa: F401 (a sweep's results name it)

RULES = {r.word: r.rule for r in EMA_RULE_NAMES}  # --rule word → the plan's rule


@dataclass
class SweepRun:
    kappa: float
    rule: str | None  # "exponential", "linear" or None
    seed: int
    baseline: bool
    # A reproduction's extra setting (emarule.analysis.reproduce.claims.Arm): its name goes into the run's name,
    # and `resolve_run` gets it as a fourth argument.
    arm: object = None

    @property
    def label(self) -> str:
        if self.arm is not None:
            return f"arm {self.arm.name}"
        return "baseline" if self.baseline else rule_names(self.rule).label


def parse_rules(text: str) -> list[str | None]:
    names = [t.strip() for t in text.split(",")]
    if len(names) > 1 and "" in names:
        raise UserError(f"--rule {text!r}: an empty item; give with, without or linear separated by commas "
                        f"(e.g. --rule with,without)")
    names = [n for n in names if n]
    if not names:
        raise UserError("--rule needs at least one of with, without, linear (e.g. --rule with,without)")
    bad = [n for n in names if n not in RULES]
    if bad:
        raise UserError(f"--rule {bad[0]!r}: use with, without or linear, comma-separated (e.g. --rule with,without)")
    out: list[str | None] = []
    for n in names:
        if rule_from_word(n) in out:
            raise UserError(f"--rule {text!r}: {n!r} is given twice; give each rule once (e.g. --rule with,without)")
        out.append(rule_from_word(n))
    return out


def distinct_kappas(kappas: list[float] | None, text: str | None) -> list[float] | None:
    """`--kappas 2,2` would run κ=2 once and drop the second without a word: an error instead."""
    seen: list[float] = []
    for k in kappas or []:
        if any(math.isclose(k, s) for s in seen):
            raise UserError(f"--kappas {text}: κ={k:g} is given twice; give each κ once (e.g. --kappas 1,2,4)")
        seen.append(k)
    return kappas


def plan_runs(kappas: list[float], rules: list[str | None], seeds, arms=()) -> list[SweepRun]:
    """Baseline first for each seed, then κ ascending, rule in the order given, then each arm. `seeds`:
    the seeds (`emarule.request.seeds.parse_seeds`), or a count N for seeds 0…N−1."""
    if isinstance(seeds, int):
        if seeds < 1:
            raise UserError(f"--seeds must be ≥ 1, got {seeds}")
        seeds = range(seeds)
    ks = sorted({float(k) for k in kappas})
    if not ks:
        raise UserError("--kappas needs at least one value, e.g. --kappas 1,2,4")
    base_rule = "exponential" if "exponential" in rules else rules[0]
    runs = []
    for seed in seeds:
        runs.append(SweepRun(1.0, base_rule, seed, True))
        for k in ks:
            if math.isclose(k, 1.0):
                continue
            for r in rules:
                runs.append(SweepRun(k, r, seed, False))
        for a in arms:
            runs.append(SweepRun(float(a.kappa), a.rule, seed, False, a))
    return runs


def execute(console, runs: list[SweepRun], resolve_run: Callable, root: Path, tasks, *, data: Path | None = None,
            max_device_batch: int | None = None, wandb: str = "off", metric: str | None = None,
            jobs: int | None = 1, follow_up: Callable | None = None,
            num_workers: int | None = None, figures: list | None = None,
            on_run_end: Callable[[], None] | None = None, executor=None, judge_only: bool = False) -> list[dict]:
    """Resolve and check every run first (a bad κ, rule, batch, --data or --metric fails before any
    training and before anything is written), run them in turn, compare.

    `resolve_run(kappa, rule, baseline)` → (spec, κ, rule, progressive, plan), as the CLI's `resolve`.
    `tasks` is `emarule.tasks` (RUNNABLE_TASKS, run_task, build_parts), passed in: the engine imports no task.
    `follow_up(i, run_dir)`: work for idle workers once run i has finished (`parallel.run_side_by_side`);
    runs one after another leave it to the caller.
    `figures`: a list the comparison figures' paths are appended to as they are written (none where the
    comparison is not drawn: not the main process, or no run done).
    `on_run_end()`: called as each run ends (a reproduction's ledger line counts it).
    `executor` (`emarule.analysis.executors.Executor`): None or local trains here; else each run is a job.
    `judge_only`: train nothing; every run must be in the root already, finished by its records
    (`from_records`), and is returned as it is.
    """
    from emarule.engine.context import RunContext, default_run_name

    checks.out_dir(root)
    ctxs, named = [], {}
    for r in runs:
        s, k, rule, pr, p = resolve_run(r.kappa, r.rule, r.baseline, *([r.arm] if r.arm is not None else []))
        if not ctxs:  # the same spec for every run
            checks.runnable(s, tasks.RUNNABLE_TASKS, sweep=True)
            checks.data(s, data)
            checks.metric(s, metric)
        checks.whole_batches(s, p, None, runs=True, batch_option=False)  # a sweep takes κ only
        arm = r.arm.name if r.arm is not None else None
        out = checks.out_dir(root / s["name"] / default_run_name(k, rule, r.seed, pr, s.get("preset"), arm))
        if out in named:  # names keep κ to 6 digits: a second run would resume the first one's directory
            raise UserError(f"κ={named[out]!r} and κ={k!r} both make the run {out} (run names keep 6 significant "
                            f"digits of κ); give κ values that differ in those")
        named[out] = k
        ctxs.append(RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=out, progressive=pr,
                               preset=s.get("preset"), data=data, seed=r.seed, wandb=wandb,
                               max_device_batch=max_device_batch, num_workers=num_workers))
    link_forks(runs, ctxs)
    if judge_only:
        return from_records(console, runs, ctxs, metric, figures)
    kept = kept_by_records(ctxs)
    if len(kept) == len(ctxs):  # each already read and checked
        return judged_as_recorded(console, runs, ctxs, metric, figures)
    if kept:
        from emarule.engine import distributed

        if distributed.is_main():
            console.print(f"{len(kept)} of the {len(ctxs)} runs ended before and kept only their records (their "
                          f"checkpoints are gone): judged from those, they do not train again", highlight=False)
    if executor is not None and executor.submits:  # each run its own job, checked as its turn comes
        return _execute_as_jobs(console, runs, ctxs, executor, metric, tasks, figures, on_run_end, jobs, kept)
    check_before_training([c for i, c in enumerate(ctxs) if i not in kept], tasks.build_parts)
    from emarule.engine.runlock import lock_dir

    with lock_dir(ctxs[0].out.parent, "sweep"):  # ROOT/<experiment>: its runs and compare figures
        return _run_all(console, runs, ctxs, metric, tasks, jobs, follow_up, figures, on_run_end, kept)


def link_forks(runs: list[SweepRun], ctxs: list) -> None:
    """Each run that starts at κ=1 and leaves it, with its seed's baseline's spec, starts from that baseline where
    it leaves κ=1 (emarule/engine/fork.py): the baseline keeps a snapshot there, which the run, started after
    it, takes up. Its runs wait for the baseline already."""
    from emarule.engine import fork
    from emarule.config.identity import comparable

    base_of = {r.seed: c for r, c in zip(runs, ctxs, strict=True) if r.baseline}
    plans: dict[int, list] = {}
    for r, c in zip(runs, ctxs, strict=True):
        b = base_of.get(r.seed)
        if r.baseline or b is None or not fork.leaves_kappa_one(c.plan) or comparable(c.spec) != comparable(b.spec):
            continue
        c.fork_from = b.out
        plans.setdefault(id(b), []).append(c.plan)
    for b in base_of.values():
        b.forks = fork.offers(plans.get(id(b), []))


def _run_all(console, runs: list[SweepRun], ctxs: list, metric: str | None, tasks, jobs: int | None = 1,
             follow_up: Callable | None = None, figures: list | None = None,
             on_run_end: Callable[[], None] | None = None, kept: frozenset = frozenset()) -> list[dict]:
    """Train the runs not `kept` (`kept_by_records`: their records stand for them), `jobs` at a time."""
    from emarule.engine import distributed
    from emarule.analysis import parallel
    from emarule.analysis.run_report import print_report, report
    from emarule.errors import TrainingDiverged

    main = distributed.is_main()
    for ctx in ctxs:
        ctx.resume = (ctx.out / CHECKPOINT).exists()
    order = [i for i in range(len(runs)) if i not in kept]  # the runs that train
    jobs = parallel.jobs_for(jobs, len(order), distributed.world_size())

    def header(i: int) -> str:
        r, ctx, p = runs[i], ctxs[i], ctxs[i].plan
        rho = p.get("ema.momentum")
        return (f"[{i + 1}/{len(runs)}] {ctx.out}: κ={ctx.kappa:g} {r.label}, B={p['batch_size']:g}"
                + (f", ρ={rho:.6g}" if rho is not None else "") + (" (resuming what is there)" if ctx.resume else ""))

    done: dict[int, dict] = {i: entry(runs[i], ctxs[i]) for i in kept}

    def finished(i: int, result: dict, wall: float) -> None:
        r, ctx = runs[i], ctxs[i]
        if main:
            print_report(console, report(ctx.out, wall))
        done[i] = entry(r, ctx, wall, ctx.resume, result)
        if on_run_end is not None:
            on_run_end()

    if jobs > 1:
        def side_by_side_done(j: int, result: dict, wall: float, output: str) -> None:
            i = order[j]
            console.print(header(i) + f", finished in {wall:.0f} s", highlight=False)
            for w in ctxs[i].plan.warnings:
                console.print(f"  warning: {w}", markup=False, highlight=False)
            if output.strip():
                console.print(output.rstrip(), markup=False, highlight=False)
            finished(i, result, wall)

        # Each seed's κ=1 baseline finishes before that seed's other runs start, as one after another:
        # a run may read its seed's baseline (ctc-pseudo-label's start threshold).
        t0 = time.monotonic()
        parallel.run_side_by_side(console, [Path(ctxs[i].out).name for i in order], [ctxs[i] for i in order], jobs,
                                  side_by_side_done, after=waits_for([runs[i] for i in order]),
                                  follow_up=None if follow_up is None else
                                  (lambda j: follow_up(order[j], Path(ctxs[order[j]].out))))
        side_by_side_s = time.monotonic() - t0
    else:
        for i in order:
            ctx = ctxs[i]
            if main:
                console.print(header(i), highlight=False)
                for w in ctx.plan.warnings:
                    console.print(f"  warning: {w}", markup=False, highlight=False)
            t0 = time.monotonic()
            try:
                result = tasks.run_task(ctx) or {}
            except TrainingDiverged as e:  # the others still answer the sweep's question; this one is its answer
                if main:
                    console.print(f"  diverged: {e}", markup=False, highlight=False)
                result = {DIVERGED_KEY: str(e)}
            finished(i, result, time.monotonic() - t0)
    done_list = [done[i] for i in sorted(done)]
    if main and done_list:
        print_summary(console, done_list)
        if jobs > 1:
            console.print(f"wall time with {jobs} runs at a time: {side_by_side_s:.1f} s", highlight=False)
        # An arm shares κ and rule with a standard setting (it differs by --set or --progressive), so
        # compare, which groups by those, sees the standard runs only; the reproduction's figure draws arms.
        compared = compare_after(console, [Path(d["run"]) for d in done_list if d["arm"] is None],
                                 ctxs[0].out.parent, metric, registry.training_losses())
        if figures is not None:
            figures.extend(Path(c["figure"]) for c in compared if c.get("figure"))
    return done_list


def entry(r: SweepRun, ctx, wall_s: float = 0.0, resumed: bool = True, result: dict | None = None) -> dict:
    """A sweep's line for one run (`execute` returns them); by default a run it did not train."""
    return {"run": str(ctx.out), "kappa": r.kappa, "rule": r.label, "seed": r.seed, "wall_s": wall_s,
            "resumed": resumed, "result": result or {}, "arm": r.arm.name if r.arm is not None else None}


def waits_for(runs: list[SweepRun]) -> list[int | None]:
    """For each run, the index of the run it waits for: its seed's κ=1 baseline, where that is among `runs`."""
    base_of = {r.seed: i for i, r in enumerate(runs) if r.baseline}
    return [None if r.baseline else base_of.get(r.seed) for r in runs]


def finished_by_records(run) -> bool:
    """Whether a run's log shows it ended: it reached its planned end, or it diverged (a non-finite value
    logged, as a run that stops on one records it); a log that merely stops is a run still training or
    killed. A run that records no planned end counts as ended."""
    from emarule.analysis.compare import DIVERGED

    return not run.stopped_early() or any(v in DIVERGED for r in run.rows for v in r.values())


def ended_by_records(ctx, fix: str | None = None) -> bool | None:
    """Whether the run `ctx` plans has ended by its records (`finished_by_records`); None where it has none
    (hparams.json and metrics.jsonl). Records made with other settings are one error line, `fix` its advice."""
    from emarule.analysis.compare import load_run
    from emarule.engine import preflight
    from emarule.engine.rundir import HPARAMS, METRICS

    if not ((ctx.out / HPARAMS).is_file() and (ctx.out / METRICS).is_file()):
        return None
    run = load_run(ctx.out)  # a damaged hparams.json is its one-line error
    recorded = run.hparams.get("fingerprint")
    if recorded is not None:
        preflight.check_same_settings(ctx, recorded, fix=fix)
    return finished_by_records(run)


KEPT_FIX = "give the sweep a new --out or remove that run"  # as a sweep says it of a run it would resume


def kept_by_records(ctxs: list) -> frozenset:
    """The runs whose checkpoint is gone but whose records show they ended (a root kept as its records, as
    results/cpu-root keeps one): those records stand for them, and they do not train again. A run with no
    checkpoint whose log stops short is left to `check_before_training`, which refuses it."""
    from emarule.engine.rundir import UNSAVED

    return frozenset(i for i, c in enumerate(ctxs) if not (c.out / CHECKPOINT).exists()
                     and not (c.out / UNSAVED).exists() and ended_by_records(c, fix=KEPT_FIX))


def from_records(console, runs: list[SweepRun], ctxs: list, metric: str | None, figures: list | None) -> list[dict]:
    """The planned runs as their records in the root have them, training nothing: each must hold
    hparams.json and metrics.jsonl made with these settings and have ended (`finished_by_records`). Its
    checkpoint is not read, so a root copied without its checkpoints can be judged again."""
    missing, unfinished = [], []
    for ctx in ctxs:
        ended = ended_by_records(ctx, fix="--judge-only judges a root with the settings it was made with: give its "
                                          "--preset, --seeds and --kappas")
        if ended is None:
            missing.append(ctx.out.name)
        elif not ended:
            unfinished.append(ctx.out.name)
    for what, names, fix in (("has no records of", missing, "train"), ("holds unfinished records of", unfinished,
                                                                        "finish")):
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise UserError(f"--judge-only: {ctxs[0].out.parent} {what} {len(names)} of the {len(ctxs)} runs this "
                            f"reproduction reads ({shown}); run it without --judge-only to {fix} them")
    return judged_as_recorded(console, runs, ctxs, metric, figures)


def judged_as_recorded(console, runs: list[SweepRun], ctxs: list, metric: str | None,
                       figures: list | None) -> list[dict]:
    """The runs, every one ended by records made with these settings (`from_records`, `kept_by_records`), as
    `execute` returns them, with the sweep's comparison; nothing trains."""
    from emarule.engine import distributed

    done = [entry(r, c) for r, c in zip(runs, ctxs, strict=True)]
    if distributed.is_main():
        console.print(f"judging the {len(done)} runs in {ctxs[0].out.parent} from their records; nothing trains",
                      highlight=False)
        compared = compare_after(console, [Path(d["run"]) for d in done if d["arm"] is None], ctxs[0].out.parent,
                                 metric, registry.training_losses())
        if figures is not None:
            figures.extend(Path(c["figure"]) for c in compared if c.get("figure"))
    return done


def check_before_training(ctxs: list, build_parts: Callable) -> None:
    """What a run would find only when its turn comes, found before the first one trains: a run already
    in the root made with other settings, and a batch larger than the training set (the task's data is
    built once, for the run with the largest batch)."""
    import json
    from dataclasses import replace

    from emarule.engine import distributed, preflight
    from emarule.engine.rundir import HPARAMS, METRICS, UNSAVED

    from emarule.engine.runlock import check_free

    check_free(ctxs[0].out.parent, "sweep")
    for ctx in ctxs:
        ctx.resume_hint = "run the same command again: finished runs are kept and this one resumes"
        check_free(ctx.out, "run")
        record = [n for n in (HPARAMS, METRICS) if (ctx.out / n).exists()]
        if record and not (ctx.out / CHECKPOINT).exists() and not (ctx.out / UNSAVED).exists():
            # a run stopped before its first checkpoint is marked UNSAVED and starts again; this one had one
            # (deleted since) and its log does not show it ended (`kept_by_records` keeps one that did), and
            # training it again would write over its record
            raise UserError(f"{ctx.out} holds a run ({' and '.join(record)}) whose checkpoint is gone and whose "
                            f"log stops before its end, so it can be neither reused nor resumed; delete {ctx.out} "
                            f"to train it again, or give the sweep a new --out")
        if (ctx.out / CHECKPOINT).exists() and (ctx.out / HPARAMS).is_file():
            try:
                recorded = json.loads((ctx.out / HPARAMS).read_text()).get("fingerprint")
            except (ValueError, AttributeError):  # a damaged record: said when this run resumes
                recorded = None
            if recorded is not None:  # runs written before hparams.json held it are checked when resumed
                try:
                    preflight.check_same_settings(ctx, recorded)
                except UserError:
                    preflight.check_record_if_edited(ctx)
                    raise

    def largest(ctx) -> float:
        return max(p["batch_size"] for _, p in preflight.stage_plans(ctx))

    big = max(ctxs, key=largest)
    if largest(big) > largest(ctxs[0]):  # the first run checks its own batch before it writes anything
        quiet = replace(big, quiet=True)
        preflight.check_batches_fit(quiet, preflight.make_batcher(quiet, build_parts(quiet)), distributed.world_size())


def print_summary(console, done: list[dict]) -> None:
    from rich.table import Table

    keys = []
    for d in done:
        for k, v in (d["result"] or {}).items():
            if k not in keys and k not in ("samples_seen", "steps", "kappa", "epoch") and isinstance(v, (int, float)):
                keys.append(k)
    t = Table(title="sweep: runs", title_justify="left")
    for c in ("run", "κ", "rule", "seed", "steps", "wall s", *keys):
        t.add_column(c, justify="left" if c in ("run", "rule") else "right")
    for d in done:
        res = d["result"] or {}
        steps = DIVERGED_KEY if DIVERGED_KEY in res else str(res.get("steps", "—"))
        t.add_row(Path(d["run"]).name, f"{d['kappa']:g}", d["rule"], str(d["seed"]), steps,
                  f"{d['wall_s']:.1f}" + (" (resumed)" if d["resumed"] else ""),
                  *[f"{res[k]:.4g}" if isinstance(res.get(k), (int, float)) else "—" for k in keys])
    total = sum(d["wall_s"] for d in done)
    console.print(t)
    console.print(f"total wall time: {total:.1f} s", highlight=False)


def compare_after(console, run_dirs: list[Path], root: Path, metric: str | None, losses: tuple) -> list[dict]:
    """The compare table (and figure) for the headline metric, then for the training loss: the first of
    `losses` (the registry's `training_losses()`) logged, e.g. BYOL's without the tracking probe's
    cross-entropy."""
    from emarule.analysis import compare

    first = compare.compare(run_dirs, metric)
    metrics = [first["metric"]]
    if metric is None:
        shared = set.intersection(*(r.metrics() for r in first["_runs"]))
        loss = next((m for m in losses if m in shared), None)
        if loss is not None and loss != first["metric"]:
            metrics.append(loss)
    out = []
    for m in metrics:
        out.append(compare.run_compare(console, run_dirs, m, root / compare.figure_name(m)))
    return out


def _execute_as_jobs(console, runs: list, ctxs: list, executor, metric: str | None, tasks,
                    figures: list | None = None, on_run_end=None, jobs: int | None = None,
                    kept: frozenset = frozenset()) -> list[dict]:
    """`sweep.execute` for submitted runs, its checks done: the jobs, then each run's summary, the sweep's table
    and its comparison, as on this machine. `jobs` (--jobs): submitit-local's jobs at a time (`parallel.jobs_for`).
    The `kept` runs (`kept_by_records`) are not submitted: their records stand for them."""
    from emarule.analysis import parallel
    from emarule.analysis.jobs import JOBS_DIR, drop_empty, run_as_jobs
    from emarule.analysis.run_report import print_report, report
    from emarule.engine.runlock import lock_dir

    order = [i for i in range(len(runs)) if i not in kept]  # the runs submitted
    sub_runs, sub_ctxs = [runs[i] for i in order], [ctxs[i] for i in order]
    nodes, per_node = executor.world
    at_once = parallel.jobs_for(jobs, len(order), 1) if executor.kind == "submitit-local" else None
    console.print(f"{len(order)} runs, each its own {executor.kind} job of {nodes} node{'s' if nodes > 1 else ''} × "
                  f"{per_node} process{'es' if per_node > 1 else ''}"
                  + (f", {at_once} at a time (--jobs)" if at_once is not None else "")
                  + f"; job files in {Path(ctxs[0].out).parent / JOBS_DIR}", highlight=False)
    with lock_dir(Path(ctxs[0].out).parent, "sweep"):
        resumed = {i: (Path(c.out) / CHECKPOINT).exists() for i, c in enumerate(ctxs)}
        try:
            # Each seed's κ=1 baseline finishes before that seed's other runs start, as on this machine.
            ended = run_as_jobs(console, sub_runs, sub_ctxs, executor, waits_for(sub_runs), tasks,
                                check_before_training, on_run_end, at_once)
        finally:
            drop_empty(Path(ctxs[0].out).parent / JOBS_DIR / "%j")  # LocalExecutor's controller makes it
        by_index = {i: entry(runs[i], ctxs[i]) for i in kept}
        for j, result, wall in ended:
            i = order[j]
            print_report(console, report(ctxs[i].out, wall))
            by_index[i] = entry(runs[i], ctxs[i], wall, resumed[i], result)
        done = [by_index[i] for i in sorted(by_index)]
        print_summary(console, done)
        compared = compare_after(console, [Path(d["run"]) for d in done if d["arm"] is None],
                                 Path(ctxs[0].out).parent, metric, registry.training_losses())
        if figures is not None:
            figures.extend(Path(c["figure"]) for c in compared if c.get("figure"))
        return done
