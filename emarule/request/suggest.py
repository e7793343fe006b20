"""Commands a message offers as its fix, written for the spec or run at hand so that they work as given: the
experiment by name, or `--spec PATH` for a spec of one's own, with the preset and `--set` options it ran with.
Torch-free."""

from __future__ import annotations

import shlex
from pathlib import Path

from emarule.errors import UserError


def _given_as(spec: dict) -> str:
    """EXPERIMENT, or --spec PATH where the spec is not one of the named experiments (`emarule list`)."""
    from emarule.config.load import experiment_names, experiments_dir

    source, name = spec.get("source"), spec.get("name", "?")
    named = source is None or Path(source).resolve() == (experiments_dir() / f"{name}.yaml").resolve()
    return str(name) if named and name in experiment_names() else f"--spec {shlex.quote(str(source))}"


def plan_command(spec: dict) -> str:
    """`emarule plan` of this spec as it was given: by its experiment's name, or by --spec and its path."""
    return f"emarule plan {_given_as(spec)}" + (f" --preset {spec['preset']}" if spec.get("preset") else "")


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_leaves(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def _sets(spec: dict) -> list[str]:
    """The --set options that take the spec file (under the run's preset) to the run's spec."""
    import yaml

    from emarule.config.load import load_spec

    try:
        base = load_spec(path=spec["source"], preset=spec.get("preset"))
    except (KeyError, TypeError, UserError):
        return []
    ran, given = _leaves(spec), _leaves(base)
    skip = ("preset", "source", "progressive")  # a κ=1 baseline runs constant
    keys = [k for k in dict.fromkeys([*given, *ran]) if k.split(".", 1)[0] not in skip and ran.get(k) != given.get(k)]
    flow = {k: yaml.safe_dump(ran.get(k), default_flow_style=True).strip().removesuffix("...").strip() for k in keys}
    return [f"--set {shlex.quote(f'{k}={v}')}" for k, v in flow.items()]


def baseline_command(hparams: dict, run: Path) -> str:
    """`emarule run` of the κ=1 baseline that matches a run (from its hparams.json): the same spec, preset, --set
    options, seed and data, written beside it."""
    from emarule.engine.context import default_run_name

    spec = hparams.get("spec") if isinstance(hparams.get("spec"), dict) else {"name": hparams.get("experiment")}
    preset, seed = hparams.get("preset"), hparams.get("seed")
    parts = ["emarule run", _given_as(spec)] + ([f"--preset {preset}"] if preset else []) + _sets(spec)
    parts += ["--kappa 1"] + ([f"--seed {seed}"] if isinstance(seed, int) and seed else [])
    parts += [f"--data {shlex.quote(str(hparams['data']))}"] if hparams.get("data") else []
    name = default_run_name(1.0, "exponential", seed if isinstance(seed, int) else 0, None, preset)
    return " ".join(parts + [f"--out {shlex.quote(str(run.parent / name))}"])
