"""`emarule reproduce FAMILY`: run (or reuse) what a family needs, measure every claim, write the report.

A sweep family runs `emarule.analysis.sweep.execute` — the κ=1 baseline and every κ with and without the
EMA Scaling Rule, and the family's arms, for every seed, into OUT/<experiment>/<run> — which keeps
finished runs and resumes interrupted ones, so the same command picks up where it stopped. Only the
runs of this invocation's seeds and settings are measured, whatever else OUT holds. A study family (parabola,
precision) runs once into OUT/<experiment>/<run> and is reused when its results.json is there.
Then OUT/report.md, OUT/verdict.json and OUT/figures/ are written and the verdict table printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable

from emarule import extras
from emarule.request import checks
from emarule.errors import UserError
from emarule.analysis.reproduce import ledger, report as R
from emarule.analysis.reproduce.claims import FAMILIES, FULL, PROBES, Family, headline_only
from emarule.engine import distributed
from emarule.engine.context import RunContext, default_run_name
from emarule.engine.rundir import HPARAMS, METRICS, atomic_write_text, read_json, read_metrics
from emarule.engine.runlock import lock_dir
from emarule.request.seeds import seeds_label, seeds_text
from emarule import registry

STUDY_SPEC = "reproduce-spec.json"  # the spec a study's results.json was computed with

# Where each study claim's figure is, inside the study's run directory.
STUDY_FIGURES = {
    "parabola_match": "figures/fig1a_rho0.9999_D1.png", "parabola_tracks_rho_star": "figures/fig1b_rho0.9999_D1.png",
    "parabola_rho_star_higher": "figures/fig1b_rho0.9999_D1.png",
    "parabola_target_onset": "figures/fig1b_rho0.9999_D1.png", "parabola_inflection": "figures/fig1b_rho0.9999_D1.png",
    "parabola_lower_rho_worse": "figures/summary.png", "parabola_dimensions": "figures/fig1b_rho0.9999_D100.png",
    "parabola_no_rule_large": "figures/summary.png", "precision_fp16_variance": "figures/precision.png",
    "precision_bf16_stable": "figures/precision.png", "precision_fp32_stable": "figures/precision.png",
    "precision_fp32_range": "",
}


def check(family: Family, preset: str | None, seeds: tuple | None, kappas: list[float] | None) -> str | None:
    """The spec's preset to use (None: the base spec); refuses what cannot run, before anything is written."""
    from emarule.config.load import read_yaml, spec_path
    from emarule.tasks import RUNNABLE_TASKS

    spec = read_yaml(spec_path(family.experiment, None))
    task = spec.get("task")
    if task not in RUNNABLE_TASKS:
        raise UserError(f"reproduce {family.name}: the {family.experiment} experiment's {task!r} task cannot run yet "
                        f"(runnable tasks: {', '.join(sorted(RUNNABLE_TASKS))}); its claims are listed in the "
                        f"README's Reproduction table")
    extras.require(f"reproduce {family.name}", registry.lookup(task).extras)
    if family.kind == "study" and (seeds is not None or kappas is not None):
        raise UserError(f"reproduce {family.name}: the study sweeps κ and ρ itself in one run (parabola: exact "
                        f"expectations and a Monte Carlo hold-out; precision: repeats); drop --seeds and --kappas")
    chosen = family.preset if preset is None else preset
    if chosen == FULL:
        return None
    presets = spec.get("presets") or {}
    if chosen is not None and chosen not in presets:
        have = ", ".join(sorted(presets)) or "none"
        raise UserError(f"reproduce {family.name}: {family.experiment} has no {chosen!r} preset yet (presets: "
                        f"{have}; `--preset {FULL}` runs the paper's recipe)")
    return chosen


def refuse_foreign(root: Path, family: Family) -> None:
    """A run's directory, or another family's reproduction, is not a place for this one: its report.md and
    verdict.json would be overwritten, or a run's directory filled with a reproduction. Refused before
    anything is written."""
    checks.not_a_run(root, f"for the reproduction, e.g. runs/reproduce/{family.name}")
    names = set(os.listdir(root)) if root.is_dir() else set()
    if R.REPORT in names and not {R.VERDICT, ledger.LEDGER} & names:  # the user's report.md, which ours would replace
        raise UserError(f"--out {root} holds a {R.REPORT} that emarule did not write (no {R.VERDICT} or "
                        f"{ledger.LEDGER} beside it); pass an empty or new --out, or move {root / R.REPORT} away")
    checks.made_by_emarule(root, "reproduction", frozenset({R.VERDICT, ledger.LEDGER, STUDY_SPEC}))
    old = read_json(root / R.VERDICT)
    other = old.get("family") if isinstance(old, dict) else None
    other = other or next((f for f in ledger.families(root) if f != family.name), None)
    if other is not None and other != family.name:
        raise UserError(f"--out {root} holds the {other} reproduction; pass another --out for {family.name}, "
                        f"e.g. runs/reproduce/{family.name}")


def earlier_verdict(root: Path, family: Family, wanted: dict) -> str | None:
    """The command of a finished reproduction in `root` made with other settings than `wanted` (`ledger.resolved`;
    None: none, or the same ones, a rerun that reuses its runs and replaces its verdict). Read before anything
    runs; a verdict.json records no --data, so `wanted`'s is left out."""
    old = read_json(root / R.VERDICT)
    if not isinstance(old, dict) or old.get("family") != family.name:
        return None
    was = ledger.of_verdict(family.name, old, "--headline" in str(old.get("command", "")).split())
    return None if was == wanted | {"data": None} else str(old.get("command") or "an earlier reproduction")


def keep_earlier(console, root: Path, command: str) -> None:
    """The verdict and report of other settings moved to the first free `verdict-N.json` / `report-N.md`, and
    said, before this reproduction writes its own: the earlier result is never lost."""
    n = 1
    while (root / f"verdict-{n}.json").exists() or (root / f"report-{n}.md").exists():
        n += 1
    kept = []
    for name, new in ((R.VERDICT, f"verdict-{n}.json"), (R.REPORT, f"report-{n}.md")):
        if (root / name).is_file():
            os.replace(root / name, root / new)
            kept.append(new)
    console.print(f"the earlier verdict of `{command}` is kept as {' and '.join(kept)}", highlight=False,
                  markup=False, soft_wrap=True)


def command_text(family: Family, preset: str | None, seeds: tuple | None, kappas: list[float] | None,
                 out: Path, data: Path | None, headline: bool = False) -> str:
    given = {"--preset": preset, "--seeds": None if seeds is None else seeds_text(seeds),
             "--kappas": None if kappas is None else ",".join(f"{k:g}" for k in kappas),
             "--data": None if data is None else str(data), "--out": str(out)}
    parts = ["emarule", "reproduce", family.name] + (["--headline"] if headline else [])
    return shlex.join(parts + [x for flag, v in given.items() if v is not None for x in (flag, v)])


def reproduce(console, name: str, *, preset: str | None, seeds: tuple | None, kappas: list[float] | None,
              out: str | None, data: Path | None, resolver: Callable, jobs: int | None = None,
              headline: bool = False, executor=None, judge_only: bool = False) -> dict:
    """`resolver(experiment, preset)` → `resolve_run(kappa, rule, baseline, arm=None)` as `emarule sweep`
    builds it; an arm (`claims.Arm`) adds its --set overrides and --progressive schedule. `seeds`: the
    seeds (`emarule.request.seeds.parse_seeds`), None for the family's default. `executor`
    (`emarule.analysis.executors.Executor`): where a sweep family's runs train. `judge_only`: train nothing and
    judge the runs the root holds from their records (`sweep.from_records`)."""
    if name not in FAMILIES:
        raise UserError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}")
    family = FAMILIES[name]
    if judge_only and family.kind != "sweep":
        raise UserError(f"reproduce {name} --judge-only: the {name} study computes its claims in one run; drop "
                        f"--judge-only (a finished study's results.json is reused as it is)")
    if judge_only and executor is not None and executor.submits:
        raise UserError(f"reproduce {name} --judge-only trains nothing, so it submits no job; drop --executor")
    if executor is not None and executor.submits and family.kind != "sweep":
        raise UserError(f"reproduce {name} --executor {executor.kind}: the {name} study is one run on this machine; "
                        f"drop --executor")
    if headline:
        if family.kind != "sweep":
            raise UserError(f"reproduce {name} --headline: the {name} study judges every claim from one run; "
                            f"drop --headline")
        family = headline_only(family)
    spec_preset = check(family, preset, seeds, kappas)
    if data is not None and family.kind == "study":  # a sweep family's runs check --data as `emarule sweep` does
        from emarule.config.load import load_spec

        checks.data(load_spec(family.experiment, preset=spec_preset), data)
    chosen = preset if preset is not None else family.preset
    family = replace(family, arms=tuple(a.for_preset(chosen) for a in family.arms))
    root = checks.out_dir(out) or Path("runs") / "reproduce" / family.name
    checks.out_dir(root)
    refuse_foreign(root, family)
    same_as = ledger.resolved(family.name, preset=preset, seeds=seeds, kappas=kappas, headline=headline, data=data)
    earlier = earlier_verdict(root, family, same_as)
    with lock_dir(root, "reproduction"):
        text = command_text(family, preset, seeds, kappas, root, data, headline)
        t0, load0, logs = time.monotonic(), os.getloadavg()[0], _logs(root)
        resolve_run = resolver(family.experiment, spec_preset)
        args = {"preset": chosen, "command": text,
                "seeds": list(seeds if seeds is not None else family.seeds) if family.kind == "sweep" else None,
                "kappas": kappas if kappas is not None else list(family.kappas)}
        # The line a kill would leave (the ledger's docstring); only the main process writes the ledger.
        beat = ledger.Heartbeat(root, text, same_as, t0, lambda: _trained_since(root, logs))
        try:
            with beat if distributed.is_main() else nullcontext():
                if family.kind == "sweep":
                    args["arms"] = R.arms_rows(family, spec_preset)
                    result = _sweep(console, family, args, root, data, resolve_run, jobs,
                                    beat.poke if distributed.is_main() else None, executor, judge_only)
                else:
                    result = _study(console, family, root, resolve_run)
        except BaseException as e:  # Ctrl-C or a failure: the time its finished runs took is still counted
            if distributed.is_main():
                beat.fail(e)
            raise
        if result is None:  # not the main process of a torchrun launch
            return {}
        claims, measured, figures, timing = result
        timing |= {"wall_s": time.monotonic() - t0, "load_start": load0, "load_end": os.getloadavg()[0],
                   "cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS", "unset (torch's default)")}
        timing |= ledger.record(root, text, timing, same_as, replaces=beat.token)
        data_out = R.payload(family, args, claims, measured, figures, timing)
        if earlier is not None:
            keep_earlier(console, root, earlier)
        R.write(root, family, data_out)
        R.print_verdicts(console, data_out)
        console.print(f"report: {root / R.REPORT}; verdicts: {root / R.VERDICT}", highlight=False)
        return data_out


def _logs(root: Path) -> dict[str, bytes]:
    """A digest of every run's log under ROOT (ROOT/<experiment>/<run>/metrics.jsonl), by path."""
    out = {}
    for log in root.glob(f"*/*/{METRICS}"):
        try:
            out[str(log)] = hashlib.blake2b(log.read_bytes(), digest_size=16).digest()
        except OSError:
            continue
    return out


def _trained_since(root: Path, before: dict[str, bytes]) -> int:
    """How many runs under ROOT logged something new since `before` (`_logs`). A log's time is no guide: a
    run resumed from a checkpoint that precedes rows of its log rewrites it (`MetricsLog.truncate_after`), and
    a copied root keeps or loses times as it was copied; the contents say what trained."""
    return sum(1 for path, digest in _logs(root).items() if before.get(path) != digest)


def _sweep(console, family: Family, args: dict, root: Path, data: Path | None, resolve_run,
           jobs: int | None = None, on_run_end: Callable[[], None] | None = None, executor=None,
           judge_only: bool = False) -> tuple | None:
    from emarule import tasks
    from emarule.analysis import offline_probe as P
    from emarule.analysis import sweep

    runs = sweep.plan_runs(args["kappas"], ["exponential", None], args["seeds"], family.arms)
    probes = family.ema_metric.name == "probe_top1"  # does the tracking probe measure the teacher?
    finals = any(m.file for m in family.metrics)  # a claim on the final teachers: the arms' are probed too
    drawn: list = []  # the comparison figures the sweep wrote, this time
    # The sweep's own comparison on the target model's metric, which every run logs from its first
    # evaluation (a teacher's `pl_wer` exists only once pseudo-labeling starts, at κ=4 sometimes never).
    done = sweep.execute(console, runs, resolve_run, root, tasks, data=data, metric=family.target_metric.name,
                         jobs=jobs, follow_up=P.follow_up(runs, arms=finals) if probes else None, figures=drawn,
                         on_run_end=on_run_end, executor=executor, judge_only=judge_only)
    if not distributed.is_main():
        return None
    from emarule.analysis.compare import load_runs
    from emarule.analysis.reproduce import figures, measure

    # Only the runs this invocation planned: runs of other seeds (or κ) in the same root are not mixed in.
    loaded = load_runs([Path(d["run"]) for d in done])
    arms = {str(Path(d["run"])): d["arm"] for d in done if d.get("arm")}
    # The probe check groups by κ and rule, so the arms (which share them) are left out of it; a claim on
    # the final teachers (`claims.OFFLINE_PROBE`) may compare arms, so for it they are fitted too.
    probed = [r for r in loaded if str(r.path) not in arms]
    if probes:
        from emarule.analysis.parallel import jobs_for

        fitted = loaded if finals else probed
        console.print(f"offline probe of {len(fitted)} final teachers, the baselines' teachers at initialization "
                      f"and the raw pixels (cached in each run directory)", highlight=False)
        # Before the claims, which read these caches: `offline_probe` checks each against its run's
        # checkpoint (and refits a stale one), through `probe_check` for the standard settings.
        P.warm_caches(fitted, jobs_for(jobs, len(fitted), distributed.world_size()))
        check_probe = P.probe_check(probed)
        for r in fitted:
            if str(r.path) in arms:
                P.offline_probe(r.path)
    measured = measure.measure(family, loaded, arms)
    if probes:
        measured["probe_check"] = check_probe
        for c in measured["claims"]:
            if c["metric"] in PROBES and check_probe:
                c["probe_check"] = check_probe["summary"]
    fig = figures.plot(family, measured, loaded, root / "figures" / f"{family.name}.png",
                       f"{family.experiment} ({family.section}), preset {args['preset']}: mean ± std over "
                       f"seeds {seeds_label(args['seeds'])}")
    # and emarule sweep's own per-κ panels, those it drew now (not any compare-*.png an earlier command left)
    figs = [str(fig.relative_to(root))] + [os.path.relpath(p, root) for p in drawn]
    for c in measured["claims"]:
        c["figure"] = figs[0]
    timing = {"runs": len(done), "reused": sum(1 for d in done if d["resumed"]),
              "runs_wall_s": sum(_logged_wall(Path(d["run"])) for d in done)}
    return measured["claims"], measured, figs, timing


def _logged_wall(run: Path) -> float:
    """The training time a run's log records: its rows' `wall_s` restarts from 0 when the run resumes, so
    each stretch between two drops is one process's time, and the run's is the sum of their last values. A
    run that started from its baseline's snapshot begins after the rows it copied, which are the baseline's."""
    from emarule.engine import fork

    h = read_json(run / HPARAMS)
    copied = fork.copied_bytes(h if isinstance(h, dict) else {})
    skip = (run / METRICS).read_bytes()[:copied].count(b"\n") if copied else 0
    total, last = 0.0, None
    for r in read_metrics(run / METRICS)[skip:]:
        w = r.get("wall_s")
        if not isinstance(w, (int, float)) or isinstance(w, bool):
            continue
        if last is not None and w < last:  # a resume: the stretch before it ended at `last`
            total += last
        last = float(w)
    return total + (last or 0.0)


def _study(console, family: Family, root: Path, resolve_run) -> tuple:
    from emarule.config.identity import comparable
    from emarule.analysis.reproduce.studies import judge_study

    spec, kappa, rule, _, plan = resolve_run(1.0, "exponential", True)
    run_dir = checks.out_dir(root / spec["name"] / default_run_name(kappa, rule, 0, None, spec.get("preset")))
    results_path, spec_path, meta = run_dir / "results.json", run_dir / STUDY_SPEC, run_dir / "run.json"
    reused = results_path.is_file()
    written = read_json(spec_path)
    written = written if isinstance(written, dict) else None
    # a docs fix that edits the appendix a spec cites, or a moved checkout, leaves the results valid
    if reused and written is not None and comparable(written) != comparable(json.loads(json.dumps(spec))):
        raise UserError(f"{run_dir} holds results computed with other settings ({STUDY_SPEC}); "
                        f"pass another --out, or delete {results_path} to compute them again")
    # STUDY_SPEC is written once the study has finished, so results without a readable one are a study that
    # stopped (a full disk, a kill) after writing them; those, and damaged results, are computed again.
    problems = ([] if written is not None else [f"{STUDY_SPEC} is damaged" if spec_path.is_file() else
                                                f"no {STUDY_SPEC} (the study stopped before it finished)"]) + [
        f"{p.name} is damaged" for p, kinds in ((results_path, (dict, list)), (meta, dict))
        if p.is_file() and not isinstance(read_json(p), kinds)]
    if reused and problems:
        console.print(f"{run_dir}: {'; '.join(problems)}; computing the study again", highlight=False)
        reused = False
    t0 = time.monotonic()
    if reused:
        console.print(f"{run_dir}: results.json is there; reusing it (delete it to compute again)", highlight=False)
    else:
        from emarule.tasks import run_task

        run_task(RunContext(spec=spec, kappa=kappa, ema_rule=rule, plan=plan, out=run_dir, preset=spec.get("preset"),
                            seed=0))
        atomic_write_text(spec_path, json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    payload = json.loads(results_path.read_text())
    claims = judge_study(family, payload)
    for c in claims:
        f = STUDY_FIGURES.get(c["kind"])
        c["figure"] = os.path.relpath(run_dir / f, root) if f and (run_dir / f).exists() else None
    figs = sorted({c["figure"] for c in claims if c["figure"]})
    m = read_json(meta)
    logged = (m if isinstance(m, dict) else payload if isinstance(payload, dict) else {}).get("wall_time_s")
    timing = {"runs": 1, "reused": int(reused), "runs_wall_s": logged if logged is not None else time.monotonic() - t0}
    return claims, None, figs, timing
