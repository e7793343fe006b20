"""The one entry point: a validated spec and κ in, every hyperparameter base → scaled out.

Each value is reported with the rule that produced it, so `emarule plan`, the run's
`hparams.json` and the training loop all read the same numbers.
"""

from __future__ import annotations

import math
from decimal import Decimal
from dataclasses import asdict, dataclass, field
from typing import Any

from emarule.errors import ScalingError
from emarule.config.schema import get as _get
from emarule.config.schema import value as spec_value
from emarule.scaling import rules
from emarule.scaling.limits import round_to
from emarule.scaling.progressive import RAMPS, BatchSchedule, Stage, whole_multiple

EMA_RULES = ("exponential", "linear")
SQRT_OPTIMIZERS = ("rmsprop", "adam", "adamw")
# torch's Adam and RMSprop add λθ to the gradient before the preconditioner: an L2 term of the loss, which the
# SDE rules keep fixed. The Weight Decay Scaling Rule (κηλ/η̂) is for decay θ ← θ − ηλθ (SGD, AdamW, LARS, LAMB).
L2_OPTIMIZERS = ("adam", "rmsprop")
SEEN = "(a run counts N × B of data seen)"  # the engine's clock: a step-counted key is never rounded there


@dataclass(frozen=True)
class Scaled:
    base: Any
    scaled: Any
    unit: str
    rule: str


@dataclass
class Plan:
    experiment: str
    kappa: float
    ema_rule: str | None
    values: dict[str, Scaled]
    warnings: list[str] = field(default_factory=list)
    stages: list[tuple[Stage, "Plan"]] | None = None
    progressive: dict | None = None  # the schedule in force (None: constant κ, or the spec's skipped)
    # With stages, `values` are the last stage's: a step count there is N / κ at the final κ alone, while a run
    # reaches N base steps' data (N × B) through every stage, at another optimizer step.

    def __getitem__(self, name: str) -> Any:
        """The scaled value of a dotted hyperparameter name."""
        try:
            return self.values[name].scaled
        except KeyError:
            raise KeyError(f"{name!r} is not in this plan; it holds {', '.join(self.values)} (plan.get(name) "
                           f"returns None for a missing one)") from None

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v.scaled

    def for_kappa(self, kappa: float) -> "Plan":
        """The plan of the stage running at `kappa` (this plan itself at its own κ)."""
        if math.isclose(kappa, self.kappa, rel_tol=1e-12):
            return self
        for stage, p in self.stages or ():
            if math.isclose(kappa, stage.kappa, rel_tol=1e-12):
                return p
        raise ScalingError(f"no stage of this plan runs at κ={kappa:g}")

    def at(self, t: float) -> "Plan":
        """The plan of the stage in force at time `t` on the stages' axis (epochs or base steps): the one stage
        lookup, used by the training loop and by `emarule.plan_at`. On the epoch axis a stage holds whole epochs
        (Algorithm 1), so t is taken at ⌊t⌋; past the scheduled end the final κ stays in force."""
        if not self.stages:
            return self
        t = math.floor(t + 1e-9) if self.stages[0][0].axis == "epochs" else t + 1e-9
        for stage, stage_plan in self.stages:
            if t < stage.end_epoch:
                return stage_plan
        return self.stages[-1][1]

    def as_dict(self) -> dict:
        out = {
            "experiment": self.experiment,
            "kappa": self.kappa,
            "ema_rule": self.ema_rule is not None,
            "ema_rule_form": self.ema_rule,
            "hyperparameters": {k: _clean(asdict(v)) for k, v in self.values.items()},
            "warnings": list(self.warnings),
            "progressive": self.progressive,
        }
        if self.stages is not None:
            out["stages"] = [
                {"start_epoch": s.start_epoch, "end_epoch": s.end_epoch, "batch_size": s.batch_size,
                 "kappa": s.kappa, "hyperparameters": {k: _clean(asdict(v)) for k, v in p.values.items()}}
                for s, p in self.stages
            ]
        return out


def _clean(x: Any) -> Any:
    """Round away float noise (0.40000000000000013 → 0.4) in what is written out, at 12 digits."""
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


def _linear_range(name: str, what: str, x: float, kappa: float, v: float, of: str = "") -> str | None:
    """Why 1 − κ(1 − x) = v is no momentum (outside [0, 1)), naming the κ that works, or None."""
    if 0.0 <= v < 1.0:
        return None
    if v >= 1.0:
        # 1 − κ(1 − x), rounded once, reads as 1 while κ(1 − x) ≤ 2^-54 (half a step of float64 below 1); twice
        # a whole step, 2^-52, stays below 1 with room for the 3 digits the message prints
        least = 2.0**-52 / (1.0 - x)
        return (f"{name}: {what}{of} rounds to 1 at κ={kappa:.10g} (κ(1 − {x:g}) = {kappa * (1.0 - x):.3g} is below "
                f"float64's resolution): the average would never move; use κ ≥ {least:.3g}")
    most = float(1 / (1 - Decimal(repr(float(x)))))
    return f"{name}: {what} = {v:.6g} at κ={kappa:.10g}{of}, outside [0, 1); the largest valid κ is {most:.6g}"


def ema_momentum(rho: float, kappa: float, ema_rule: str | None, name: str = "ema.momentum") -> Scaled:
    """ρ̂ under the chosen form of the EMA Scaling Rule, or ρ unchanged for the baseline."""
    rules.check_unit_interval(name, rho)
    if ema_rule is None:
        return Scaled(rho, rho, "momentum", "no EMA rule (baseline): ρ̂ = ρ")
    if ema_rule == "exponential":
        return Scaled(rho, rules.ema_exponential(rho, kappa), "momentum", "EMA Scaling Rule: ρ̂ = ρ^κ")
    if ema_rule == "linear":
        v = rules.linear(rho, kappa)
        err = _linear_range(name, "the linear EMA rule 1 − κ(1 − ρ)", rho, kappa, v)
        if err:
            raise ScalingError(err + ("" if v >= 1.0 else ", or use --ema-rule exponential"))
        return Scaled(rho, v, "momentum", "linear EMA rule: ρ̂ = 1 − κ(1 − ρ)")
    raise ScalingError(f"unknown EMA rule {ema_rule!r}; use exponential or linear")


def extra_ema_name(rho: float) -> str:
    """A further EMA is named by its base momentum: `ema_momentum/0.9999`, `ema_wer/0.9999`."""
    return f"{rho:.10g}"


def _optimizer(spec: dict, kappa: float, out: dict[str, Scaled]) -> None:
    opt = spec.get("optimizer") or {}  # an API dict may hold `optimizer: None`
    name = opt.get("name", "sgd")
    lr = opt.get("lr")
    if name in ("sgd", "lars"):
        lr_rule, lr_fn = ("SGD Scaling Rule: η̂ = κη" if name == "sgd"
                          else "linear: η̂ = κη (LARS: no SDE guarantee)"), rules.lr_linear
    elif name in SQRT_OPTIMIZERS:
        lr_rule, lr_fn = f"{'RMSProp' if name == 'rmsprop' else 'Adam'} Scaling Rule: η̂ = √κ η", rules.lr_sqrt
    elif name == "lamb":
        lr_rule, lr_fn = "square root: η̂ = √κ η (LAMB: empirical, no SDE guarantee)", rules.lr_sqrt
    else:
        lr_rule, lr_fn = "no optimizer rule: unchanged", (lambda v, k: v)
    if lr is not None:
        out["optimizer.lr"] = Scaled(lr, lr_fn(lr, kappa), "learning rate", lr_rule)
    min_lr = _get(spec, "schedule.min_lr")
    if min_lr is not None:
        out["schedule.min_lr"] = Scaled(min_lr, lr_fn(min_lr, kappa), "learning rate", lr_rule)
    if opt.get("momentum") is not None and name in ("sgd", "lars"):
        out["optimizer.momentum"] = Scaled(opt["momentum"], opt["momentum"], "momentum",
                                           "heavy-ball momentum: unchanged under the SGD Scaling Rule")
    elif opt.get("momentum") and name == "rmsprop":
        out["optimizer.momentum"] = Scaled(opt["momentum"], opt["momentum"], "momentum",
                                           "unchanged: the RMSProp Scaling Rule is derived without heavy-ball "
                                           "momentum, so none is known for it")
    adaptive = name in SQRT_OPTIMIZERS
    beta_names = ([("optimizer.alpha", opt.get("alpha"))] if name == "rmsprop"
                  else [("optimizer.betas", opt.get("betas"))])
    for key, betas in beta_names:
        if betas is None:
            continue
        seq = betas if isinstance(betas, list) else [betas]
        scaled, failed = [], []
        for i, b in enumerate(seq):
            label = f"{key}[{i}]" if isinstance(betas, list) else key
            rules.check_unit_interval(label, b)
            if not adaptive:
                scaled.append(b)
                continue
            v = rules.linear(b, kappa)
            err = _linear_range(label, "1 − κ(1 − β)", b, kappa, v, f" for β={b}")
            if err:
                failed.append((b, v, err))
            scaled.append(v)
        if failed:
            # the β whose bound binds: the largest β needs the largest κ to move; the smallest allows the least κ
            # before it goes negative, so the κ the message names works for every β
            b, v, err = max(failed) if failed[0][1] >= 1.0 else min(failed)
            raise ScalingError(err)
        rule = "Adam/RMSProp Scaling Rule: β̂ = 1 − κ(1 − β)" if adaptive else f"unchanged ({name}: no known rule)"
        out[key] = Scaled(betas, scaled if isinstance(betas, list) else scaled[0], "momentum", rule)
    if opt.get("eps") is not None:
        if adaptive:
            out["optimizer.eps"] = Scaled(opt["eps"], rules.eps_sqrt(opt["eps"], kappa), "epsilon",
                                          "Adam/RMSProp Scaling Rule: ε̂ = ε / √κ")
        else:
            out["optimizer.eps"] = Scaled(opt["eps"], opt["eps"], "epsilon", f"unchanged ({name}: no known rule)")
    wd = opt.get("weight_decay")
    if wd is not None:
        kind = opt.get("weight_decay_rule", "none")
        if kind == "none":
            v, rule = wd, "none: λ̂ = λ (as the recipe states)"
        elif kind == "auto" and name in L2_OPTIMIZERS:
            v, rule = wd, f"Weight Decay Scaling Rule: L2 in the gradient ({name}), part of the loss: λ̂ = λ"
        elif kind == "auto":
            # η/η̂ is the lr rule's, whatever η is: a spec without an lr (or with lr 0) still scales its decay
            v, rule = rules.wd_auto(wd, kappa, 1.0, lr_fn(1.0, kappa)), "Weight Decay Scaling Rule: λ̂ = κηλ / η̂"
        elif kind == "linear":
            v, rule = rules.wd_linear(wd, kappa), "linear: λ̂ = κλ"
        elif kind == "sqrt":
            v, rule = rules.wd_sqrt(wd, kappa), "square root: λ̂ = √κ λ"
        else:
            if wd >= 1.0:
                raise ScalingError(f"optimizer.weight_decay: uncoupled decay needs λ < 1, got {wd}")
            v, rule = rules.wd_uncoupled(wd, kappa), "uncoupled decay: λ̂ = 1 − (1 − λ)^κ"
        out["optimizer.weight_decay"] = Scaled(wd, v, "decay", rule)
    if opt.get("grad_clip") is not None:
        out["optimizer.grad_clip"] = Scaled(opt["grad_clip"], opt["grad_clip"], "gradient norm",
                                            "unchanged (a norm of the mean gradient)")


def _durations(prefix: str, tree: Any, kappa: float, out: dict[str, Scaled]) -> None:
    """Every `*_steps` key is divided by κ; every `*epochs` key is unchanged (Appendix C.1)."""
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            _durations(path, value, kappa, out)
        elif value is None or isinstance(value, bool):
            continue
        elif key.endswith("_steps") and isinstance(value, (int, float)):
            n = rules.steps(value, kappa, path)
            exact = value / kappa
            rule = "step-counted: N̂ = N / κ"
            if exact != n:
                # the engine never rounds: it counts N base steps as N × B of data seen
                rule += f" = {exact:.6g}, rounded {SEEN}"
            out[path] = Scaled(value, n, "steps", rule)
        elif key.endswith("epochs") and isinstance(value, (int, float, list)):
            out[path] = Scaled(value, value, "epochs", "epoch-counted: unchanged")


def _secondary(spec, kappa, ema_rule, out) -> None:
    """BatchNorm statistics and DINO's center: EMAs left unscaled unless the spec asks."""
    for key, flag, torch_key in (("norm.bn_momentum", "norm.bn_scale", "norm.bn_torch_momentum"),
                                 ("dino.center_momentum", "dino.center_scale", None)):
        rho = _get(spec, key)
        if rho is None:
            continue
        if spec_value(spec, flag) and ema_rule is not None:
            s = ema_momentum(rho, kappa, ema_rule, key)
        else:
            why = "set " + flag + "=true to scale it" if ema_rule is not None else "no EMA rule"
            s = Scaled(rho, rho, "momentum", f"unchanged, as in the paper ({why})")
        out[key] = s
        if torch_key:
            out[torch_key] = Scaled(1 - rho, 1 - s.scaled, "torch momentum",
                                    "torch BatchNorm momentum = 1 − ρ_BN")


def _warn_rounding(spec: dict, values: dict[str, Scaled], warnings: list[str]) -> None:
    # The paper keeps weights and EMA in float32 under bf16 autocast; ema.dtype says otherwise.
    dtype = spec_value(spec, "ema.dtype")
    for key in ("ema.momentum", "norm.bn_momentum", "dino.center_momentum"):
        if key not in values:
            continue
        v, base = values[key].scaled, values[key].base
        r = round_to(v, dtype)
        if r == 1.0:
            # ρ^κ grows towards 1 as κ shrinks: the fix is a larger κ (or a wider dtype, if there is one)
            wider = "keep it in float32 or " if dtype != "float32" else ""
            warnings.append(f"{key} = {v:.8g} rounds to 1.0 in {dtype} (ema.dtype): the EMA would "
                            f"never move; {wider}use a larger κ (see `emarule limits`)")
        elif base != 0.0 and round_to(1.0 - v, dtype) == 1.0:
            # past limits' κ_max 1 − ρ̂ rounds to 1 and the update keeps nothing of the average, long before ρ̂ itself
            # underflows to 0
            if r == 0.0:
                how = f"= {v:.3g} rounds to 0.0 in {dtype} (ema.dtype)" if v else f"scales from {base:g} to 0"
            else:
                how = f"= {v:.3g}: 1 − ρ̂ rounds to 1.0 in {dtype} (ema.dtype)"
            warnings.append(f"{key} {how}: the EMA is a plain copy of the model; use a smaller κ (see `emarule "
                            f"limits`)")


def _check_finite(kappa: float, values: dict[str, Scaled]) -> None:
    """A scaled value past float64's range (inf, or nan from inf/inf) is no hyperparameter: refused here, so
    nothing prints `Infinity` as JSON or trains with it."""
    for name, s in values.items():
        for v in s.scaled if isinstance(s.scaled, list) else [s.scaled]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ScalingError(f"{name}: {_short(s.base)} scales to {v} at κ={kappa:g} ({s.rule}), past float64's "
                                   f"range; use a κ (or a base value) that keeps it finite")


def _short(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else repr(x)


def scale(spec: dict, kappa: float, ema_rule: str | None = "exponential") -> Plan:
    """Every hyperparameter of `spec` (written at batch.size) scaled to batch κ·batch.size."""
    kappa = rules.check_kappa(kappa)
    if ema_rule is not None and ema_rule not in EMA_RULES:
        raise ScalingError(f"unknown EMA rule {ema_rule!r}; use exponential or linear")
    values: dict[str, Scaled] = {}
    batch = spec["batch"]["size"]
    unit = spec_value(spec, "batch.unit")
    scaled = batch * kappa
    if unit == "samples" and math.isfinite(scaled) and math.isclose(scaled, round(scaled), rel_tol=1e-12, abs_tol=0):
        scaled = float(round(scaled))  # κ = N/B from a batch size N: B·κ can land one ulp below N
    values["batch_size"] = Scaled(batch, scaled, unit, "B̂ = κB")
    if not math.isfinite(batch * kappa):
        raise ScalingError("batch size overflowed; use a smaller κ")
    _optimizer(spec, kappa, values)
    if _get(spec, "ema.momentum") is not None:
        values["ema.momentum"] = ema_momentum(spec["ema"]["momentum"], kappa, ema_rule)
        for i, rho in enumerate(spec_value(spec, "ema.also")):
            name = f"ema.momentum/{extra_ema_name(rho)}"
            if name in values or extra_ema_name(rho) == extra_ema_name(spec["ema"]["momentum"]):
                # EMAs are named (and logged) by their momentum: a repeat would silently be one EMA
                raise ScalingError(f"ema.also[{i}]: {rho:.10g} is already kept (ema.momentum or an earlier "
                                   f"ema.also); list each further EMA's momentum once")
            values[name] = ema_momentum(rho, kappa, ema_rule, f"ema.also[{i}]")
    _secondary(spec, kappa, ema_rule, values)
    _durations("", {k: v for k, v in spec.items() if k not in ("presets", "progressive")}, kappa, values)
    _check_finite(kappa, values)
    warnings: list[str] = []
    _warn_rounding(spec, values, warnings)
    if unit == "samples" and not float(scaled).is_integer():
        warnings.append(f"κ={kappa:g} gives a batch of {scaled:g} samples (κ × {batch:g}), which `emarule run` "
                        f"refuses; choose κ so that κB is a whole number, or pass --batch-size N")
    return Plan(spec.get("name", "?"), kappa, ema_rule, values, warnings)


def kappa_from(spec: dict, kappa: float | None, batch_size: float | None) -> float:
    """κ from `--kappa` or from `--batch-size` (in the spec's batch unit)."""
    if kappa is not None and batch_size is not None:
        raise ScalingError("give --kappa or --batch-size, not both")
    if batch_size is not None:
        b = rules.check_kappa(batch_size)  # same checks: finite, > 0
        return b / spec["batch"]["size"]
    return rules.check_kappa(1.0 if kappa is None else kappa)


def _momentum_after_transition(spec: dict, final: Plan) -> None:
    """`ema.momentum_after_transition`: the main EMA's ρ in every stage after the first, as written.

    App. H (Fig. "BYOL ViT-B/16 ... for different momenta ρ") steps from B = 4096 to 24,576 at
    epoch 60 and trains on "without EMA scaling" for each ρ in {0.8 … 0.999}: the value is the
    literal ρ used at the new batch, not a base value to scale again, whatever the EMA rule.
    """
    rho = _get(spec, "ema.momentum_after_transition")
    if rho is None or _get(spec, "ema.momentum") is None:
        return
    if not final.stages[1:]:
        final.warnings.append("ema.momentum_after_transition has no effect: this schedule runs one stage (no "
                              "transition)")
        return
    rules.check_unit_interval("ema.momentum_after_transition", rho)
    s = Scaled(rho, rho, "momentum", "ema.momentum_after_transition: used as is after the first transition")
    for _, p in final.stages[1:]:
        p.values["ema.momentum"] = s
    if final.stages[1:]:
        final.values["ema.momentum"] = s  # the final plan is the last stage's (Plan.for_kappa)


def plan(spec: dict, kappa: float, ema_rule: str | None = "exponential",
         progressive: dict | None = None, batch_multiple: int = 1) -> Plan:
    """`scale` at the final κ, plus one plan per stage when Progressive Scaling is on.

    `batch_multiple`: what every ramp batch (smooth, incremental) must be a multiple of, a run's world size
    (1: whole samples); with the schedule's own `batch_multiple`, their least common multiple. Above 1 it is
    part of the schedule in force (`Plan.progressive`), so that the run records it."""
    final = scale(spec, kappa, ema_rule)
    prog = progressive if progressive is not None else spec.get("progressive")
    own_multiple = _get(spec, "progressive.batch_multiple")
    if progressive is not None and own_multiple is not None and prog.get("kind") in RAMPS:
        # the spec's batch_multiple (processes, not a shape of the schedule) holds for a command-line ramp too
        prog = {**prog, "batch_multiple": math.lcm(whole_multiple(own_multiple),
                                                   whole_multiple(prog.get("batch_multiple")))}
    if prog and "kind" not in prog:
        raise ScalingError("progressive: missing kind (constant, step, incremental or smooth)")
    if prog and progressive is None and final.kappa < 1 and prog.get("kind", "constant") != "constant":
        # The spec's own schedule grows the batch; scaling down runs at κ from the start.
        final.warnings.append(f"the spec's progressive {prog['kind']} schedule is skipped at κ={final.kappa:g} < 1")
        prog = None
    if prog and prog.get("kind") in RAMPS:
        # a batch in seconds of audio splits over any number of processes: the run's multiple is for samples
        run_multiple = whole_multiple(batch_multiple) if spec_value(spec, "batch.unit") == "samples" else 1
        multiple = math.lcm(whole_multiple(prog.get("batch_multiple")), run_multiple)
        if multiple > 1:
            prog = {**prog, "batch_multiple": multiple}
    if prog and prog.get("kind", "constant") != "constant":
        sched = BatchSchedule(prog, spec["batch"]["size"], final.kappa, _get(spec, "schedule.epochs"),
                              _get(spec, "schedule.total_steps"))
        final.progressive = dict(prog)
        final.stages = [(s, scale(spec, s.kappa, ema_rule)) for s in sched.stages()]
        _momentum_after_transition(spec, final)
        for _, p in final.stages:
            final.warnings.extend(w for w in p.warnings if w not in final.warnings)
    elif _get(spec, "ema.momentum_after_transition") is not None:
        final.warnings.append("ema.momentum_after_transition has no effect without Progressive Scaling "
                              "(no transition); add --progressive")
    return final
