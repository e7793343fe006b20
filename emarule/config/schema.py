"""The shape of an experiment spec (`experiments/*.yaml`), checked on load.

A spec is a nested mapping. Each leaf is described by a `Field`; an unknown key, a wrong
type or an out-of-range value is reported with its dotted path (`optimizer.betas[1]`).
Sections shared by all experiments are in COMMON; sections that only one task reads
(`model`, `data` and the task's own section) are in TASKS, keyed by the spec's `task`.
Pure Python: `plan`, `table` and `limits` load specs without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NUM = (int, float)


@dataclass(frozen=True)
class Field:
    types: tuple  # accepted Python types of the value (bool is never taken as a number)
    lo: float | None = None  # inclusive lower bound
    hi: float | None = None  # inclusive upper bound
    hi_open: float | None = None  # exclusive upper bound (momenta and betas: < 1)
    lo_open: float | None = None  # exclusive lower bound (batch sizes, lrs: > 0)
    choices: tuple | None = None
    nullable: bool = False
    items: "Field | None" = None  # for lists: the shape of every item
    length: int | None = None  # for lists of fixed length (Adam betas)
    doc: str = ""
    default: Any = None  # the value a spec without the key gets (where the code reads it from here)


def num(doc="", **kw) -> Field:
    return Field(NUM, doc=doc, **kw)


def integer(doc="", **kw) -> Field:
    return Field((int,), doc=doc, **kw)


def text(doc="", **kw) -> Field:
    return Field((str,), doc=doc, **kw)


def flag(doc="") -> Field:
    return Field((bool,), doc=doc)


def momentum(doc="") -> Field:
    return Field(NUM, lo=0.0, hi_open=1.0, doc=doc)


def numlist(doc="", item: Field | None = None, **kw) -> Field:
    return Field((list,), items=item or num(), doc=doc, **kw)


# data.skip_bad_items (emarule/baditems.py): an item that fails to decode is an error naming its file,
# or, when true, skipped, counted and reported in the summary and the metrics (skipped_items).
SKIP_BAD_ITEMS = Field((bool,), doc="skip (and count) training items that fail to decode, instead of stopping",
                       default=False)

POSITIVE = dict(lo_open=0.0)
NONNEG = dict(lo=0.0)

PROGRESSIVE = {
    "kind": text(choices=("constant", "step", "incremental", "smooth")),
    "epoch": num("step: epoch at which the batch jumps to κB", **NONNEG),
    "base_step": num("step: the jump as a point on the clock in base steps, instead of epoch", **NONNEG),
    "from_kappa": num("step, incremental: κ before the first transition (default 1)", **POSITIVE),
    "start_epoch": num("smooth/incremental: first epoch of the ramp", **NONNEG),
    "end_epoch": num("smooth: epoch at which κB is reached", **NONNEG),
    "every_epochs": num("incremental: epochs between increments", **POSITIVE),
    "delta_batch": num("incremental: batch added at each increment (batch unit)", **POSITIVE),
}

COMMON: dict[str, Any] = {
    "name": text("experiment name, as on the command line"),
    "title": text("one-line description"),
    "section": text("paper section and appendix"),
    "task": text("module in emarule/tasks that runs it"),
    "dataset": text("data set of the full-size recipe"),
    "paper_result": text("the paper's reported result for this recipe"),
    "precision": text(choices=("fp32", "tf32", "bf16")),
    "batch": {
        "size": num("reference batch B at which every base value is written", **POSITIVE),
        "unit": text("what a batch is measured in", choices=("samples", "seconds")),
        "sort_window": integer("seconds batches: items sorted by duration within windows of this many",
                               lo=1),
    },
    "optimizer": {
        "name": text(choices=("sgd", "lars", "rmsprop", "adam", "adamw", "lamb", "none")),
        "lr": num("base learning rate at batch.size", **NONNEG),
        "momentum": momentum("heavy-ball momentum (SGD, LARS); unchanged by the SGD rule"),
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
                                              "transition, used as is (no rule); App. F's ablation"),
        "buffers": text("BatchNorm running statistics in the EMA: copied or averaged",
                        choices=("copy", "average")),
        "dtype": text("dtype the EMA weights are held in (the paper: float32 under bf16 autocast)",
                      choices=("float32", "bfloat16", "float16")),
    },
    "norm": {
        "kind": text(choices=("batchnorm", "layernorm")),
        "bn_momentum": momentum("BatchNorm running-statistics momentum ρ_BN (torch's momentum = 1 − ρ_BN)"),
        "bn_scale": flag("apply the EMA Scaling Rule to ρ_BN"),
        "sync_bn": flag("SyncBatchNorm across replicas"),
    },
    "eval": {
        "every_epochs": num("evaluate every this many epochs (and at the end)", nullable=True, **POSITIVE),
        "every_base_steps": num("evaluate every this many base steps instead", nullable=True, **POSITIVE),
    },
    "progressive": PROGRESSIVE,  # Progressive Scaling; null for constant κ
    "presets": Field((dict,), doc="named overrides {preset: {dotted.key: value}}"),
}

# Task-owned sections. Each task's keys are declared beside the others so that a spec can be
# validated (and planned) without importing the task module, which may import torch.
TASKS: dict[str, dict[str, Any]] = {
    "toy": {  # engine tests: a generated regression (emarule/tasks/toy.py)
        "toy": {
            "samples": integer(lo=1), "eval_samples": integer(lo=1), "dim": integer(lo=1), "hidden": integer(lo=1),
            "out": integer(lo=1), "noise": num(**NONNEG), "augment": num(**NONNEG), "batchnorm": flag(),
            "dropout": num(lo=0.0, hi=0.9),
            "teacher_weight": num(**NONNEG), "step_delay": num(**NONNEG), "threads": integer(lo=1),
            "checkpoint_every_epochs": num(**POSITIVE), "quiet": flag(), "seconds": flag(),
            "center_momentum": momentum(),
        },
    },
    "parabola": {
        "parabola": {
            "a": num("curvature", **POSITIVE),
            "b": num("noise scaled by the gradient squared", **NONNEG),
            "c": num("additive noise", **NONNEG),
            "theta0": num("norm of the initial position", **POSITIVE),
            "kappas": numlist("scalings to sweep", item=num(**POSITIVE)),
            "rho_bases": numlist("base momenta ρ_B", item=momentum()),
            "dims": numlist("dimensions D", item=integer(lo=1)),
            "seeds": integer("Monte Carlo seeds for D=1 when d1_method is montecarlo (both halves)", lo=2),
            "seed_dim_product": integer("seeds × D for each D > 1 (both halves of the hold-out)", lo=2),
            "d1_method": text("D=1: exact first moment, or Monte Carlo with a hold-out",
                              choices=("exact", "montecarlo")),
            "conventions": Field((list,), items=text(choices=("pre", "post")),
                                 doc="EMA from θ_k (pre, the paper's Definition) and/or θ_{k+1} (post)"),
            "search_points": integer("Monte Carlo: grid points per run on which ρ* is chosen", lo=2),
            "nodes": integer("Chebyshev nodes across the bracket of ρ*", lo=5),
            "figure_kappas": numlist("κ shown in Fig. 1a", item=integer(lo=1)),
            "workers": integer("processes (one per configuration at a time)", lo=1),
            "seed": integer(),
        },
    },
    "precision": {
        "precision_study": {  # steps, lr and batch come from schedule.total_steps, optimizer.lr, batch.size
            "features": integer("regression weights per repeat", lo=1),
            "samples": integer("training samples per repeat", lo=1),
            "noise": num("label noise standard deviation", **NONNEG),
            "init_std": num("standard deviation of the initial weights (0: start at zero)", **NONNEG),
            "momenta": numlist(item=momentum()),
            "dtypes": Field((list,), items=text(choices=("fp32", "bf16", "fp16")),
                            doc="dtypes the model and EMA weights are held in (fp32 is the reference)"),
            "repeats": integer("independent regressions, for the spread of MaxAbsDiff", lo=2),
            "seed": integer(),
        },
    },
    "polyak": {  # emarule/tasks/polyak.py
        "model": {"arch": text("a timm ResNetv2 (resnetv2_50)"), "num_classes": integer(lo=1),
                  "init": text(choices=("kaiming_normal_relu", "default")),
                  "width": integer("stem channels; stages 4·width … 32·width (64: the full model)", lo=1),
                  "layers": Field((list,), items=integer(lo=1), length=4, doc="blocks per stage"),
                  "stem": text("imagenet (7×7 conv, max-pool) or small (3×3 stride-2 conv)",
                               choices=("imagenet", "small")),
                  "output_stride": integer("32 (the paper's); 16 dilates the last stage", choices=(8, 16, 32))},
        "data": {"source": text(choices=("imagenet", "textures")), "image_size": integer(lo=1),
                 "augmentation": text(choices=("imagenet", "translate")), "label_smoothing": num(lo=0.0, hi=1.0),
                 "path": text(nullable=True),
                 "train_samples": integer("textures: training images", nullable=True, lo=1),
                 "eval_samples": integer("textures: validation images", nullable=True, lo=1),
                 "noise": num("textures: white noise std relative to the texture's", **NONNEG),
                 "seed": integer("textures: the data set's seed (the same images for every run seed)", **NONNEG),
                 "skip_bad_items": SKIP_BAD_ITEMS},
    },
    "ctc": {
        "model": {
            "layers": integer(lo=1), "heads": integer(lo=1), "dim": integer(lo=1), "mlp_dim": integer(lo=1),
            "dropout": num(lo=0.0, hi=1.0), "layer_drop": num(lo=0.0, hi=1.0),
            "conv_kernel": integer(lo=1), "conv_stride": integer(lo=1), "vocab": integer(lo=2),
            "positional": text(choices=("cape", "sinusoidal", "relative")), "post_layernorm": flag(),
        },
        "data": {
            "labeled": text(), "unlabeled": Field((list,), items=text()), "path": text(nullable=True),
            "sample_rate": integer(lo=1), "n_mels": integer(lo=1), "window_ms": num(**POSITIVE),
            "stride_ms": num(**POSITIVE), "seconds_per_device": num(**POSITIVE), "devices": integer(lo=1),
            "source": text("LibriSpeech from --data, or the generated corpus", choices=("librispeech", "synthetic")),
            "eval_splits": Field((list,), items=text(), doc="evaluation splits; the first is the main one (wer)"),
            "pl_eval_utterances": integer("unlabeled utterances whose pseudo-labels are scored (pl_wer)", lo=1),
            "skip_bad_items": SKIP_BAD_ITEMS,
        },
        "corpus": {  # the generated corpus (data.source: synthetic), emarule/speech/corpus.py
            "seed": integer(), "speakers": integer("speakers per split", lo=1),
            "labeled": integer("utterances of the labeled split", lo=1),
            "unlabeled": integer("utterances of each unlabeled split", **NONNEG),
            "eval": integer("utterances of each evaluation split", lo=1),
            "dir": text("cache folder (default $EMARULE_CACHE or ~/.cache/emarule)", nullable=True),
        },
        "specaug": {
            "start_steps": integer(**NONNEG), "freq_masks": integer(**NONNEG), "freq_param": integer(**NONNEG),
            "time_masks": integer(**NONNEG), "time_ratio": num(lo=0.0, hi=1.0), "time_param": integer(**NONNEG),
        },
        "pseudo_label": {
            "pretrain_steps": integer(**NONNEG), "labeled_ratio": integer(lo=1), "unlabeled_ratio": integer(lo=1),
            "dropout_after": num(lo=0.0, hi=1.0), "layer_drop_after": num(lo=0.0, hi=1.0),
            "transcription": text(choices=("hard",)),
            "start": text("when pseudo-labeling starts: after pretrain_steps, when the dev WER reaches the baseline's, "
                          "or auto (steps for κ ≤ 2, wer above)", choices=("auto", "steps", "wer")),
            "start_wer": num("the baseline's dev WER (%) at its start of pseudo-labeling", nullable=True, **NONNEG),
            "start_wer_from": text("a κ=1 run directory to read that WER from", nullable=True),
            "latest_start_steps": num("base step by which pseudo-labeling starts in wer mode even if the WER "
                                      "never reaches the threshold (not the paper's)", nullable=True, **NONNEG),
        },
    },
    "byol": {
        "model": {
            "arch": text(), "width": integer(lo=1), "init": text(), "patch_size": integer(lo=1),
            "stochastic_depth": num(lo=0.0, hi=1.0), "projector_hidden": integer(lo=1),
            "projector_out": integer(lo=1), "predictor_hidden": integer(lo=1),
            "head_norm": text("projector and predictor norm", choices=("batchnorm", "layernorm", "none")),
            "embed_dim": integer("ViT width (narrow ViTs of the cpu/tiny presets)", nullable=True, lo=1),
            "depth": integer("ViT blocks", nullable=True, lo=1), "heads": integer("ViT heads", nullable=True, lo=1),
            "cifar_stem": flag("3x3 stem without max-pool for 32x32 inputs"),
        },
        "data": {
            "image_size": integer(lo=1), "augmentation": text(), "path": text(nullable=True),
            "num_classes": integer(lo=1),
            "source": text(choices=("cifar10", "imagenet", "digits", "shapes", "synthetic")),
            "train_samples": integer("cap on the training set (cpu/tiny presets)", nullable=True, lo=1),
            "eval_samples": integer(nullable=True, lo=1), "skip_bad_items": SKIP_BAD_ITEMS,
        },
        "probe": {"lr": num("the tracking probe's own Adam lr at batch.size (emarule/probe.py)", **POSITIVE),
                  "kind": text(choices=("pre-bn",))},
    },
    "dino": {  # emarule/tasks/dino.py
        "model": {
            "arch": text(), "patch_size": integer(lo=1), "init": text(), "out_dim": integer(lo=1),
            "head_hidden": integer(lo=1), "bottleneck": integer(lo=1), "stochastic_depth": num(lo=0.0, hi=1.0),
            "head_layers": integer("Linear layers of the head's MLP", lo=1),
            "norm_last_layer": flag("last layer's row norms fixed at 1 (DINO's default)"),
            "embed_dim": integer("ViT width (narrow ViTs of the cpu/tiny presets)", nullable=True, lo=1),
            "depth": integer("ViT blocks", nullable=True, lo=1), "heads": integer("ViT heads", nullable=True, lo=1),
        },
        "data": {
            "image_size": integer("global crop size", lo=1), "augmentation": text(), "path": text(nullable=True),
            "global_crops": integer(lo=1), "local_crops": integer(**NONNEG), "local_size": integer(lo=1),
            "global_scale": numlist("area fraction range of a global crop", item=num(lo=0.0, hi=1.0), length=2),
            "local_scale": numlist("area fraction range of a local crop", item=num(lo=0.0, hi=1.0), length=2),
            "num_classes": integer(lo=1),
            "source": text(choices=("cifar10", "imagenet", "digits", "shapes", "synthetic")),
            "train_samples": integer("cap on the training set (cpu/tiny presets)", nullable=True, lo=1),
            "eval_samples": integer(nullable=True, lo=1), "skip_bad_items": SKIP_BAD_ITEMS,
        },
        "dino": {
            "center_momentum": momentum("center EMA ρ_c, unscaled in the paper"),
            "center_scale": flag("apply the EMA Scaling Rule to ρ_c"),
            "student_temp": num(**POSITIVE), "teacher_temp": num(**POSITIVE),
            "warmup_teacher_temp": num(**POSITIVE), "warmup_teacher_temp_epochs": integer(**NONNEG),
            "freeze_last_layer_epochs": num("the head's last layer is not trained before this epoch", **NONNEG),
        },
        "probe": {"lr": num(**POSITIVE), "kind": text(choices=("pre-bn",))},
    },
}


# What each optimizer's scaling rules read. A spec that switches optimizer (`--set optimizer.name=adam`
# on an SGD recipe) must bring these, or the plan would leave them at torch's unscaled defaults.
OPTIMIZER_NEEDS = {
    "sgd": ("lr",), "lars": ("lr",), "lamb": ("lr", "betas", "eps"),
    "adam": ("lr", "betas", "eps"), "adamw": ("lr", "betas", "eps"), "rmsprop": ("lr", "alpha", "eps"),
    "none": (),
}
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
    return f"optimizer {name} needs {keys}, which its scaling rules scale; give them, e.g. {example}"


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
        v = float(value)
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


def schema_for(task: str | None) -> dict:
    """COMMON plus the task's own sections."""
    merged = dict(COMMON)
    merged.update(TASKS.get(task or "", {}))
    return merged


def get(tree: dict, dotted: str, default: Any = None) -> Any:
    """`tree["a"]["b"]` for "a.b", or `default` where a part is missing: for specs and schemas alike."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
