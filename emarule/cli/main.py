"""The `emarule` command line: parse, resolve the spec and κ, check, dispatch. No logic of its own.

`list`, `plan`, `table`, `limits` and `compare` never import torch; `run` and `sweep` import a task
only once every option has been checked (`emarule.request.checks`), before anything is written.
"""

# No `from __future__ import annotations` here: typer reads the annotations of every command each time the
# app is built (each start), and string annotations cost it an eval apiece: three quarters of that build.
import functools
import math
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from emarule import __version__
from emarule.console import wide_console
from emarule.request.resolve import number, numbers, resolve
from emarule.request.seeds import MAX_SEED, MAX_SEEDS, parse_seeds

try:  # typer ≥ 0.26 vendors click; older releases use the click package
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc

from emarule.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Scale every hyperparameter, the model-EMA momentum included, when the batch size changes "
    "(Busbridge et al., 'How to Scale Your EMA', NeurIPS 2023).",
)
console = wide_console()
err_console = wide_console(stderr=True)


class Fmt(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    timm = "timm"  # with --timm-args: the scaled args.yaml


class TableFmt(str, Enum):
    table = "table"
    csv = "csv"
    markdown = "markdown"


class LimitsFmt(str, Enum):
    table = "table"
    json = "json"


class EmaRule(str, Enum):
    exponential = "exponential"
    linear = "linear"


class TableKind(str, Enum):
    momenta = "momenta"
    lr = "lr"


class Optim(str, Enum):
    sgd = "sgd"
    adam = "adam"


def fail(message: str) -> None:
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def friendly(fn):
    """Turn a UserError into one line on stderr and exit code 2: no traceback reaches the user.

    A file-system error that the checks could not foresee (a disk that fills up, permissions that
    change mid-run) gets the same treatment, naming the file.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            fail(str(e))
        except OSError as e:
            from emarule.engine.rundir import no_space

            if no_space(e):  # a write outside emarule.engine.rundir's (a library's own file): still one line
                fail(f"cannot write {e.filename or 'a file'}: {e.strerror or e}; free space (or raise the limit) "
                     f"and run the command again")
            if e.filename is None:
                raise
            fail(f"{e.filename}: {e.strerror or e}; check the path and its permissions")

    return wrapper


def check_seed(seed: int | None) -> None:
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be a whole number from 0 to {MAX_SEED} (2^32 − 1), got {seed}")


def check_seeds(seeds: str | None) -> tuple[int, ...] | None:
    """--seeds as a count, a range or a list (`emarule.request.seeds`); None when not given."""
    return None if seeds is None else parse_seeds(seeds)


def check_run_options(wandb: str, max_device_batch: int | None, seed: int | None = None,
                      num_workers: int | None = None) -> None:
    from emarule.engine.distributed import check_launch

    check_launch()
    if wandb not in ("off", "offline", "online", "disabled"):
        raise UserError(f"--wandb must be off, offline or online, got {wandb!r}")
    if wandb in ("offline", "online"):
        from emarule import extras

        extras.require(f"--wandb {wandb}", ("wandb",))
    if max_device_batch is not None and max_device_batch < 1:
        raise UserError(f"--max-device-batch must be ≥ 1, got {max_device_batch}")
    if num_workers is not None and num_workers < 0:
        raise UserError(f"--num-workers must be ≥ 0 (0 loads in the training process), got {num_workers}")
    check_seed(seed)


def presets_help() -> str:
    """Every experiment's presets, read from the specs when help is asked for (not at import)."""
    from emarule.config.load import experiment_names, read_yaml, spec_path

    have = []
    try:
        names = experiment_names()
    except UserError as e:  # a help page is still shown where $EMARULE_EXPERIMENTS is wrong, and says so
        return f"Presets (--preset): none read ({e})."
    for name in names:
        try:
            presets = read_yaml(spec_path(name, None)).get("presets") or {}
        except UserError:
            continue
        if presets:
            have.append(f"{name}: {', '.join(sorted(presets))}")
    return "Presets (--preset): " + ("; ".join(have) or "none") + ". `emarule list` marks which experiments run."


def _no_type(ctx) -> None:
    return None


class Help(typer.core.TyperCommand):
    """Help without typer's `<str>` and `<bool>` type labels: an argument is named by its metavar, a
    flag needs no value; every option that takes one has a metavar (PATH, DIR, NAME, INT, ...).

    Every command's options are parsed here, so a single-value option given twice is refused here, once for all:
    click would keep the last value unseen (`-k 2 -k 3` runs at κ=3)."""

    def format_help(self, ctx, formatter):
        for p in self.get_params(ctx):
            if isinstance(p, typer.core.TyperArgument) or getattr(p, "is_flag", False):
                p.display_type_rich = _no_type
        return super().format_help(ctx, formatter)

    def parse_args(self, ctx, args):
        try:  # a first pass only to see the order options came in: the parser records each occurrence
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except click_exc.UsageError:
            order = []  # the parse below raises the same error
        seen: set[str] = set()
        for param in order:
            if not isinstance(param, typer.core.TyperOption) or param.multiple or param.is_flag:
                continue
            if param.name in seen:
                names = sorted(param.opts, key=len, reverse=True)
                also = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
                raise click_exc.UsageError(f"{names[0]}{also} is given more than once, and it takes one value; "
                                           f"give it once", ctx)
            seen.add(param.name)
        return super().parse_args(ctx, args)


class PresetsInHelp(Help):
    def format_help(self, ctx, formatter):
        self.epilog = presets_help()
        return super().format_help(ctx, formatter)


ExpArg = typer.Argument(None, metavar="EXPERIMENT", show_default=False,
                        help="experiment name (see `emarule list`); omit with --spec")
SpecOpt = typer.Option(None, "--spec", metavar="PATH", help="a YAML spec of your own instead of a named experiment")
PresetOpt = typer.Option(None, "--preset", metavar="NAME", help="a named preset of the spec (e.g. cpu, tiny, quick)")
SetOpt = typer.Option(None, "--set", metavar="KEY=VALUE",
                      help="override a spec value: --set optimizer.lr=0.1 (repeatable)")
KappaOpt = typer.Option(None, "--kappa", "-k", metavar="FLOAT", help="κ = B̂/B, the batch-size scaling")
BatchOpt = typer.Option(None, "--batch-size", "-b", metavar="FLOAT",
                        help="new batch size in the spec's unit (instead of --kappa)")
NoRuleOpt = typer.Option(False, "--no-ema-rule", help="baseline: scale everything but the EMA momentum")
RuleOpt = typer.Option(None, "--ema-rule", help="ρ^κ (exponential, the default) or 1 − κ(1 − ρ) (linear)")
DataOpt = typer.Option(None, "--data", metavar="DIR", help="local data set directory (CIFAR-10, ImageNet, ...)")
WandbOpt = typer.Option("off", "--wandb", metavar="MODE", help="mirror metrics to wandb: off, offline or online")
MaxDevOpt = typer.Option(None, "--max-device-batch", metavar="INT",
                         help="largest per-device micro-batch; the rest is accumulated")
WorkersOpt = typer.Option(None, "--num-workers", metavar="N",
                          help="DataLoader worker processes per rank (default: 0 on a CPU; on a GPU, the cores "
                               "per rank less one, at most 8)")
JobsOpt = typer.Option(None, "--jobs", metavar="N|auto",
                       help="runs trained at once, each in its own process (default auto: one per CPU core, "
                            "one on a GPU machine or under torchrun; $EMARULE_JOBS sets the default)")
ExecutorOpt = typer.Option("local", "--executor", metavar="local|slurm|submitit-local",
                           help="local: the runs on this machine; slurm: each unfinished run its own Slurm job "
                                "(submitit); submitit-local: those jobs as processes here")
SlurmParamsOpt = typer.Option(None, "--slurm-params", metavar="YAML",
                              help="submitit's job parameters: timeout_min, cpus_per_task, mem_gb, slurm_qos, ...")
PartitionOpt = typer.Option(None, "--partition", metavar="NAME", help="the jobs' Slurm partition")
AccountOpt = typer.Option(None, "--account", metavar="NAME", help="the jobs' Slurm account")
TimeOpt = typer.Option(None, "--time", metavar="D-HH:MM:SS",
                       help="each job's time limit (default 24:00:00); a run past it requeues and resumes")
NodesOpt = typer.Option(None, "--nodes", metavar="N", help="nodes per run's job (default 1)")
GpusOpt = typer.Option(None, "--gpus-per-node", metavar="G",
                       help="GPUs and processes per node (default 8 on Slurm; submitit-local: processes, default 1)")
WaitOpt = typer.Option(True, "--wait/--no-wait", help="follow the jobs until they end and judge them (default), or "
                                                       "submit and return")
ProgOpt = typer.Option(None, "--progressive", metavar="SCHEDULE",
                       help="Progressive Scaling: constant, step:E, smooth:E1-E2, "
                            "incremental:START,DELTA_B,EVERY[,FROM_KAPPA]")


def _version(value: bool) -> None:
    if value:
        console.print(f"emarule {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    pass


@app.command("list", cls=Help)
@friendly
def list_cmd() -> None:
    """The paper's experiments: section, data, base batch, optimizer, EMA ρ, presets, and which ones run."""
    from rich.table import Table

    from emarule.cli.render import fmt
    from emarule.config.load import experiment_names, load_spec, no_experiments, read_yaml, spec_path
    from emarule.config.schema import value
    from emarule.tasks import RUNNABLE_TASKS

    t = Table(title="emarule experiments (base values at κ=1)", title_justify="left")
    for c in ("experiment", "section", "data set", "base batch", "optimizer", "EMA ρ", "task", "runs", "presets"):
        t.add_column(c)
    names = experiment_names()
    if not names:
        raise no_experiments()
    for name in names:
        s = load_spec(name)
        b = s["batch"]
        unit = "" if b.get("unit", "samples") == "samples" else f" {b['unit']}"
        presets = ", ".join(sorted(read_yaml(spec_path(name, None)).get("presets") or {}))
        t.add_row(name, s.get("section", ""), s.get("dataset", ""), f"{fmt(b['size'])}{unit}",
                  value(s, "optimizer.name"), fmt(s["ema"].get("momentum")), s["task"],
                  runs_here(s["task"], RUNNABLE_TASKS), presets)
    console.print(t)


def runs_here(task: str, runnable) -> str:
    """`list`'s runs column: yes, plan only, or the extras a run of the task needs that are not installed."""
    from rich.markup import escape

    from emarule import extras
    from emarule import registry

    if task not in runnable:
        return "plan only"
    lacking = extras.missing(registry.lookup(task).extras)
    return escape(f"with emarule[{','.join(lacking)}]") if lacking else "yes"


@app.command(cls=Help)
@friendly
def plan(
    experiment: Optional[str] = ExpArg,
    spec: Optional[Path] = SpecOpt,
    kappa: Optional[str] = KappaOpt,
    batch_size: Optional[str] = BatchOpt,
    no_ema_rule: bool = NoRuleOpt,
    ema_rule: EmaRule = RuleOpt,
    progressive: Optional[str] = ProgOpt,
    preset: Optional[str] = PresetOpt,
    overrides: Optional[List[str]] = SetOpt,
    format: Fmt = typer.Option(Fmt.table, "--format", "-f", help="table, json, yaml; timm: the scaled args.yaml"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="with Progressive Scaling: a full table per stage, not one row per stage"),
    timm_args: Optional[Path] = typer.Option(None, "--timm-args", metavar="PATH",
                                             help="scale the args.yaml of a timm train.py run (--batch-size: global)"),
    world_size: Optional[int] = typer.Option(None, "--world-size", min=1, metavar="N",
                                             help="with --timm-args: processes of that run (default 1)"),
    out: Optional[str] = typer.Option(None, "--out", metavar="PATH", help="with --format timm: write it here"),
) -> None:
    """Every hyperparameter, base → scaled, with the rule that produced it (and one row per stage)."""
    from emarule.cli.render import print_plan

    if timm_args is None and (experiment is not None or spec is not None):
        from emarule.config.load import spec_path

        spec_path(experiment, spec)  # an unknown name is the first thing to fix
    if kappa is None and batch_size is None:
        raise UserError("give --kappa K or --batch-size B, e.g. `emarule plan byol-vit --kappa 6`")
    if timm_args is not None or format is Fmt.timm or out is not None:
        from emarule.cli.timm_plan import plan_timm

        return plan_timm(console, timm_args, experiment or spec, kappa, batch_size, world_size or 1, format.value, out,
                         verbose or overrides or preset or progressive or no_ema_rule,
                         (ema_rule or EmaRule.exponential).value)
    if world_size is not None:
        raise UserError("--world-size applies only with --timm-args (a timm run's processes); drop it")
    *_, p = resolve(experiment, spec, preset, overrides, kappa, batch_size, no_ema_rule, ema_rule, progressive)
    print_plan(console, p, format.value, verbose)


@app.command(cls=Help)
@friendly
def table(
    kind: TableKind = typer.Argument(..., help="momenta (ρ^κ) or lr (κη for SGD, √κη for Adam)"),
    base_batch_size: Optional[str] = typer.Option(None, "--base-batch-size", "-B", metavar="INT",
                                                  help="reference batch B of the given values (default 256)"),
    momentum: Optional[List[str]] = typer.Option(None, "--momentum", metavar="FLOAT",
                                                 help="base momentum ρ (repeatable)"),
    lr: Optional[List[str]] = typer.Option(None, "--lr", metavar="FLOAT", help="base learning rate η (repeatable)"),
    optimizer: Optional[Optim] = typer.Option(None, "--optimizer", help="lr rule for --lr: sgd (κη, the default) "
                                                                        "or adam (√κη)"),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", metavar="INT,INT,...",
                                              help="rows, e.g. 256,1024,4096"),
    format: TableFmt = typer.Option(TableFmt.table, "--format", "-f"),
) -> None:
    """The paper's reference tables, or the same for your own base values."""
    from emarule.cli.render import print_ref_table
    from emarule.request.table import reference_table

    t = reference_table(kind.value, base_batch_size, momentum, lr, optimizer and optimizer.value, batch_sizes)
    print_ref_table(console, t, format.value)


@app.command(cls=Help)
@friendly
def limits(
    momentum: str = typer.Option(..., "--momentum", metavar="FLOAT", help="base momentum ρ in (0, 1)"),
    batch_size: str = typer.Option(..., "--batch-size", metavar="FLOAT",
                                   help="reference batch B at which ρ is written"),
    dtype: str = typer.Option("float32", "--dtype", metavar="float32|bfloat16|float16",
                              help="the EMA's format; fp32, tf32, bf16, fp16 and half are read as their full names"),
    relative_gap: str = typer.Option("1", "--relative-gap", metavar="FLOAT",
                                     help="r = |θ − ζ| / |ζ| assumed for the update bound (default 1)"),
    format: LimitsFmt = typer.Option(LimitsFmt.table, "--format", "-f"),
) -> None:
    """The range of κ (and batch size) over which ρ^κ and the EMA update stay meaningful in a dtype."""
    from emarule.cli.render import print_limits
    from emarule.scaling.limits import limits as compute

    try:
        rho = float(momentum)
    except ValueError:
        raise UserError(f"--momentum must be a number, got {momentum!r}") from None
    if not 0.0 < rho < 1.0:
        raise UserError(f"--momentum must be in (0, 1), got {momentum!r}")
    from emarule.scaling.limits import canonical

    try:
        dtype = canonical(dtype.strip().lower())
    except ValueError:
        raise UserError(f"--dtype {dtype}: use float32, bfloat16 or float16 (or fp32, tf32, bf16, fp16, half)"
                        ) from None
    lim = compute(rho, number(batch_size, "--batch-size"), dtype, number(relative_gap, "--relative-gap"))
    for name, bound in lim.as_dict()["bounds"].items():  # an infinite κ (no bound at all) is the formula's own
        if math.isfinite(bound["kappa"]) and not math.isfinite(bound["batch_size"]):
            raise UserError(f"--batch-size {batch_size}: {name} κ = {bound['kappa']:.4g} gives a batch size past "
                            f"float64's range; give a smaller --batch-size")
        if bound["kappa"] > 0 and bound["batch_size"] == 0:
            raise UserError(f"--batch-size {batch_size}: {name} κ = {bound['kappa']:.4g} gives a batch size below "
                            f"float64's range (0); give a larger --batch-size")
    print_limits(console, lim, format.value)


OutDirOpt = typer.Option(None, "--out", metavar="DIR", help="run directory (default runs/<experiment>/<name>)")


@app.command(cls=PresetsInHelp)
@friendly
def run(
    experiment: Optional[str] = ExpArg,
    spec: Optional[Path] = SpecOpt,
    kappa: Optional[str] = KappaOpt,
    batch_size: Optional[str] = BatchOpt,
    no_ema_rule: bool = NoRuleOpt,
    ema_rule: Optional[EmaRule] = RuleOpt,
    progressive: Optional[str] = ProgOpt,
    preset: Optional[str] = PresetOpt,
    overrides: Optional[List[str]] = SetOpt,
    data: Optional[Path] = DataOpt,
    out: Optional[str] = OutDirOpt,
    resume: bool = typer.Option(False, "--resume", help="continue from the run directory's last checkpoint"),
    seed: int = typer.Option(0, "--seed", metavar="INT", help=f"seed of every random stream, 0 to {MAX_SEED}"),
    wandb: str = WandbOpt,
    max_device_batch: Optional[int] = MaxDevOpt,
    num_workers: Optional[int] = WorkersOpt,
) -> None:
    """Run an experiment at κ, with or without the EMA rule (alone or under torchrun); print what it did."""
    import time

    from emarule.request import checks
    from emarule.request.checks import batch_multiple
    from emarule.engine.context import RunContext, default_run_name
    from emarule.tasks import RUNNABLE_TASKS

    check_run_options(wandb, max_device_batch, seed, num_workers)
    study_options(experiment, spec, {"--kappa": kappa, "--batch-size": batch_size, "--no-ema-rule": no_ema_rule or None,
                                     "--ema-rule": ema_rule, "--progressive": progressive, "--data": data,
                                     "--max-device-batch": max_device_batch, "--num-workers": num_workers})
    s, k, rule, pr, p = resolve(experiment, spec, preset, overrides, kappa, batch_size, no_ema_rule, ema_rule,
                                progressive, batch_multiple=batch_multiple)
    checks.runnable(s, RUNNABLE_TASKS)
    checks.data(s, data)
    checks.whole_batches(s, p, None, runs=True)
    run_dir = checks.out_dir(out) or Path("runs") / s["name"] / default_run_name(k, rule, seed, pr, preset)
    checks.out_dir(run_dir)
    checks.made_by_emarule(run_dir, "run")
    checks.run_dir(run_dir, resume, s["name"])
    # what `emarule plan` warns about (a value that rounds to 1, a setting with no effect) is said here too, once
    # the run's own checks have passed
    ctx = RunContext(spec=s, kappa=k, ema_rule=rule, plan=p, out=run_dir, progressive=pr, preset=preset,
                     data=data, resume=resume, seed=seed, wandb="off" if wandb == "disabled" else wandb,
                     max_device_batch=max_device_batch, num_workers=num_workers, warnings=tuple(p.warnings))
    from emarule.analysis.run_report import print_report, report
    from emarule.engine import distributed  # the launcher's environment (RANK), read without importing torch
    from emarule.tasks import run_task

    main = distributed.is_main()
    t0 = time.monotonic()
    run_task(ctx)
    if main:
        print_report(console, report(run_dir, time.monotonic() - t0))


def study_options(experiment: str | None, spec_file: Path | None, given: dict) -> None:
    """A study (parabola, precision) sweeps κ and the EMA rule itself and trains no batches: the options that
    set them, or the data and the device batch, would be ignored, so they are refused, before the spec is
    resolved with them."""
    from emarule import registry
    from emarule.config.load import read_yaml, spec_path

    named = [o for o, v in given.items() if v is not None]
    if not named:
        return
    spec = read_yaml(spec_path(experiment, spec_file))
    task = registry.lookup(spec.get("task")) if isinstance(spec, dict) else None
    if task is not None and task.kind == "study":
        raise UserError(f"{spec.get('name', '?')} sweeps κ and ρ itself, a study with no batches or data to set: "
                        f"drop {', '.join(named)} (its settings: --preset, --set)")


class CompareFmt(str, Enum):
    table = "table"
    json = "json"


@app.command(cls=PresetsInHelp)
@friendly
def sweep(
    experiment: Optional[str] = ExpArg,
    spec: Optional[Path] = SpecOpt,
    kappas: str = typer.Option("1,2,4", "--kappas", metavar="FLOAT,FLOAT,...",
                               help="κ values, comma-separated (κ=1, the baseline, always runs)"),
    rule: str = typer.Option("with,without", "--rule", metavar="RULE,RULE,...",
                             help="with (ρ^κ), without (ρ), linear (1 − κ(1 − ρ)), comma-separated"),
    seeds: str = typer.Option("1", "--seeds", metavar="N|A-B|S,S,...",
                              help=f"seeds: a count (0..N−1), a range (100-104) or a list (3,7,11 or 0-4,100-104); "
                                   f"at most {MAX_SEEDS}"),
    progressive: Optional[str] = ProgOpt,
    preset: Optional[str] = PresetOpt,
    overrides: Optional[List[str]] = SetOpt,
    data: Optional[Path] = DataOpt,
    out: Optional[str] = typer.Option(None, "--out", metavar="DIR", help="root of the run directories (default runs/)"),
    metric: Optional[str] = typer.Option(None, "--metric", metavar="NAME",
                                         help="metric to compare (default: the EMA's: "
                                         "probe_top1, ema_top1 or ema_wer; else loss)"),
    wandb: str = WandbOpt,
    max_device_batch: Optional[int] = MaxDevOpt,
    num_workers: Optional[int] = WorkersOpt,
    jobs: Optional[str] = JobsOpt,
    executor: str = ExecutorOpt,
    slurm_params: Optional[Path] = SlurmParamsOpt,
    partition: Optional[str] = PartitionOpt,
    account: Optional[str] = AccountOpt,
    time_limit: Optional[str] = TimeOpt,
    nodes: Optional[int] = NodesOpt,
    gpus_per_node: Optional[int] = GpusOpt,
    wait: bool = WaitOpt,
) -> None:
    """The κ=1 baseline and each κ with and without the EMA Scaling Rule; then compare."""
    from emarule import tasks
    from emarule.analysis import sweep as sw
    from emarule.analysis.executors import from_options
    from emarule.analysis.parallel import parse_jobs

    check_run_options(wandb, max_device_batch, num_workers=num_workers)
    n_jobs = parse_jobs(jobs)
    where = from_options(executor, slurm_params, partition, account, time_limit, nodes, gpus_per_node, wait)
    seed_list = check_seeds(seeds)
    runs = sw.plan_runs(sw.distinct_kappas(numbers(kappas, "--kappas"), kappas), sw.parse_rules(rule),
                        seed_list)

    def resolve_run(k: float, ema: Optional[str], baseline: bool):
        from emarule.request.checks import batch_multiple

        return resolve(experiment, spec, preset, overrides, repr(k), None, ema is None, ema,
                       "constant" if baseline else progressive, batch_option=False, batch_multiple=batch_multiple,
                       baseline=baseline)

    from emarule.request import checks

    root = Path("runs") if out is None else checks.out_dir(out)
    checks.not_a_run(root, "for the sweep's runs, e.g. --out runs")
    checks.made_by_emarule(root, "sweep")
    sw.execute(console, runs, resolve_run, root, tasks, data=data,
               max_device_batch=max_device_batch, wandb="off" if wandb == "disabled" else wandb, metric=metric,
               jobs=n_jobs, num_workers=num_workers, executor=where)


@app.command("compare", cls=Help)
@friendly
def compare_cmd(
    run_dirs: List[Path] = typer.Argument(..., metavar="RUN_DIR",
                                          help="run directories, or a folder holding them (runs/byol-r18)"),
    metric: Optional[str] = typer.Option(None, "--metric", "-m", metavar="NAME",
                                         help="metric to overlay (default: the EMA's: probe_top1, ema_top1 or "
                                              "ema_wer; else loss)"),
    out: Optional[str] = typer.Option(None, "--out", metavar="PNG",
                                      help="figure path ending in .png (default: compare-<metric>.png beside "
                                           "the runs)"),
    format: CompareFmt = typer.Option(CompareFmt.table, "--format", "-f"),
) -> None:
    """Overlay runs on the κ=1 baseline (one panel per κ) and print each run's gap to it."""
    from emarule.analysis.compare import run_compare

    run_compare(console, run_dirs, metric, out, format.value)


@app.command("probe", cls=Help)
@friendly
def probe_cmd(
    run_dirs: List[Path] = typer.Argument(..., metavar="RUN_DIR",
                                          help="finished byol or dino run directories, or a folder holding them"),
    jobs: Optional[str] = typer.Option(None, "--jobs", metavar="N|auto",
                                       help="probes fitted at once, each in its own single-threaded process "
                                            "(default auto: one per CPU core)"),
    format: CompareFmt = typer.Option(CompareFmt.table, "--format", "-f"),
) -> None:
    """Does the teacher learn what a linear probe can see? Its converged probe against its initialization and the
    pixels."""
    import json

    from emarule import extras
    from emarule.analysis.parallel import cores, parse_jobs
    from emarule.analysis.teacher_probe import checked, measure, show

    extras.require("emarule probe", ("vision",))
    asked = parse_jobs(jobs)
    runs = checked(run_dirs)
    n_jobs = min(asked or cores(), len(runs))
    if format.value == "table":
        console.print(f"probing the teachers of {len(runs)} run{'s' if len(runs) > 1 else ''}, {n_jobs} at a time "
                      f"(a fit not yet cached in its run directory takes seconds to a minute)", highlight=False)
    result = measure(runs, n_jobs)
    if format.value == "json":
        print(json.dumps(result, indent=2))
    else:
        show(console, result)


@app.command(cls=Help)
@friendly
def reproduce(
    family: str = typer.Argument(..., metavar="FAMILY",
                                 help="parabola, precision, polyak, byol, byol-vit, byol-r50-lars, dino, ctc-polyak or "
                                      "ctc-pseudo-label"),
    preset: Optional[str] = typer.Option(None, "--preset", metavar="NAME",
                                         help="the spec's preset (default: the family's, cpu for training families); "
                                              "full: the paper's recipe"),
    seeds: Optional[str] = typer.Option(None, "--seeds", metavar="N|A-B|S,S,...",
                                        help=f"seeds per setting: a count (0..N−1), a range (100-104) or a list "
                                             f"(3,7,11 or 0-4,100-104); default 5, at most {MAX_SEEDS}"),
    kappas: Optional[str] = typer.Option(None, "--kappas", metavar="FLOAT,FLOAT,...",
                                         help="κ values (default: the family's; the κ=1 baseline always runs)"),
    out: Optional[str] = typer.Option(None, "--out", metavar="DIR",
                                      help="where runs, report.md, verdict.json and figures go "
                                           "(default runs/reproduce/FAMILY); finished runs there are reused"),
    data: Optional[Path] = DataOpt,
    jobs: Optional[str] = JobsOpt,
    headline: bool = typer.Option(False, "--headline",
                                  help="judge the family's headline claim only, on only the runs it reads (for a "
                                       "check on new seeds: --headline --seeds 100-104)"),
    judge_only: bool = typer.Option(False, "--judge-only",
                                    help="train nothing: judge the runs --out holds from their records "
                                         "(hparams.json, metrics.jsonl, probe caches), checkpoints or not"),
    executor: str = ExecutorOpt,
    slurm_params: Optional[Path] = SlurmParamsOpt,
    partition: Optional[str] = PartitionOpt,
    account: Optional[str] = AccountOpt,
    time_limit: Optional[str] = TimeOpt,
    nodes: Optional[int] = NodesOpt,
    gpus_per_node: Optional[int] = GpusOpt,
    wait: bool = WaitOpt,
) -> None:
    """Every claim of the paper for one family: run the sweep, measure gaps and seed spread, write a verdict."""
    from emarule.analysis.parallel import parse_jobs
    from emarule.analysis.reproduce.command import reproduce as run_reproduction
    from emarule.request.checks import batch_multiple

    from emarule.analysis.executors import from_options
    from emarule.engine.distributed import check_launch

    check_launch()
    seed_list = check_seeds(seeds)
    n_jobs = parse_jobs(jobs)
    where = from_options(executor, slurm_params, partition, account, time_limit, nodes, gpus_per_node, wait)

    def resolver(experiment: str, spec_preset: Optional[str]):
        def resolve_run(k: float, ema: Optional[str], baseline: bool, arm=None):
            # An arm (emarule.analysis.reproduce.claims.Arm) adds its --set overrides and --progressive schedule.
            sets = list(arm.sets) if arm is not None else []
            prog = "constant" if baseline else (arm.schedule(experiment, spec_preset) if arm is not None else None)
            return resolve(experiment, None, spec_preset, sets, repr(k), None, ema is None, ema,
                           prog, batch_option=False, batch_multiple=batch_multiple, baseline=baseline)
        return resolve_run

    from emarule.analysis.sweep import distinct_kappas

    run_reproduction(console, family, preset=preset, seeds=seed_list,
                     kappas=distinct_kappas(numbers(kappas, "--kappas"), kappas), out=out,
                     data=data, resolver=resolver, jobs=n_jobs, headline=headline, executor=where,
                     judge_only=judge_only)


@app.command(cls=Help)
@friendly
def power(
    kind: Optional[str] = typer.Argument(None, metavar="KIND", help="a claim kind; --list names them"),
    list_kinds: bool = typer.Option(False, "--list", help="the claim kinds: name, shape, margin"),
    effect: Optional[str] = typer.Option(None, "--effect", metavar="E",
                                         help="the true effect in baseline pair spreads, positive in the paper's "
                                              "direction (an equivalence kind: the true distance)"),
    seeds: Optional[str] = typer.Option(None, "--seeds", metavar="N",
                                        help="paired seeds in each simulated reproduction (default 5)"),
    trials: Optional[str] = typer.Option(None, "--trials", metavar="T", help="simulated reproductions (default 2000)"),
    noise: Optional[str] = typer.Option(None, "--noise", metavar="S",
                                        help="the sd of one seed's effect, in spreads (default 1)"),
    spread: Optional[str] = typer.Option(None, "--spread", metavar="HOW",
                                         help="the unit: bounded (default: estimated from as many baselines as "
                                              "seeds and bounded, as reproduce judges), estimated (taken as "
                                              "exact), known"),
    format: LimitsFmt = typer.Option(LimitsFmt.table, "--format", "-f"),
) -> None:
    """How likely each verdict is, for a claim kind, a true effect and a seed count, under the rules by claim
    shape (docs/reproduce.md): the same decision code, fed simulated paired seeds."""
    from emarule.analysis.reproduce.rules import KINDS, MAX_SEEDS as MOST, SPREADS, simulate
    from emarule.cli.render import print_power, print_power_kinds

    if list_kinds:
        given = [o for o, v in (("KIND", kind), ("--effect", effect), ("--seeds", seeds), ("--trials", trials),
                                ("--noise", noise), ("--spread", spread)) if v is not None]
        if given:
            them = "them" if len(given) > 1 else "it"
            raise UserError(f"--list takes no {', '.join(given)}; drop {them}, or drop --list")
        return print_power_kinds(console, KINDS, format.value)
    if kind is None:
        raise UserError(f"name a claim KIND ({', '.join(KINDS)}), or give --list")
    if kind not in KINDS:
        raise UserError(f"unknown claim kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if effect is None:
        raise UserError("--effect E is needed: the true effect in baseline pair spreads (0 for none)")
    n, t = count_in(seeds or "5", "--seeds", 2, MOST), count_in(trials or "2000", "--trials", 1, 1_000_000)
    try:
        e = float(effect)
    except ValueError:
        raise UserError(f"--effect must be a number, got {effect!r}") from None
    if not abs(e) <= POWER_RANGE:  # NaN and ±inf too; beyond it the simulated seeds' sums lose their digits
        raise UserError(f"--effect must lie in [−{POWER_RANGE:g}, {POWER_RANGE:g}] spreads, got {effect!r}")
    sd = number(noise or "1", "--noise")
    if not 1 / POWER_RANGE <= sd <= POWER_RANGE:
        raise UserError(f"--noise must lie in [{1 / POWER_RANGE:g}, {POWER_RANGE:g}] spreads, got {noise!r}")
    if spread is not None and spread not in SPREADS:
        raise UserError(f"--spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    print_power(console, simulate(KINDS[kind], e, n, t, sd, spread=spread or SPREADS[0]), format.value)


POWER_RANGE = 1e6  # `emarule power`'s effects and noise, in spreads


def count_in(text: str, option: str, low: int, high: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UserError(f"{option} must be a whole number, got {text!r}") from None
    if not low <= n <= high:
        raise UserError(f"{option} must lie in [{low}, {high}], got {n}")
    return n


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors become one line on stderr with exit code 2, like every other error."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv if argv is not None else sys.argv[1:], prog_name="emarule",
                          standalone_mode=False)
    except click_exc.NoArgsIsHelpError:
        _exit(2)  # the help has been printed already
    except click_exc.ClickException as e:
        # click spreads some messages over lines (a missing choice argument lists each choice on its own)
        err_console.print(f"error: {' '.join(e.format_message().split())}", markup=False, highlight=False,
                          soft_wrap=True)
        _exit(2)
    except (KeyboardInterrupt, typer.Abort):
        _exit(130)
    except UserError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        _exit(2)
    except RuntimeError as e:
        launched = sys.modules.get("emarule.engine.distributed")
        if launched is None or not launched.peer_stopped(e):
            raise
        err_console.print("error: another process of this launch stopped on an error of its own (printed above), so "
                          "this one stops too; fix that and run the same command again", markup=False,
                          highlight=False, soft_wrap=True)
        _exit(2)
    _exit(rv if isinstance(rv, int) else 0)


def _exit(code: int) -> None:
    # A process of a torchrun launch ends through distributed.exit_process. Only a command that ran something
    # has imported that module, and asking it whether this process is in a group imports no torch, so table,
    # plan and limits stay free of torch.
    launched = sys.modules.get("emarule.engine.distributed")
    if launched is not None and launched.in_group():
        launched.exit_process(code)
    sys.exit(code)
