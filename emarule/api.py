"""The Python API for your own training loop: the scaled recipe, and the plan in force as you go.

Torch-free, so it can run wherever a config is built. Every bad value raises `UserError` with
the one-line message `emarule plan` prints for the same problem: a spec is read and checked by
the loader and schema the CLI uses, and scaled by the same core. Only `kappa`, `batch_size`
and `samples_*` are checked here, because the CLI checks them as command-line text (and its
messages name the options, `--kappa`, which an API error must not).
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from emarule.errors import UserError, UserTypeError
from emarule.scaling import Plan, kappa_from
from emarule.scaling import plan as _plan
from emarule.scaling import progressive as _progressive
from emarule.config.schema import PROGRESSIVE, check_tree, get, schema_for
from emarule.config.load import load_spec, unregistered_task

YAML_SUFFIXES = (".yaml", ".yml")


def scale(spec: str | os.PathLike | Mapping, kappa: float | None = None, *, batch_size: float | None = None,
          ema_rule: str | None = "exponential", progressive: str | Mapping | None = None) -> Plan:
    """Every hyperparameter of `spec` scaled to κ (or to `batch_size`; κ=1 when neither is given).

    `spec`: an experiment name (`emarule list`), a YAML path (read as `--spec` reads it), or a
    dict holding only what you have; `batch.size` is the one key it needs.
    `ema_rule`: "exponential" (ρ^κ), "linear" (1 − κ(1 − ρ)) or None (ρ unchanged: the baseline).
    `progressive`: a schedule as on the command line ("step:30") or as a spec section (a dict);
    None keeps the spec's own. `plan["optimizer.lr"]` is a scaled value; `plan.values[name]`
    holds base, scaled, unit and rule; `plan.stages` the per-stage plans (see `plan_at`).
    """
    if kappa is not None and batch_size is not None:
        raise UserError("give kappa or batch_size, not both")
    if kappa is not None:
        kappa = _positive("kappa", kappa)
    if batch_size is not None:
        batch_size = _positive("batch_size", batch_size)
    try:
        s = _load(spec)
        k = kappa_from(s, kappa, batch_size)
        plan = _plan(s, k, ema_rule, _schedule(progressive))
    except UserError as e:
        raise _in_api_words(e) from None
    # the core words its warnings for the command line; here they are Python warnings, in the API's words
    for p in [plan] + [stage_plan for _, stage_plan in plan.stages or []]:
        p.warnings = [_api_text(w) for w in p.warnings]
    for w in plan.warnings:
        warnings.warn(w, UserWarning, stacklevel=2)
    return plan


# The core's messages name the CLI's options; an API caller passes arguments.
CLI_WORDS = {"--progressive": "progressive", "--ema-rule exponential": "ema_rule='exponential'",
             "--ema-rule": "ema_rule", "--kappa": "kappa", "--batch-size": "batch_size"}


def _api_text(text: str) -> str:
    for cli, api in CLI_WORDS.items():
        text = text.replace(cli, api)
    return text.replace("batch_size N", "batch_size=N")


def _in_api_words(e: UserError) -> UserError:
    return type(e)(_api_text(str(e)))


def plan_at(plan: Plan, samples_seen: float, samples_per_epoch: float | None = None, *,
            epoch: float | None = None) -> Plan:
    """The plan in force for the step that starts after `samples_seen` samples (in the batch unit).

    Progressive Scaling changes the batch at epoch boundaries (Algorithm 1), so on an epoch
    schedule the time is ⌊samples_seen / samples_per_epoch⌋ and `samples_per_epoch` (your
    training-set size) is needed; a schedule in base steps counts samples_seen / batch.size.
    `epoch`: the epoch your own loop is in, used instead of that quotient on an epoch schedule; pass it
    when an epoch sees fewer samples than the training set (a DataLoader with drop_last=True).
    The result's `["batch_size"]` is the batch to draw next and every other value is re-derived
    for its κ. A plan without stages (constant κ) is returned as is.
    """
    if not isinstance(plan, Plan):
        raise UserTypeError(f"plan must be the Plan that emarule.scale returns, got {type(plan).__name__}; pass "
                            f"plan_at(emarule.scale(spec, kappa), samples_seen)")
    seen = _real("samples_seen", samples_seen)
    if not 0 <= seen < math.inf:
        raise UserError(f"samples_seen must be finite and ≥ 0, got {samples_seen!r}")
    if samples_per_epoch is not None:
        samples_per_epoch = _positive("samples_per_epoch", samples_per_epoch)
    if epoch is not None:
        epoch = _real("epoch", epoch)
        if not 0 <= epoch < math.inf:
            raise UserError(f"epoch must be finite and ≥ 0, got {epoch!r}")
    if not plan.stages:
        return plan
    if getattr(plan.stages[0][0], "axis", "epochs") == "epochs":
        if epoch is not None:
            return plan.at(epoch)
        if samples_per_epoch is None:
            raise UserError("this plan's Progressive Scaling is scheduled in epochs; pass samples_per_epoch "
                            "(the size of your training set) or epoch")
        return plan.at(seen / samples_per_epoch)
    return plan.at(seen / plan.values["batch_size"].base)  # base steps: data seen in base batches


# -- helpers -------------------------------------------------------------------------------------


def _real(name: str, value: Any) -> float:
    """A number as a float: Python's, NumPy's, or a one-element tensor or array; anything else is refused by
    its type, and an integer beyond a float's range by its size."""
    v = value
    item = getattr(value, "item", None)
    if not isinstance(value, numbers.Real) and callable(item) and not isinstance(value, (str, bytes)):
        try:
            v = item()
        except (ValueError, RuntimeError, TypeError):  # more than one element
            v = None
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            raise UserError(f"{name} must be finite, got an integer of {len(str(v))} digits") from None
    raise UserTypeError(f"{name} must be a number, got {_short(value)} (a {type(value).__name__})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}…"


def _positive(name: str, value: Any) -> float:
    v = _real(name, value)
    if not 0 < v < math.inf:
        raise UserError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _load(spec: str | os.PathLike | Mapping) -> dict:
    if isinstance(spec, Mapping):
        return _from_dict(spec)
    if isinstance(spec, os.PathLike):
        return load_spec(path=spec)
    if isinstance(spec, str):
        looks_like_path = spec.endswith(YAML_SUFFIXES) or os.sep in spec or "/" in spec
        return load_spec(path=Path(spec)) if looks_like_path else load_spec(spec)
    raise UserTypeError(f"spec must be an experiment name, a YAML path or a dict, got {type(spec).__name__}")


def _plain(x: Any, where: str = "", inside: tuple = ()) -> Any:
    """Mappings to dicts, tuples to lists and NumPy scalars to Python's: the shapes the schema checks (torch
    writes betas as a tuple). A dict or list that holds itself is refused by the key where it does."""
    if isinstance(x, (Mapping, list, tuple)):
        if id(x) in inside:
            raise UserError(f"spec key {where or '(top)'} holds a dict or list it is itself inside (a loop); give "
                            f"a tree of plain values")
        inside = (*inside, id(x))
        if isinstance(x, Mapping):
            return {k: _plain(v, f"{where}.{k}" if where else str(k), inside) for k, v in x.items()}
        return [_plain(v, f"{where}[{i}]", inside) for i, v in enumerate(x)]
    if type(x).__module__ == "numpy" and callable(getattr(x, "item", None)) and getattr(x, "ndim", None) == 0:
        return x.item()
    return copy.deepcopy(x)


def _from_dict(d: Mapping) -> dict:
    """A practitioner's spec: checked by the experiments' schema, but only `batch.size` is required
    (no name, task or title). Errors read as the CLI's for a YAML file, without the file name."""
    spec = _plain(d)
    task = spec.get("task")
    err = check_tree("", spec, schema_for(task if isinstance(task, str) else None)) or unregistered_task(task)
    if err:
        raise UserError(err)
    if get(spec, "batch.size") is None:
        raise UserError("batch.size: missing; give the reference batch B at which the base values were tuned, "
                        "e.g. {'batch': {'size': 256}}")
    spec.pop("presets", None)
    return spec


def _schedule(progressive: str | Mapping | None) -> dict | None:
    if progressive is None:
        return None
    if isinstance(progressive, str):
        return _progressive.parse(progressive)
    if not isinstance(progressive, Mapping):
        raise UserTypeError(f"progressive must be a string such as 'step:30' or a dict, got "
                            f"{type(progressive).__name__}")
    sched = _plain(progressive)
    err = check_tree("progressive", sched, PROGRESSIVE)
    if err:
        raise UserError(err)
    return sched
