"""The shape of an experiment spec (`emarule/experiments/*.yaml`), checked on load.

A spec is a nested mapping. Each leaf is described by a `Field`; an unknown key, a wrong
type or an out-of-range value is reported with its dotted path (`optimizer.betas[1]`).
Sections shared by all experiments are in COMMON; sections that only one task reads
(`model`, `data` and the task's own section) are its TaskSpec's `config` (emarule/registry/).
Pure Python: `plan`, `table` and `limits` load specs without importing torch.
"""

from __future__ import annotations

import math
import re
from typing import Any

from emarule.registry import lookup
from emarule.registry.fields import (NONNEG, NUM, POSITIVE, SKIP_BAD_ITEMS, Field, flag, integer, momentum, num,  # noqa: F401
                                     numlist, text, with_defaults)

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # a directory name that stays where it is put: no "/", no "..", no "."

PROGRESSIVE = {
    "kind": text(choices=("constant", "step", "incremental", "smooth")),
    "epoch": num("step: epoch at which the batch jumps to κB", **NONNEG),
    "base_step": num("step: the jump as a point on the clock in base steps, instead of epoch", **NONNEG),
    "from_kappa": num("step, incremental: κ before the first transition (default 1)", **POSITIVE),
    "start_epoch": num("smooth/incremental: first epoch of the ramp", **NONNEG),
    "end_epoch": num("smooth: epoch at which κB is reached", **NONNEG),
    "every_epochs": num("incremental: epochs between increments", **POSITIVE),
    "delta_batch": num("incremental: batch added at each increment (batch unit)", **POSITIVE),
    "batch_multiple": integer("smooth/incremental: the ramp's batches are rounded to multiples of it (a run "
                              "launched on N processes makes it a multiple of N; default 1: whole samples)",
                              lo=1),
}

COMMON: dict[str, Any] = {
    "name": text("experiment name, as on the command line",
                 pattern=(NAME, "a plain name of letters, digits, '.', '_' and '-' (it names the run directory "
                                "runs/<name>/)")),
    "title": text("one-line description"),
    "section": text("paper section and appendix"),
    "task": text("the task family that runs it (emarule/registry/__init__.py)"),
    "dataset": text("data set of the full-size recipe"),
    "paper_result": text("the paper's reported result for this recipe"),
    "precision": text(choices=("fp32", "tf32", "bf16")),
    "memory_format": text("layout of the model's 4-D weights, and so of its convolutions' activations: "
                          "contiguous (NCHW) or channels_last (NHWC, faster convolutions on CPU and tensor cores)",
                          choices=("contiguous", "channels_last")),
    "batch": {
        "size": num("reference batch B at which every base value is written", **POSITIVE),
        "unit": text("what a batch is measured in", choices=("samples", "seconds")),
        "sort_window": integer("seconds batches: items sorted by duration within windows of this many",
                               lo=1),
    },
    "optimizer": {
        "name": text(choices=("sgd", "lars", "rmsprop", "adam", "adamw", "lamb", "none")),
        "lr": num("base learning rate at batch.size", **NONNEG),
        "momentum": momentum("heavy-ball momentum (SGD, LARS); unchanged by the SGD rule; left out: "
                             "the optimizer's own (OPTIMIZER_MOMENTUM: LARS 0.9, else none)"),
        "nesterov": flag(),
        "betas": numlist("Adam-family (β1, β2)", item=momentum(), length=2),
        "alpha": momentum("RMSProp squared-gradient EMA coefficient"),
        "eps": num(**NONNEG),
        "trust_coefficient": num("LARS trust ratio coefficient", **POSITIVE),
        "weight_decay": num(**NONNEG),
        "weight_decay_rule": text(choices=("none", "auto", "linear", "sqrt", "uncoupled")),
        "weight_decay_skip_bias": flag("no decay on biases and norm parameters"),
        "grad_clip": num("max global gradient norm", nullable=True, **POSITIVE),
    },
    "schedule": {
        "kind": text(choices=("cosine", "multistep", "constant")),
        "epochs": num("training duration in epochs", nullable=True, **POSITIVE),
        "total_steps": integer("training duration in base optimizer steps", nullable=True, **POSITIVE),
        "warmup_epochs": num(nullable=True, **NONNEG),
        "warmup_steps": integer("linear warm-up counted in base steps", nullable=True, **NONNEG),
        "min_lr": num(**NONNEG),
        "milestones_epochs": numlist("multistep: epochs at which lr is multiplied by gamma"),
        "gamma": num(**POSITIVE),
    },
    "ema": {
        "momentum": momentum("base model-EMA momentum ρ at batch.size"),
        "also": numlist("further EMAs kept and evaluated in the same run, by base momentum", item=momentum()),
        "update_from": text("EMA tracks θ_t (pre, the paper's Definition) or θ_{t+1} (post, BYOL/DINO)",
                            choices=("pre", "post")),
        "start_steps": integer("EMA accumulation starts after this many base steps", **NONNEG),
        "momentum_after_transition": momentum("Progressive Scaling: the main EMA's ρ after the first "
                                              "transition, used as is (no rule); App. H's ablation"),
        "buffers": text("BatchNorm running statistics in the EMA: copied or averaged",
                        choices=("copy", "average")),
        "dtype": text("dtype the EMA weights are held in (the paper: float32 under bf16 autocast); `plan` warns "
                      "where ρ̂ rounds to 1.0 in it, and a run refuses any but float32",
                      choices=("float32", "bfloat16", "float16")),
    },
    "norm": {
        "kind": text(choices=("batchnorm", "layernorm")),
        "bn_momentum": momentum("BatchNorm running-statistics momentum ρ_BN (torch's momentum = 1 − ρ_BN)"),
        "bn_scale": flag("apply the EMA Scaling Rule to ρ_BN"),
        "sync_bn": flag("SyncBatchNorm across replicas"),
    },
    "eval": {
        "every_epochs": num("evaluate every this many epochs (and at the end)", null_is_default=True, **POSITIVE),
        "every_base_steps": num("evaluate every this many base steps instead", nullable=True, **POSITIVE),
    },
    "progressive": PROGRESSIVE,  # Progressive Scaling; null for constant κ
    "presets": Field((dict,), doc="named overrides {preset: {dotted.key: value}}"),
}
COMMON = with_defaults(COMMON, {
    "precision": "fp32", "memory_format": "contiguous", "batch.unit": "samples", "batch.sort_window": 1024,
    "optimizer.name": "sgd", "optimizer.nesterov": False, "optimizer.trust_coefficient": 0.001,
    "optimizer.weight_decay_skip_bias": False,
    "schedule.kind": "constant", "schedule.milestones_epochs": [], "schedule.gamma": 0.1,
    "ema.also": [], "ema.update_from": "post", "ema.start_steps": 0, "ema.buffers": "copy", "ema.dtype": "float32",
    "norm.sync_bn": False, "eval.every_epochs": 1.0,
})

# optimizer.momentum where the spec leaves it out: the optimizer's own (LARS's 0.9; none for SGD and RMSProp).
OPTIMIZER_MOMENTUM = {"sgd": 0.0, "lars": 0.9, "rmsprop": 0.0}


# What each optimizer's scaling rules read. A spec that switches optimizer (`--set optimizer.name=adam`
# on an SGD recipe) must bring these, or the plan would leave them at torch's unscaled defaults. LAMB's rule
# scales lr alone and keeps its betas and ε, which a recipe still states: they are its update's.
OPTIMIZER_NEEDS = {
    "sgd": ("lr",), "lars": ("lr",), "lamb": ("lr", "betas", "eps"),
    "adam": ("lr", "betas", "eps"), "adamw": ("lr", "betas", "eps"), "rmsprop": ("lr", "alpha", "eps"),
    "none": (),
}
# Those of OPTIMIZER_NEEDS its rules change (docs/cli.md's rule table); the rest they keep as written.
SCALED_BY_RULE = {"sgd": ("lr",), "lars": ("lr",), "lamb": ("lr",), "adam": ("lr", "betas", "eps"),
                  "adamw": ("lr", "betas", "eps"), "rmsprop": ("lr", "alpha", "eps")}
_EXAMPLE = {"lr": "0.1", "betas": "'[0.9, 0.999]'", "eps": "1e-8", "alpha": "0.99"}


def check_needs(spec: dict) -> str | None:
    """An error message when the spec's optimizer lacks a value its scaling rules need, else None."""
    opt = spec.get("optimizer") or {}
    name = opt.get("name", "sgd")
    missing = [k for k in OPTIMIZER_NEEDS.get(name, ()) if opt.get(k) is None]
    if not missing:
        return None
    keys = ", ".join(f"optimizer.{k}" for k in missing)
    example = " ".join(f"--set optimizer.{k}={_EXAMPLE[k]}" for k in missing)
    scaled = [k for k in missing if k in SCALED_BY_RULE.get(name, ())]
    why = ("which its scaling rules scale" if scaled == missing else
           "which its update reads (its scaling rules leave them unchanged)" if not scaled else
           f"which its update reads (its scaling rules scale {', '.join(f'optimizer.{k}' for k in scaled)})")
    return f"optimizer {name} needs {keys}, {why}; give them, e.g. {example}"


def _typename(types: tuple) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "true/false", list: "list", dict: "mapping"}
    if types == NUM:
        return "number"
    return " or ".join(names.get(t, t.__name__) for t in types)


def check_value(path: str, value: Any, field: Field) -> str | None:
    """Return an error message for `value` at `path`, or None when it fits `field`."""
    if value is None:
        return None if field.nullable else f"{path}: must not be empty (null)"
    ok = isinstance(value, field.types) and not (isinstance(value, bool) and bool not in field.types)
    if not ok and float in field.types and isinstance(value, str):
        ok = False
    if not ok:
        return f"{path}: expected {_typename(field.types)}, got {type(value).__name__} {value!r}"
    if isinstance(value, NUM) and not isinstance(value, bool):
        try:
            v = float(value)
        except OverflowError:  # an int beyond float64's range, from YAML or a dict
            return f"{path}: must be finite, got an integer of {len(str(abs(value)))} digits (beyond float range)"
        if not math.isfinite(v):
            return f"{path}: must be finite, got {value!r}"
        if field.lo is not None and v < field.lo:
            return f"{path}: must be ≥ {field.lo}, got {value!r}"
        if field.lo_open is not None and v <= field.lo_open:
            return f"{path}: must be > {field.lo_open}, got {value!r}"
        if field.hi is not None and v > field.hi:
            return f"{path}: must be ≤ {field.hi}, got {value!r}"
        if field.hi_open is not None and v >= field.hi_open:
            return f"{path}: must be < {field.hi_open}, got {value!r}"
    if field.pattern is not None and isinstance(value, str) and not re.fullmatch(field.pattern[0], value):
        return f"{path}: must be {field.pattern[1]}; got {value!r}"
    if field.choices is not None and value not in field.choices:
        return f"{path}: must be one of {', '.join(map(str, field.choices))}; got {value!r}"
    if isinstance(value, list):
        if field.length is not None and len(value) != field.length:
            return f"{path}: expected {field.length} items, got {len(value)}"
        if field.items is not None:
            for i, item in enumerate(value):
                err = check_value(f"{path}[{i}]", item, field.items)
                if err:
                    return err
    return None


def check_tree(prefix: str, tree: Any, schema: dict) -> str | None:
    if not isinstance(tree, dict):
        return f"{prefix or 'spec'}: expected a mapping, got {type(tree).__name__}"
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in schema:
            known = ", ".join(sorted(map(str, schema)))
            return f"{path}: unknown key (known here: {known})"
        sub = schema[key]
        if isinstance(sub, dict) and value is None:
            continue  # an empty section (`progressive: null`)
        err = check_tree(path, value, sub) if isinstance(sub, dict) else check_value(path, value, sub)
        if err:
            return err
    return None


def task_keys(task: str | None) -> dict:
    """The task's own sections, from its registry record ({} for a task that is not registered)."""
    spec = lookup(task)
    return spec.config if spec else {}


def schema_for(task: str | None) -> dict:
    """COMMON plus the task's own sections."""
    merged = dict(COMMON)
    merged.update(task_keys(task))
    return merged


def value(spec: dict, dotted: str) -> Any:
    """The spec's value at `dotted`, or the schema's default for it where the spec leaves it out (or writes null
    for a key whose null means its default): the one place a default lives. A key the spec's task does not
    declare is a programming error (KeyError), not a None. Runs read the same through `ctx.cfg` (typed.py)."""
    section = dotted.split(".", 1)[0]
    field = get(COMMON if section in COMMON else task_keys(spec.get("task")), dotted)
    node: Any = spec
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        if not isinstance(field, Field) or node is not None or not field.null_is_default:
            return node
    if not isinstance(field, Field):
        raise KeyError(f"{dotted} is not a key of a {spec.get('task')!r} spec (emarule/config/)")
    return list(field.default) if isinstance(field.default, list) else field.default  # a copy: callers may edit


def get(tree: dict, dotted: str, default: Any = None) -> Any:
    """`tree["a"]["b"]` for "a.b", or `default` where a part is missing: for specs and schemas alike."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
