"""Where a sweep's runs train (`--executor`): side by side on this machine, or each as its own submitit job.

    local            the runs in this process, or side by side in worker processes (`--jobs`)
    slurm            each run that is not finished as its own Slurm job, N nodes × G GPUs (`emarule.analysis.jobs`)
    submitit-local   the same jobs through submitit's LocalExecutor: processes on this machine, no Slurm

Job parameters use submitit's AutoExecutor names: the shared ones (`timeout_min`, `nodes`, `gpus_per_node`,
`tasks_per_node`, `cpus_per_task`, `mem_gb`) and any `slurm_*` one SlurmExecutor takes (`slurm_partition`,
`slurm_account`, `slurm_qos`, `slurm_constraint`, `slurm_additional_parameters`, `slurm_setup`, ...). They come
from a YAML file (`--slurm-params`), and --partition, --account, --time, --nodes and --gpus-per-node win over it.
Everything is checked before anything is written: submitit itself raises on a bad name only at submission.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from emarule import extras
from emarule.errors import UserError

KINDS = ("local", "slurm", "submitit-local")
SUBMITIT = ("slurm", "submitit-local")

# A Slurm job of a full-size run: one node of 8 GPUs, one process per GPU, a day at a time. Slurm sends the
# preemption signal SIGNAL_DELAY_S before the time limit, time for the step in progress and the checkpoint.
SLURM_DEFAULTS = {"nodes": 1, "gpus_per_node": 8, "timeout_min": 24 * 60, "cpus_per_task": 8,
                  "slurm_signal_delay_s": 120}
LOCAL_DEFAULTS = {"nodes": 1, "gpus_per_node": 0, "tasks_per_node": 1, "timeout_min": 7 * 24 * 60}
# How often one run may reach its time limit and be requeued (submitit's max_num_timeout): a run of days under a
# limit of hours needs many; a preemption does not count.
MAX_TIMEOUTS = 100
GENERIC = {"name": str, "timeout_min": int, "mem_gb": (int, float), "nodes": int, "cpus_per_task": int,
           "gpus_per_node": int, "tasks_per_node": int, "stderr_to_stdout": bool}


@dataclass(frozen=True)
class Executor:
    kind: str = "local"
    params: dict = field(default_factory=dict)  # AutoExecutor's names (module docstring), defaults filled in
    wait: bool = True  # follow the jobs until every one has ended, then judge; else submit and return
    poll_s: float = 30.0  # how often the jobs' states are read while following them

    @property
    def submits(self) -> bool:
        return self.kind in SUBMITIT

    @property
    def world(self) -> tuple[int, int]:
        """(nodes, processes per node) of each run's job."""
        return int(self.params.get("nodes", 1)), int(self.params.get("tasks_per_node", 1))


def require_submitit(kind: str):
    """submitit, or the one line of a missing extra (`emarule.extras`) naming `pip install 'emarule[slurm]'`."""
    extras.require(f"--executor {kind}", ["slurm"])
    import submitit

    return submitit


def parse_time(text: str) -> int:
    """Slurm's --time forms (MINUTES, MINUTES:SECONDS, H:MM:SS, D-H, D-H:MM, D-H:MM:SS) → whole minutes."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if m is None:
        raise UserError(f"--time {text!r}: use Slurm's forms, e.g. 240 (minutes), 24:00:00 or 2-00:00:00")
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-H[:MM[:SS]]
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:MM:SS
        seconds = a * 3600 + b * 60 + c
    elif b is not None:  # MINUTES:SECONDS
        seconds = a * 60 + b
    else:
        seconds = a * 60
    if seconds < 60:
        raise UserError(f"--time {text!r}: a job needs at least a minute, e.g. --time 24:00:00")
    return -(-seconds // 60)


def read_params(path: Path) -> dict:
    """A YAML mapping of AutoExecutor parameters, each name and type checked."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise UserError(f"--slurm-params {path}: {e.strerror or e}; give a YAML file of submitit parameters, "
                        f"e.g. slurm_partition: gpu") from None
    except yaml.YAMLError as e:
        raise UserError(f"--slurm-params {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"--slurm-params {path}: expected a mapping of submitit parameters, e.g. "
                        f"slurm_partition: gpu")
    check_params(data, f"--slurm-params {path}")
    return data


def check_params(params: dict, where: str) -> None:
    from submitit.slurm.slurm import SlurmExecutor

    slurm = SlurmExecutor._valid_parameters()
    for key, value in params.items():
        if not isinstance(key, str):
            raise UserError(f"{where}: {key!r} is not a parameter name")
        if key in GENERIC:
            ok = isinstance(value, GENERIC[key]) and not (isinstance(value, bool) and GENERIC[key] is not bool)
            if not ok:
                raise UserError(f"{where}: {key} must be {_type_name(GENERIC[key])}, got {value!r}")
            if key in ("nodes", "tasks_per_node", "timeout_min") and value < 1:
                raise UserError(f"{where}: {key} must be ≥ 1, got {value!r}")
        elif key.startswith("slurm_") and key[len("slurm_"):] in slurm:
            if key == "slurm_additional_parameters" and not isinstance(value, dict):
                raise UserError(f"{where}: slurm_additional_parameters must be a mapping, e.g. {{qos: high}}")
        else:
            raise UserError(f"{where}: unknown parameter {key!r}; use submitit's names: "
                            f"{', '.join(GENERIC)} or slurm_<name> (slurm_partition, slurm_account, slurm_qos, ...)")


def _type_name(t) -> str:
    return "a number" if isinstance(t, tuple) else {int: "a whole number", bool: "true or false"}.get(t, "text")


def from_options(kind: str | None, params_file: Path | None = None, partition: str | None = None,
                 account: str | None = None, time: str | None = None, nodes: int | None = None,
                 gpus_per_node: int | None = None, wait: bool = True) -> Executor:
    """The CLI's options → an Executor; a bad one is a UserError before anything is written."""
    kind = kind or "local"
    if kind not in KINDS:
        raise UserError(f"--executor {kind!r}: choose one of {', '.join(KINDS)}")
    given = {"--slurm-params": params_file, "--partition": partition, "--account": account, "--time": time,
             "--nodes": nodes, "--gpus-per-node": gpus_per_node}
    if kind == "local":
        extra = [k for k, v in given.items() if v is not None] + ([] if wait else ["--no-wait"])
        if extra:
            raise UserError(f"{extra[0]} applies to submitted jobs; add --executor slurm (or submitit-local)")
        return Executor()
    from emarule.engine.distributed import world_size

    if world_size() > 1:
        raise UserError(f"--executor {kind} under torchrun: each job starts its own processes; run the command "
                        f"once, without torchrun")
    require_submitit(kind)
    for name, n in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if n is not None and n < (1 if name == "--nodes" else 0):
            raise UserError(f"{name} {n}: expected {'a count ≥ 1' if name == '--nodes' else 'a count ≥ 0'}")
    params = dict(SLURM_DEFAULTS if kind == "slurm" else LOCAL_DEFAULTS)
    params.update(read_params(params_file) if params_file is not None else {})
    named = {"slurm_partition": partition, "slurm_account": account, "nodes": nodes, "gpus_per_node": gpus_per_node,
             "timeout_min": parse_time(time) if time is not None else None}
    params.update({k: v for k, v in named.items() if v is not None})
    if gpus_per_node is not None or "tasks_per_node" not in params:  # one process per GPU
        params["tasks_per_node"] = max(1, int(params["gpus_per_node"]))
    if kind == "submitit-local":
        if int(params["nodes"]) != 1:
            raise UserError("--executor submitit-local runs on this machine alone; drop --nodes (or --nodes 1)")
    elif shutil.which("sbatch") is None:
        raise UserError("--executor slurm: no sbatch on this machine's PATH; run the command on the cluster's login "
                        "node, or try it here with --executor submitit-local")
    # sacct is asked for a Slurm job's state: not too often; a local job's is its process's
    return Executor(kind, params, wait=wait, poll_s=30.0 if kind == "slurm" else 2.0)


def make(executor: Executor, folder: Path):
    """The submitit executor writing its job files under `folder` (a `%j` folder per job)."""
    submitit = require_submitit(executor.kind)
    p = dict(executor.params)
    if executor.kind == "slurm":
        ex = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm", slurm_max_num_timeout=MAX_TIMEOUTS)
        ex.update_parameters(**{"stderr_to_stdout": True, **p})
        return ex
    ex = submitit.LocalExecutor(folder=folder / "%j", max_num_timeout=MAX_TIMEOUTS)
    # the shared names as LocalExecutor takes them; the slurm_ ones mean nothing here
    ex.update_parameters(timeout_min=p["timeout_min"], tasks_per_node=int(p["tasks_per_node"]),
                         gpus_per_node=int(p["gpus_per_node"]), stderr_to_stdout=True)
    return ex
