"""timm's `args.yaml` (what its train.py writes into every output folder) scaled to a new batch size.

Pure Python, like the rest of `emarule.scaling`: `emarule plan --timm-args` never imports torch.
The values come from the same rules as `emarule plan`; only the mapping to timm's keys lives here:

- timm's global batch is `batch_size × grad_accum_steps × world size`, and args.yaml does not record
  the world size: the caller states it (default 1). The scaled file keeps the world size and the
  accumulation, and scales the per-device `batch_size`.
- With `lr: null` timm derives lr = lr_base × (global batch / lr_base_size)^p at start-up (p = 1/2
  when the optimizer's name holds "ada" or "lamb", else 1): that already follows the paper's rule for
  SGD and Adam, so lr_base is kept; where timm's choice of p differs from the rule (RMSProp), the
  rule's lr is written out.
- `model_ema_decay` is a per-optimizer-step momentum (train.py updates ModelEmaV3 once per step), so
  ρ̂ = ρ^κ. Epoch-counted values are unchanged; batch-counted ones (log and recovery intervals,
  batches per epoch) are divided by κ.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from emarule.errors import ScalingError, UserError
from emarule.scaling import rules
from emarule.scaling.plan import Plan, Scaled, _clean, scale

# train.py's defaults for the keys read here: a key missing from args.yaml takes these, as
# `train.py --config` does (its parser supplies every argument the file leaves out).
DEFAULTS: dict[str, Any] = {
    "batch_size": 128, "grad_accum_steps": 1, "opt": "sgd", "lr": None, "lr_base": 0.1, "lr_base_size": 256,
    "lr_base_scale": "", "momentum": 0.9, "weight_decay": 2e-5, "opt_betas": None, "opt_eps": None,
    "min_lr": 0.0, "warmup_lr": 1e-5, "model_ema": False, "model_ema_decay": 0.9998, "model_ema_warmup": False,
}
EPOCH_KEYS = ("epochs", "warmup_epochs", "cooldown_epochs", "decay_epochs", "decay_milestones")
BATCH_COUNTED = ("log_interval", "recovery_interval", "train_batches_per_epoch")

# timm's optimizer names (timm.optim's registry) → the rule family in emarule.scaling.plan, and
# whether weight decay is decoupled (θ ← θ − ηλθ: the Weight Decay Scaling Rule) or an L2 term
# added to the gradient (part of the loss, which no rule changes).
FAMILIES = {
    **{n: ("sgd", True) for n in ("sgd", "momentum", "nesterov", "sgdp", "sgdw")},
    **{n: ("lars", True) for n in ("lars", "larc", "nlars", "nlarc")},
    **{n: ("adam", False) for n in ("adam", "nadam", "radam", "adamp", "nadamlegacy", "radamlegacy")},
    **{n: ("adamw", True) for n in ("adamw", "adamwlegacy", "nadamw", "radamw")},
    **{n: ("rmsprop", False) for n in ("rmsprop", "rmsproptf")},
    **{n: ("lamb", True) for n in ("lamb", "lambc", "lambw")},
}
ADAM_DEFAULTS = {"opt_betas": [0.9, 0.999], "opt_eps": 1e-8}  # torch's Adam/AdamW defaults, used by timm
# The ε each RMSProp takes when args.yaml gives no opt_eps: torch.optim.RMSprop's, and timm's RMSpropTF's.
RMSPROP_EPS = {"rmsprop": 1e-8, "rmsproptf": 1e-10}


def _base_name(opt: str) -> str:
    """The optimizer as timm's create_optimizer reads it: lower-cased, the `lookahead_` wrapper dropped
    ('Lookahead_RMSPropTF' → rmsproptf), and fused/bnb/8bit variants as their plain optimizer."""
    name = opt.lower().split("_")[-1]
    for prefix in ("fused", "bnb"):
        name = name.removeprefix(prefix)
    return name.removesuffix("8bit")


def _family(opt: str) -> tuple[str | None, bool]:
    """'lookahead_adamw' → adamw; 'fusedadam' → adam; an optimizer with no known rule → (None, False)."""
    return FAMILIES.get(_base_name(opt), (None, False))


def load(path: Path) -> dict:
    """args.yaml as a dict (as written: train.py's defaults fill the keys it lacks later), every key
    that is read here checked for type; one-line errors."""
    from emarule.config.files import regular_file

    regular_file(path, "--timm-args", "pass the args.yaml file that timm's train.py wrote")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; pass the args.yaml from a timm train.py output folder") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder; pass the args.yaml file inside it") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a text file; pass timm's args.yaml") from None
    from emarule.config.load import SpecShapeError, yaml_load

    try:
        args = yaml_load(text, yaml.SafeLoader)  # YAML 1.1, as train.py's yaml.safe_dump writes it
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        if isinstance(e, SpecShapeError):
            raise UserError(f"{path}: {e.problem}{at}; {e.fix}") from None
        raise UserError(f"{path} is not valid YAML{at}; pass the args.yaml that timm's train.py wrote") from None
    if not isinstance(args, dict) or "batch_size" not in args or "opt" not in args:
        raise UserError(f"{path} is not a timm args.yaml (a mapping with batch_size, opt, ...); pass the "
                        f"args.yaml that timm's train.py writes into its output folder")
    _check(path, {**DEFAULTS, **args})
    return args


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(path: Path | str, a: dict) -> None:
    def bad(key: str, want: str) -> UserError:
        return UserError(f"{path}: {key} must be {want}, got {a[key]!r}; fix it or write args.yaml again with train.py")

    for key in ("batch_size", "grad_accum_steps", "lr_base_size"):
        if not (isinstance(a[key], int) and not isinstance(a[key], bool) and a[key] > 0):
            raise bad(key, "a whole number > 0")
    for key in ("lr_base", "momentum", "weight_decay", "min_lr", "warmup_lr", "model_ema_decay"):
        if not _number(a[key]):
            raise bad(key, "a number")
    for key in ("lr", "opt_eps"):
        if a[key] is not None and not _number(a[key]):
            raise bad(key, "a number or null")
    if a["opt_betas"] is not None and not (isinstance(a["opt_betas"], list) and len(a["opt_betas"]) == 2
                                           and all(_number(b) and 0 <= b < 1 for b in a["opt_betas"])):
        raise bad("opt_betas", "a list of two numbers in [0, 1) (β1 β2) or null")
    # the ranges timm's optimizers (and torch's under them) accept: refused here, not when train.py starts
    for key in ("lr_base", "lr", "opt_eps"):
        if a[key] is not None and not a[key] > 0:
            raise bad(key, "> 0")
    for key in ("weight_decay", "momentum", "min_lr", "warmup_lr"):
        if not a[key] >= 0:
            raise bad(key, "≥ 0")
    if not isinstance(a["opt"], str) or not a["opt"]:
        raise bad("opt", "an optimizer name such as sgd or adamw")
    if a["lr_base_scale"] not in ("", "linear", "sqrt"):
        raise bad("lr_base_scale", "'', linear or sqrt")
    for key in ("model_ema", "model_ema_warmup"):
        if not isinstance(a[key], bool):
            raise bad(key, "true or false")
    for key in EPOCH_KEYS:  # decay_milestones is a list of epochs
        v = a.get(key)
        if v is not None and not (_number(v) or (isinstance(v, list) and all(_number(x) for x in v))):
            raise bad(key, "a number or a list of numbers")
    for key in BATCH_COUNTED:  # counts of batches, divided by κ and rounded: whole numbers, as train.py takes
        v = a.get(key)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise bad(key, "a whole number ≥ 0")


def _rule_p(family: str | None) -> float | None:
    """The exponent of κ in the paper's lr rule: 1 (SGD, LARS), 1/2 (Adam, RMSProp, LAMB), None (no rule)."""
    return {"sgd": 1.0, "lars": 1.0}.get(family, 0.5 if family else None)


def _timm_p(a: dict) -> float:
    """The exponent timm's train.py uses to derive lr from lr_base."""
    scale_ = a["lr_base_scale"] or ("sqrt" if any(o in a["opt"].lower() for o in ("ada", "lamb")) else "linear")
    return 0.5 if scale_ == "sqrt" else 1.0


def timm_plan(args: dict, name: str, *, kappa: float | None = None, batch_size: float | None = None,
              world_size: int = 1, ema_rule: str = "exponential") -> tuple[Plan, dict]:
    """(the plan, keyed by timm's argument names; the scaled args for `train.py --config`: the keys of
    `args` with the changed values, plus any value the rules had to write out). `ema_rule`: the form of the
    EMA Scaling Rule model_ema_decay is scaled by (exponential ρ^κ, or linear 1 − κ(1 − ρ))."""
    a = {**DEFAULTS, **args}
    _check(name, a)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise UserError(f"world size must be a whole number ≥ 1, got {world_size!r}")
    per_step = a["grad_accum_steps"] * world_size
    base_batch = a["batch_size"] * per_step
    if (kappa is None) == (batch_size is None):
        raise UserError("give the new global batch (--batch-size B) or κ (--kappa K), one of them")
    new_batch = rules.check_kappa(batch_size) if batch_size is not None else base_batch * rules.check_kappa(kappa)
    kappa = new_batch / base_batch
    per_device = new_batch / per_step
    if not float(per_device).is_integer():
        raise UserError(f"global batch {new_batch:g} is not a whole number of samples per device and accumulation "
                        f"step ({per_step} = grad_accum_steps {a['grad_accum_steps']} × world size {world_size}); "
                        f"pick a multiple of {per_step}")
    family, decoupled = _family(a["opt"])
    adaptive = family in ("adam", "adamw")
    values: dict[str, Scaled] = {
        "global batch": Scaled(base_batch, new_batch, "samples", f"B̂ = κB (batch_size × grad_accum_steps "
                                                                 f"{a['grad_accum_steps']} × world size {world_size})"),
        "batch_size": Scaled(a["batch_size"], int(per_device), "samples per device", "per-device batch: ×κ"),
    }
    warnings: list[str] = []
    # The optimizer and the EMA through the core rules: the same numbers as `emarule plan`.
    betas = a["opt_betas"] if a["opt_betas"] is not None or not adaptive else ADAM_DEFAULTS["opt_betas"]
    eps = a["opt_eps"] if a["opt_eps"] is not None or not adaptive else ADAM_DEFAULTS["opt_eps"]
    if eps is None and family == "rmsprop":  # the rule scales ε too: write the default it would keep
        eps = RMSPROP_EPS[_base_name(a["opt"])]
    base_lr = a["lr"] if a["lr"] is not None else a["lr_base"] * (base_batch / a["lr_base_size"]) ** _timm_p(a)
    opt = {"name": family or a["opt"], "lr": base_lr, "betas": betas, "eps": eps, "weight_decay": a["weight_decay"],
           "weight_decay_rule": "auto" if decoupled else "none", "momentum": a["momentum"]}
    spec = {"name": name, "batch": {"size": base_batch}, "optimizer": {k: v for k, v in opt.items() if v is not None},
            "ema": {"momentum": a["model_ema_decay"]}}
    try:
        core = scale(spec, kappa, ema_rule)
    except ScalingError as e:  # a beta or ρ out of range: name the args.yaml key
        raise UserError(str(e).replace("optimizer.betas", "opt_betas").replace("ema.momentum", "model_ema_decay")
                        ) from None
    out = dict(args)
    out["batch_size"] = int(per_device)
    lr = core.values["optimizer.lr"]
    if a["lr"] is not None:
        out["lr"] = _clean(lr.scaled)
        values["lr"] = Scaled(a["lr"], out["lr"], "learning rate", lr.rule)
    else:
        p_rule, p_timm = _rule_p(family), _timm_p(a)
        if p_rule is not None and p_rule != p_timm:
            # timm would derive lr at the new batch with its own exponent: write the rule's lr instead.
            out["lr"] = _clean(lr.scaled)
            values["lr"] = Scaled(base_lr, out["lr"], "learning rate",
                                  f"{lr.rule}; written as lr (timm scales lr_base by ^{p_timm:g} for {a['opt']})")
        else:
            values["lr_base"] = Scaled(a["lr_base"], a["lr_base"], "learning rate",
                                       f"unchanged: timm derives lr = lr_base × (B/lr_base_size {a['lr_base_size']})"
                                       f"^{p_timm:g}")
            values["lr (derived by timm)"] = Scaled(base_lr, a["lr_base"] * (new_batch / a["lr_base_size"]) ** p_timm,
                                                    "learning rate", lr.rule if p_rule is not None else
                                                    "timm's own lr_base rule")
    if family is None:
        warnings.append(f"opt {a['opt']!r} has no known scaling rule (SGD, LARS, Adam(W), RMSProp, LAMB have): "
                        f"its lr, betas and eps are left as they are")
    for key in ("min_lr", "warmup_lr"):
        if a[key]:
            ratio = lr.scaled / base_lr if base_lr else 1.0
            out[key] = _clean(a[key] * ratio)
            values[key] = Scaled(a[key], out[key], "learning rate", lr.rule)
    if family in ("sgd", "lars"):
        values["momentum"] = Scaled(a["momentum"], a["momentum"], "momentum", core.values["optimizer.momentum"].rule)
    if "optimizer.betas" in core.values and betas is not None:
        b = core.values["optimizer.betas"]
        out["opt_betas"] = _clean(list(b.scaled))
        values["opt_betas"] = Scaled(betas if a["opt_betas"] is not None else f"{betas} (default)", out["opt_betas"],
                                     "momentum", b.rule)
    if "optimizer.eps" in core.values and eps is not None:
        e = core.values["optimizer.eps"]
        out["opt_eps"] = _clean(e.scaled)
        values["opt_eps"] = Scaled(eps if a["opt_eps"] is not None else f"{eps:g} (default)", out["opt_eps"],
                                   "epsilon", e.rule)
    wd = core.values["optimizer.weight_decay"]
    out["weight_decay"] = _clean(wd.scaled)
    wd_rule = wd.rule if decoupled else (f"L2 in the gradient ({a['opt']}): part of the loss, unchanged"
                                         if family else "no known rule: unchanged")
    values["weight_decay"] = Scaled(a["weight_decay"], out["weight_decay"], "decay", wd_rule)
    if family == "rmsprop":
        alpha = rules.beta_linear(0.9, kappa)
        warnings.append("RMSProp's alpha (timm's default 0.9) is an EMA counted in steps: "
                        + (f"pass --opt-kwargs alpha={_clean(alpha)} (1 − κ(1 − α))" if 0.0 <= alpha < 1.0 else
                           f"1 − κ(1 − α) = {alpha:g} leaves [0, 1) beyond κ=10, so no alpha keeps its horizon "
                           f"at κ={kappa:g}; the Adam/RMSProp rule holds up to κ=10 for this alpha"))
    ema = core.values["ema.momentum"]
    out["model_ema_decay"] = _clean(ema.scaled)
    values["model_ema_decay"] = Scaled(a["model_ema_decay"], out["model_ema_decay"], "momentum",
                                       ema.rule + ("" if a["model_ema"] else " (model_ema is off in this file)"))
    if a["model_ema"] and a["model_ema_warmup"]:
        warnings.append("model_ema_warmup: ModelEmaV3's warm-up counts optimizer steps, so at κ it lasts κ× "
                        "more samples; no args.yaml key changes that (see docs/integrations.md)")
    for key in EPOCH_KEYS:
        if a.get(key) is not None:
            values[key] = Scaled(a[key], a[key], "epochs", "epoch-counted: unchanged")
    for key in BATCH_COUNTED:
        if a.get(key):
            out[key] = rules.steps(a[key], kappa)
            values[key] = Scaled(a[key], out[key], "batches", "batch-counted: N̂ = N / κ")
    if a.get("train_batch_sizes"):
        warnings.append("train_batch_sizes (scheduled resolutions) is set: scale each batch by κ and each "
                        "learning rate by its rule yourself; only batch_size is scaled here")
    # A default the file left out is written only when the rules changed it.
    out = {k: v for k, v in out.items() if k in args or v != DEFAULTS.get(k)}
    return Plan(name, kappa, ema_rule, values, warnings + core.warnings), out


def write(out: dict, path: Path) -> None:
    """The scaled args.yaml, as train.py dumps it, written to a temporary name and renamed."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--out {path} is a folder; give a file name such as {path / 'args.yaml'}")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: folder {path.parent} does not exist; create it first")
    text = yaml.safe_dump(out, default_flow_style=False)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; a run's args.yaml is for everyone to read, as train.py's
        os.replace(tmp, path)
    except OSError as e:  # named by the user's path, not the temporary one beside it
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise UserError(f"--out {path}: cannot write it ({e.strerror or e}); pass a path you can write to") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
