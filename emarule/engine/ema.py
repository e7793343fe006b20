"""The model EMA ζ ← ρ ζ + (1 − ρ) θ (the paper's Definition 1.1), fast and scaling-aware.

Reference with examples: docs/model-ema.md.

- Shadow weights and floating buffers are kept in float32 (`dtype`) even when the model holds
  bfloat16 weights: 1 − ρ̂ is far below bfloat16's resolution for the momenta the paper uses. A
  float64 model keeps a float64 shadow unless `dtype` says otherwise: the default never lowers
  precision. A `dtype` given explicitly holds the floating buffers too, so that the averaged model
  runs in it. Complex tensors are averaged in their own dtype.
- The update is one `torch._foreach_lerp_` per (device, dtype) group: ζ.lerp_(θ, 1 − ρ).
  lerp keeps ζ's rounding error proportional to the step (1 − ρ)(θ − ζ), whereas
  ζ·ρ + θ·(1 − ρ) adds an error of order eps·|ζ| at every update, which with ρ near 1 is
  of the same size as the update itself.
- With `base_batch_size` B (the batch at which ρ was tuned) the EMA scales itself: an update
  after ΔS more samples applies ρ(t)^(ΔS/B), the EMA Scaling Rule, where ρ(t) is the momentum
  schedule read at the base batch (constant, timm's warm-up, BYOL's/DINO's cosine ramp to 1).
  ΔS comes from a global clock: `samples_seen` (all ranks, all micro-batches, EDM2's way) or
  `batch_size` per call, or both, checked against each other. Updating every N calls raises ρ
  to the samples actually seen in between. Without `base_batch_size` the momentum is used as
  given (the training engine's use: it sets the plan's ρ̂ per stage, so ρ is raised to κ once,
  in the plan, never again here).
- Parameters are paired with the model's by name and re-paired whenever the model's tensors
  change (`load_state_dict(assign=True)`, a new model of the same architecture).
- A model wrapped in DistributedDataParallel, DataParallel or torch.compile is unwrapped. A
  model sharded with FSDP2 (`fully_shard`, DTensor parameters) gets a shard-local shadow.

Which θ is averaged (spec `ema.update_from`) is the training loop's choice: "post" (BYOL, DINO)
calls `update` after `optimizer.step()`, averaging θ_{t+1}; "pre" (the paper's Definition) calls
it before the step, once the gradients are computed, which averages θ_t without a snapshot copy.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)
BUFFER_MODES = ("copy", "average")
SCHEDULES = ("constant", "cosine")
CAST_BYTES = 1 << 28  # a bf16 model's tensors are cast for the update in parts of at most 256 MiB
SETTINGS = ("momentum", "base_batch_size", "buffers", "dtype", "start_samples", "warmup_power", "warmup_gamma",
            "schedule", "total_samples", "every")


def unwrap(model: nn.Module) -> nn.Module:
    """The module that owns the parameters: a wrapper's state_dict keys carry a `module.` prefix
    and a deep copy of DDP would copy its process group along."""
    while True:
        # torch.compile's wrapper holds the original as the submodule `_orig_mod`; looking it up in
        # _modules avoids nn.Module.__getattr__'s exception on every update of a plain model.
        inner = model.module if isinstance(model, WRAPPERS) else model._modules.get("_orig_mod")
        if inner is None:
            return model
        model = inner


def _number(name: str, value, *, low: float = 0.0, strict: bool = True, optional: bool = False) -> float | None:
    """A finite real > low (≥ low unless strict); a bool or a string is refused, not converted. A
    one-element tensor counts as its value (a clock summed with all_reduce is one)."""
    if value is None and optional:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        value = value.item()
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    if not (math.isfinite(v) and (v > low if strict else v >= low)):
        kind = "" if ok else f" (a {type(value).__name__})"
        raise ValueError(f"{name} must be a finite number {'>' if strict else '≥'} {low:g}, got {value!r}{kind}")
    return v


def _momentum(value, name: str = "momentum", *, allow_one: bool = False) -> float:
    m = _number(name, value, strict=False)
    if m > 1.0 or (m == 1.0 and not allow_one):
        fix = ("ρ = 1 never moves the EMA (and ρ^κ stays 1); give ρ in [0, 1)" if m == 1.0
               else "give ρ in [0, 1)")
        raise ValueError(f"{name} {value!r} is not a usable EMA momentum: {fix}")
    return m


def _dtype(value) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"dtype {value!r} is not a shadow dtype: use one of {', '.join(DTYPES)} (or the torch dtype)")


def _device(value) -> torch.device | None:
    """The device the shadow is kept on, refused here when torch cannot name or reach it."""
    if value is None:
        return None
    if not isinstance(value, (str, torch.device, int)) or isinstance(value, bool):
        raise TypeError(f"device must be a torch.device or its name ('cpu', 'cuda:0'), got {type(value).__name__}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"device {value!r} is not a device torch knows: give 'cpu', 'cuda', 'cuda:N' or a "
                         f"torch.device") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device {value!r}: no such CUDA device here ({torch.cuda.device_count()} visible); give "
                         f"'cpu' or a visible GPU")
    if device.type == "meta":  # holds no values: the EMA would average nothing
        raise ValueError(f"device {value!r} holds no data, so the EMA would average nothing: give 'cpu' or a GPU")
    return device


def _module(model, what: str) -> nn.Module:
    """`model` unwrapped, or a TypeError naming what was given instead (a state_dict is the usual mistake)."""
    if not isinstance(model, nn.Module):
        hint = " (a state_dict: pass the model itself)" if isinstance(model, Mapping) else ""
        raise TypeError(f"{what}: model must be the nn.Module whose weights are averaged, got "
                        f"{type(model).__name__}{hint}")
    return unwrap(model)


class StateMismatch(ValueError, RuntimeError):
    """A state that is not this EMA's: a ValueError for the API's callers, a RuntimeError as torch's
    load_state_dict raises for the same problem."""


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value or value < 0 \
            or float(value) != int(value):
        raise StateMismatch(f"the saved EMA state's {name} must be a whole number ≥ 0, got {value!r}; load a "
                            f"state_dict() that an EMA saved")
    return int(value)


def _saved_clock(state) -> dict:
    """The clock of a saved extra state, checked in full before any of it is applied."""
    if not isinstance(state, Mapping):
        raise StateMismatch(f"the saved EMA state (_extra_state) must be a dict, got {type(state).__name__}; load a "
                            f"state_dict() that an EMA saved")
    try:
        seen = _number("samples_seen", state.get("samples_seen"), strict=False, optional=True)
        pending = _number("pending", state.get("pending", 0.0), strict=False)
    except ValueError as e:
        raise StateMismatch(f"the saved EMA state's {e}; load a state_dict() that an EMA saved") from None
    given = state.get("dtype_given")
    if given is not None and not isinstance(given, bool):
        raise StateMismatch(f"the saved EMA state's dtype_given must be True or False, got {given!r}")
    return {"samples_seen": seen, "pending": pending, "calls": _count("calls", state.get("calls", 0)),
            "updates": _count("updates", state.get("updates", 0)), "dtype_given": given}


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _local(t: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds of an FSDP2 (DTensor) parameter; any other tensor as is."""
    return t.to_local() if _is_dtensor(t) else t


class _Names:
    """Whether a tensor's name is one of `names` or inside one of them (a module's name covers its
    tensors). A class, not a closure, so that an EMA can be pickled (`torch.save(ema)`)."""

    def __init__(self, names: tuple):
        self.names = names

    def __call__(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self.names)


class _AnyName:
    """A tied tensor is excluded when any of its names is (named_parameters() gives only the first)."""

    def __init__(self, test: Callable[[str], bool], aliases: dict):
        self.test, self.aliases = test, aliases

    def __call__(self, name: str) -> bool:
        return any(self.test(n) for n in self.aliases.get(name, (name,)))


def _aliases(module: nn.Module) -> dict:
    """Each tied tensor's first name → all its names, for the tensors that have more than one."""
    names: dict = {}
    for n, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), []).append(n)
    return {ns[0]: tuple(ns) for ns in names.values() if len(ns) > 1}


def _excluder(exclude) -> tuple[Callable[[str], bool], tuple]:
    """The test for a tensor's name, and the names given (each must match something)."""
    if exclude is None:
        return _Names(()), ()
    if callable(exclude):
        return exclude, ()
    if isinstance(exclude, str) or not isinstance(exclude, Iterable):
        raise ValueError(f"exclude must be a list of names or a function of the name, got {exclude!r}")
    names = tuple(exclude)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ValueError(f"exclude's names must be strings (a tensor's or module's dotted name), got {bad[0]!r}")
    return _Names(names), names


def _default_dtype(model: nn.Module) -> torch.dtype:
    """float32, or float64 for a model that holds float64 parameters: never below the model's precision."""
    wide = any(p.dtype == torch.float64 for p in model.parameters())
    return torch.float64 if wide else torch.float32


def _checked_settings(s: Mapping, saved: bool) -> dict:
    """Every setting checked and normalised. A `saved` momentum may be 1: set_momentum accepts it, and a state
    it wrote must load again."""
    base = _number("base_batch_size", s["base_batch_size"], optional=True)
    if s["buffers"] not in BUFFER_MODES:
        raise ValueError(f"buffers must be one of {', '.join(BUFFER_MODES)}, got {s['buffers']!r}")
    if s["schedule"] not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {s['schedule']!r}")
    power = _number("warmup_power", s["warmup_power"], optional=True)
    total = _number("total_samples", s["total_samples"], optional=True)
    if s["schedule"] == "cosine" and total is None:
        raise ValueError("schedule='cosine' ramps ρ to 1 over the run: give total_samples, the global samples "
                         "the run will see")
    if base is None and (power is not None or s["schedule"] != "constant"):
        raise ValueError("a momentum schedule counts steps at the base batch: give base_batch_size (your "
                         "batch, if you do not scale)")
    every = s["every"]
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"every must be a whole number of calls ≥ 1, got {every!r}")
    values = {"momentum": _momentum(s["momentum"], allow_one=saved), "base_batch_size": base,
              "dtype": _dtype(s["dtype"]),
              "start_samples": _number("start_samples", s["start_samples"], strict=False),
              "warmup_power": power, "warmup_gamma": _number("warmup_gamma", s["warmup_gamma"]),
              "schedule": s["schedule"], "total_samples": total, "every": int(every), "buffers": s["buffers"]}
    return values


class ModelEma(nn.Module):
    """EMA copy of `model`. Calling it runs the averaged model; `ema.module` is that model.

    `momentum` is ρ at `base_batch_size` when that is given (every update then raises the
    scheduled ρ to ΔS / base_batch_size); otherwise it is applied as is at every update.
    """

    def __init__(self, model: nn.Module, momentum: float, *, base_batch_size: float | None = None,
                 buffers: str = "copy", start_samples: float = 0, start_steps: float | None = None,
                 warmup_power: float | None = None, warmup_gamma: float = 1.0, schedule: str = "constant",
                 total_samples: float | None = None, every: int = 1, samples_seen: float = 0,
                 dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                 exclude: Iterable[str] | Callable[[str], bool] | None = None):
        super().__init__()
        _module(model, "ModelEma")
        device = _device(device)
        if start_steps is not None and start_samples != 0:
            raise ValueError("give start_steps (steps at the base batch) or start_samples, not both")
        # an explicit dtype is where the averaged model runs: BatchNorm's statistics must follow it
        self._dtype_given = dtype is not None
        if dtype is None:
            dtype = _default_dtype(unwrap(model))
        settings = {"momentum": momentum, "base_batch_size": base_batch_size, "buffers": buffers,
                    "dtype": dtype, "start_samples": start_samples, "warmup_power": warmup_power,
                    "warmup_gamma": warmup_gamma, "schedule": schedule, "total_samples": total_samples,
                    "every": every}
        if start_steps is not None:
            if base_batch_size is None:
                raise ValueError("start_steps counts steps at the base batch: give base_batch_size, "
                                 "or start_samples instead")
            settings["start_samples"] = _number("start_steps", start_steps, strict=False) * _number(
                "base_batch_size", base_batch_size)
        self._set(settings)  # everything checked before the copy is made
        if self.warmup_gamma != 1.0 and self.warmup_power is None:
            raise ValueError("warmup_gamma shapes timm's warm-up: give warmup_power too, or leave warmup_gamma out")
        if self.total_samples is not None and self.schedule == "constant":
            raise ValueError("total_samples is the length of the cosine ramp: give schedule='cosine' too, or leave "
                             "total_samples out")
        self._last = _number("samples_seen", samples_seen, strict=False)
        self._excluded, excluded_names = _excluder(exclude)
        source = unwrap(model)
        self._sharded = any(_is_dtensor(p) for p in source.parameters())
        if self._sharded:
            self.shards, self._kinds = _shard_shadow(source)
        else:
            shadow = copy.deepcopy(source)
            for p in shadow.parameters():
                p.requires_grad_(False)
                p.grad = None
            self.module = shadow.eval()
        aliases = {} if self._sharded else _aliases(self.module)
        if aliases:
            self._excluded = _AnyName(self._excluded, aliases)
        names = [a for n, _, _ in self._shadow() for a in aliases.get(n, (n,))]
        for n in excluded_names:
            if not any(map(_Names((n,)), names)):
                raise ValueError(f"exclude: the model has no parameter or buffer {n!r}")
        with torch.no_grad():
            self._cast()  # before a move, which reads the shadow's dtype back
            if device is not None:
                self._apply(lambda t: t.to(device))
        self._pending, self._calls, self.updates = 0.0, 0, 0
        self._sig: tuple | None = None
        self._mods: list = []
        self._shadow_mods: list = []
        self._groups: list = []
        self._copies: list = []
        self._copy_lists: tuple = ([], [])
        self._dicts: list = []
        self._watched: list = []
        self._shapes: list = []
        self.eval()

    # -- settings and state ----------------------------------------------------------------------

    def _set(self, s: Mapping, *, saved: bool = False) -> None:
        """Check every setting, then apply them all (nothing changes on bad input)."""
        for k, v in _checked_settings(s, saved).items():
            object.__setattr__(self, k, v)

    def settings(self) -> dict:
        return {k: _dtype_name(self.dtype) if k == "dtype" else getattr(self, k) for k in SETTINGS}

    def get_extra_state(self) -> dict:
        """Saved with the weights (also inside a parent's state_dict): the settings and the clock."""
        return {**self.settings(), "dtype_given": self._dtype_given, "samples_seen": self._last,
                "pending": self._pending, "calls": self._calls, "updates": self.updates}

    def set_extra_state(self, state: Mapping) -> None:
        """The saved settings win over the constructor's: buffers mode, dtype and clock included. All of it is
        checked before any of it is applied."""
        clock = _saved_clock(state)
        try:
            self._set({**self.settings(), **{k: state[k] for k in SETTINGS if k in state}}, saved=True)
        except ValueError as e:
            raise StateMismatch(f"the saved EMA state's {e}; load a state_dict() that an EMA saved") from None
        # a dict without the flag: a bfloat16 or float16 shadow can only have been asked for
        low = "dtype" in state and torch.finfo(self.dtype).bits < 32
        self._dtype_given = clock["dtype_given"] if clock["dtype_given"] is not None else (self._dtype_given or low)
        self._last = clock["samples_seen"]
        self._pending = clock["pending"]
        self._calls, self.updates = clock["calls"], clock["updates"]
        with torch.no_grad():
            self._cast()
        self._sig = None

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """Also reads the engine's checkpoint form {"module": weights, settings...}, older dicts (no
        dtype or clock; an `updates` counter) and the whole state_dict() of timm's ModelEmaV2 or
        ModelEmaV3 (the same `module.` keys, no settings: this EMA's own are kept, with no clock)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict takes the dict that state_dict() or checkpoint() returned, got "
                            f"{type(state_dict).__name__}")
        if isinstance(state_dict.get("module"), Mapping):
            state_dict = self._flat(state_dict)
        elif "_extra_state" not in state_dict and self._whole_foreign(state_dict):
            state_dict = {**state_dict, "_extra_state": {"samples_seen": None}}
        self._check_fits(state_dict, strict)
        if "_extra_state" in state_dict:
            self._check_settings(state_dict["_extra_state"])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _check_settings(self, state) -> None:
        """What set_extra_state would refuse, refused before torch copies a single tensor."""
        _saved_clock(state)
        try:
            _checked_settings({**self.settings(), **{k: state[k] for k in SETTINGS if k in state}}, saved=True)
        except ValueError as e:
            raise StateMismatch(f"the saved EMA state's {e}; load a state_dict() that an EMA saved") from None

    def _check_fits(self, state_dict: Mapping, strict: bool) -> None:
        """torch loads every tensor that fits before it raises for the rest: checked first, so that a refused
        load leaves this EMA's weights, settings and clock as they were."""
        ours = {k: v for k, v in self.state_dict(keep_vars=True).items() if not k.endswith("_extra_state")}
        theirs = {k: v for k, v in state_dict.items() if not k.endswith("_extra_state")}
        def few(kind: str, names: list) -> str:
            return f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"

        problems = []
        if strict:
            missing, unexpected = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
            problems += [few("missing", missing)] if missing else []
            problems += [few("unexpected", unexpected)] if unexpected else []
        if not self._sharded:
            shapes = [k for k in sorted(set(ours) & set(theirs)) if torch.is_tensor(theirs[k])
                      and torch.is_tensor(ours[k]) and theirs[k].shape != ours[k].shape]
            problems += [few("of another shape", shapes)] if shapes else []
        foreign = sorted(k for k in theirs if k in ours and not torch.is_tensor(theirs[k]))
        problems += [few("not tensors", foreign)] if foreign else []
        if problems:
            raise StateMismatch(f"this state_dict is not this EMA's model: {'; '.join(problems)}; nothing was loaded "
                               f"(load one saved from an EMA of the same model, or pass strict=False to skip the "
                               f"missing and unexpected keys)")

    def _whole_foreign(self, state_dict: Mapping) -> bool:
        """A dict of this EMA's every `module.` key and nothing of its own (timm's): a partial load
        (strict=False) is not one, and keeps the clock."""
        ours = {k for k in self.state_dict() if k != "_extra_state"}
        return bool(ours) and ours <= set(state_dict)

    def _flat(self, nested: Mapping) -> dict:
        if self._sharded:
            raise ValueError("this EMA holds a shard-local shadow (FSDP2): load its own state_dict(), not a "
                             "{'module': ...} checkpoint of an unsharded model")
        extra = {k: v for k, v in nested.items() if k != "module"}
        # an older dict has no clock: an update in rule mode then needs batch_size to know ΔS
        extra.setdefault("samples_seen", None)
        return {**{f"module.{k}": v for k, v in nested["module"].items()}, "_extra_state": extra}

    def checkpoint(self) -> dict:
        """{"module": the averaged model's state_dict, settings..., clock...}: the engine's checkpoint form."""
        if self._sharded:
            raise ValueError("this EMA holds a shard-local shadow (FSDP2): save its state_dict() per rank")
        return {"module": self.module.state_dict(), **self.get_extra_state()}

    def _cast(self) -> None:
        """Floating parameters and averaged buffers in self.dtype; copied buffers too when dtype was
        given, else those of a lower precision (BatchNorm's statistics must have its weights' dtype for
        the averaged model to run); integer buffers untouched; complex tensors in their own dtype."""
        wide = torch.finfo(self.dtype).bits
        for _, t, is_param in self._shadow():
            if t.dtype == torch.complex32:  # lerp has no complex32 kernel
                t.data = t.data.to(torch.complex64)
            if not t.is_floating_point() or t.dtype == self.dtype:
                continue
            # under the default dtype a copied buffer is only widened: a float64 one keeps its precision
            if is_param or self.buffers == "average" or self._dtype_given or torch.finfo(t.dtype).bits < wide:
                t.data = t.data.to(self.dtype)

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._sig = None  # `.to()` moved or cast the shadow: pair again
        self._sync_dtype()
        return out

    def train(self, mode: bool = True):
        """A parent's train() leaves the averaged model in eval mode (use ema.module.train() to change
        it); eval() puts it back in eval mode, as it does every submodule."""
        self.training = mode
        if not mode and not self.__dict__.get("_sharded"):
            self.module.eval()
        return self

    # -- the averaged model ------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        if name == "module" and self.__dict__.get("_sharded"):
            raise AttributeError("this EMA averages an FSDP2-sharded model and holds only this rank's shards: "
                                 "evaluate with `with ema.swap_into(model): model(x)`")
        return super().__getattr__(name)

    def _shadow(self) -> Iterator[tuple[str, torch.Tensor, bool]]:
        """(name, shadow tensor, is a parameter) in the model's order."""
        if self.__dict__.get("_sharded"):
            for key, t in self.shards.named_buffers():
                name = key.replace("/", ".")
                yield name, t, self._kinds[name]
            return
        for name, p in self.module.named_parameters():
            yield name, p, True
        for name, b in self.module.named_buffers():
            yield name, b, False

    @contextlib.contextmanager
    def swap_into(self, model: nn.Module):
        """Evaluate with the EMA's model in `model` (sharded or not); its own tensors come back after.

        Every tensor of the shadow goes in, the copied ones too (BatchNorm's statistics, excluded
        tensors, integer buffers): the model's own may have moved since the last update, or belong to
        another model than the one the EMA was loaded for."""
        self._pair(_module(model, "swap_into"))
        pairs = [(e, _local(s)) for _, es, ss in self._groups for e, s in zip(es, ss, strict=True)]
        pairs += [(e, _local(s)) for e, s in self._copies]
        with torch.no_grad():
            saved = [(s, s.clone()) for _, s in pairs]
        try:
            with torch.no_grad():
                for e, s in pairs:
                    s.copy_(e)
            yield model
        finally:
            with torch.no_grad():
                for s, keep in saved:
                    s.copy_(keep)

    apply_to = swap_into

    # -- the momentum path (the engine's and yours) --------------------------------------------------

    def set_momentum(self, momentum: float) -> None:
        """ρ̂ for the current κ (Progressive Scaling calls this whenever κ changes); with
        base_batch_size, the base ρ that updates raise to ΔS / base_batch_size. Unlike the
        constructor it accepts 1: a later stage's ρ̂ = ρ^κ can round to 1 (the plan warns)."""
        object.__setattr__(self, "momentum", _momentum(momentum, allow_one=True))

    def scheduled(self, samples_seen: float) -> float:
        """ρ(t) at the base batch after `samples_seen` global samples (warm-up, then the ramp)."""
        rho = self.momentum
        if self.schedule == "cosine":
            f = min(max(samples_seen / self.total_samples, 0.0), 1.0)
            rho = 1.0 - (1.0 - rho) * (math.cos(math.pi * f) + 1.0) / 2.0
        if self.warmup_power is not None:
            steps = max(samples_seen - self.start_samples, 0.0) / self.base_batch_size
            rho = min(rho, 1.0 - (1.0 + steps / self.warmup_gamma) ** -self.warmup_power)
        return rho

    def momentum_at(self, samples_seen: float | None = None, batch_size: float | None = None,
                    momentum: float | None = None) -> float:
        """The ρ an update with these arguments would apply now (0 means a copy); changes nothing."""
        return self._step(samples_seen, batch_size, momentum)[0]

    def _step(self, samples_seen, batch_size, momentum) -> tuple:
        """(ρ, S after, due): the whole momentum path, checked before anything changes."""
        s = _number("samples_seen", samples_seen, strict=False, optional=True)
        b = _number("batch_size", batch_size, optional=True)
        m = None if momentum is None else _momentum(momentum, allow_one=True)
        due = (self._calls + 1) % self.every == 0  # the next call is due to average
        pending = self._pending + (b or 0.0)
        delta = None
        if s is not None and self._last is not None:
            delta = s - self._last
            if delta <= 0:
                raise ValueError(f"samples_seen must grow from one update to the next (it was {self._last:g}, now "
                                 f"{s:g}): pass the global samples seen after this step, all ranks and micro-batches")
            if b is not None and due and abs(delta - pending) > 1e-6 * max(delta, 1.0):
                over = f" over {self.every} calls" if self.every > 1 else ""
                raise ValueError(f"samples_seen grew by {delta:g} since the last update but batch_size adds up to "
                                 f"{pending:g}{over}: both must count the global batch (all ranks, all "
                                 f"micro-batches)")
        elif b is not None:
            delta = pending
            if s is None:
                s = None if self._last is None else self._last + pending
        if not due:
            return 1.0, s, False
        if s is not None and s <= self.start_samples:
            return 0.0, s, True
        if self.base_batch_size is None:
            return (self.momentum if m is None else m), s, True
        if delta is None:
            if s is not None:  # self._last is None: a dict without a clock was loaded
                raise ValueError("this EMA has no clock to measure samples_seen from (it was loaded from a dict "
                                 "without one): pass this update's global batch_size=B with samples_seen=S once; "
                                 "later updates need only samples_seen")
            raise ValueError(f"this EMA scales ρ with the batch (base_batch_size={self.base_batch_size:g}): pass "
                             f"update(model, samples_seen=S) with S the global samples seen, or batch_size=B")
        if m is None:
            if s is None and (self.schedule != "constant" or self.warmup_power is not None):
                raise ValueError("a momentum schedule needs the clock (the global samples seen): pass "
                                 "samples_seen=S, with batch_size=B too while this EMA has no clock yet")
            m = self.momentum if s is None else self.scheduled(s)
        return m ** (delta / self.base_batch_size), s, True

    # -- the update --------------------------------------------------------------------------------

    def _pair(self, source: nn.Module) -> None:
        """Pair shadow and model tensors by name, once per set of tensors on either side; group by
        (device, dtype)."""
        if (self._sig is not None and self._signature(source) == self._sig and self._groups_hold()
                and self._shapes_hold()):
            return
        self._sync_dtype()
        params, bufs = list(source.named_parameters()), list(source.named_buffers())
        src = {**{n: (t, True) for n, t in params}, **{n: (t, False) for n, t in bufs}}
        groups: dict = {}
        copies, watched = [], []
        seen = set()
        for name, e, is_param in self._shadow():
            kind = "parameter" if is_param else "buffer"
            if name not in src or src[name][1] != is_param:
                raise ValueError(f"the model has no {kind} {name!r}, which this EMA averages: update from the model "
                                 f"the EMA was built from")
            s = src[name][0]
            if tuple(_local(s).shape) != tuple(e.shape):
                raise ValueError(f"{kind} {name!r} has shape {tuple(_local(s).shape)} in the model but "
                                 f"{tuple(e.shape)} in the EMA: build the EMA from this model")
            seen.add(name)
            watched.append(s)
            if ((e.is_floating_point() or e.is_complex()) and (is_param or self.buffers == "average")
                    and not self._excluded(name)):
                g = groups.setdefault((e.device, e.dtype), ([], []))
                g[0].append(e)
                g[1].append(s)
            else:
                copies.append((e, s))
        extra = [n for n in src if n not in seen]
        if extra:
            raise ValueError(f"the model has {extra[0]!r}, which the EMA does not: build the EMA from this model")
        self._groups = [(key, es, ss) for key, (es, ss) in groups.items()]
        self._copies = copies
        self._copy_lists = ([e for e, _ in copies], [x for _, x in copies])  # one foreach copy a step
        self._watched, self._shapes = watched, list(map(torch.Tensor.size, watched))
        self._mods = list(source.modules())
        self._shadow_mods = list((self.shards if self._sharded else self.module).modules())
        self._dicts = [d for m in (*self._mods, *self._shadow_mods) for d in (m._parameters, m._buffers, m._modules)]
        self._sig = self._signature(source)

    def _signature(self, source: nn.Module) -> tuple:
        """Which tensors and submodules the model and the shadow hold now (assign=True or a new
        submodule on either side changes it). Read from the modules' own dicts, listed when paired, and
        iterated in C: a tenth of source.parameters()'s cost on a ResNet-50, and about a third of a step's
        bookkeeping on a small one."""
        return (id(source), *map(id, chain.from_iterable(map(dict.values, self._dicts))))

    def _shapes_hold(self) -> bool:
        """The model's tensors keep the shapes they were paired with: `p.data = t` keeps the Parameter
        (and the signature), and lerp_ or copy_ would broadcast a smaller t into the shadow. One size()
        per tensor: about a quarter of the signature's cost on a ResNet-50."""
        return list(map(torch.Tensor.size, self._watched)) == self._shapes

    def _groups_hold(self) -> bool:
        """Each group's shadow tensors still have its device and dtype (`ema.module.double()` casts
        in place, keeping the Parameter objects the signature reads)."""
        return all(es[0].device == dev and es[0].dtype == dt for (dev, dt), es, _ in self._groups)

    def _sync_dtype(self) -> None:
        dtypes = [t.dtype for _, t, p in self._shadow() if p and t.is_floating_point()]
        if dtypes and dtypes[0] in DTYPES.values():
            object.__setattr__(self, "dtype", dtypes[0])

    @torch.no_grad()
    def update(self, model: nn.Module, *args, samples_seen: float | None = None, batch_size: float | None = None,
               momentum: float | None = None) -> float:
        """One EMA step from `model`; returns the momentum used (0: a copy; 1: a call skipped by `every`).

        samples_seen: the GLOBAL samples seen after this step (all ranks, all micro-batches); each
        update infers its batch from the change since the previous one. batch_size: the global batch
        of this call (checked against samples_seen when both are given). momentum: this update's ρ
        at the base batch (a schedule of your own); the rule still raises it to ΔS / base_batch_size.
        """
        if args:
            raise TypeError("update() takes its clock by keyword: update(model, samples_seen=S) with S the global "
                            "samples seen, or update(model, batch_size=B); a positional value (timm passes a step) "
                            "is not read as samples")
        source = _module(model, "update")
        rho, s, due = self._step(samples_seen, batch_size, momentum)
        if not due:
            self._calls += 1
            self._pending += float(batch_size or 0.0)
            return 1.0
        self._pair(source)  # raises on a model that does not match, before anything changes
        self._calls += 1
        if rho == 0.0:
            self._copy()
        else:
            for (dev, dt), es, ss in self._groups if rho != 1.0 else ():
                ss = [_local(x) for x in ss] if self._sharded else ss
                for es_part, ss_part in _cast_parts(es, ss, dev, dt):
                    torch._foreach_lerp_(es_part, ss_part, 1.0 - rho)
            if self._sharded:
                for e, x in self._copies:
                    e.copy_(_local(x))
            elif self._copies:
                torch._foreach_copy_(*self._copy_lists)
        if s is not None:
            self._last = s
        self._pending, self.updates = 0.0, self.updates + 1
        return rho

    @torch.no_grad()
    def copy_from(self, model: nn.Module) -> None:
        """ζ ← θ (before accumulation starts, or to reset)."""
        self._pair(_module(model, "copy_from"))
        self._copy()

    def _copy(self) -> None:
        for _, es, ss in self._groups:
            for e, s in zip(es, ss, strict=True):
                e.copy_(_local(s))
        for e, s in self._copies:
            e.copy_(_local(s))

    def __getstate__(self) -> dict:
        """A deep copy or pickle of the EMA must not carry the model's tensors along: pair again after."""
        state = self.__dict__.copy()
        state.update(_sig=None, _mods=[], _shadow_mods=[], _dicts=[], _groups=[], _copies=[], _copy_lists=([], []),
                     _watched=[], _shapes=[])
        return state

    def __setstate__(self, state: dict) -> None:
        # an EMA pickled by an emarule without these attributes: its buffers only ever widened
        super().__setstate__({"_dtype_given": False, "_watched": [], "_shapes": [], "_dicts": [],
                              "_copy_lists": ([], []), **state})

    def extra_repr(self) -> str:
        base = "" if self.base_batch_size is None else f", base_batch_size={self.base_batch_size:g}"
        return f"momentum={self.momentum}{base}, buffers={self.buffers}, dtype={_dtype_name(self.dtype)}"


def _cast_parts(es: list, ss: list, dev: torch.device, dt: torch.dtype) -> Iterator[tuple[list, list]]:
    """The group's (shadow, model) tensors in parts whose casts to the shadow's device and dtype hold at
    most CAST_BYTES between them (one tensor alone may hold more). lerp needs one device and dtype, and a
    temporary cast of a bf16 model is cheaper than losing the update to bf16 rounding in the shadow; cast
    all at once, a large bf16 model would need its whole size again in float32 at the peak."""
    if all(x.device == dev and x.dtype == dt for x in ss):
        yield es, ss
        return
    start, held, cast = 0, 0, []
    for i, x in enumerate(ss):
        size = 0 if x.device == dev and x.dtype == dt else x.numel() * dt.itemsize
        if held + size > CAST_BYTES and i > start:
            yield es[start:i], cast
            cast.clear()  # the caller is done with this part: free its copies before the next is made
            start, held = i, 0
        cast.append(x if size == 0 else x.to(dev, dt))
        held += size
    yield es[start:], cast


def _shard_shadow(source: nn.Module) -> tuple[nn.Module, dict]:
    """FSDP2 cannot be deep-copied: keep this rank's shard of every parameter (and the buffers) as
    plain tensors, named like the model's with '/' for '.' (a buffer name cannot hold a dot)."""
    holder, kinds = nn.Module(), {}
    with torch.no_grad():
        for name, p in source.named_parameters():
            holder.register_buffer(name.replace(".", "/"), _local(p).detach().clone())
            kinds[name] = True
        for name, b in source.named_buffers():
            holder.register_buffer(name.replace(".", "/"), b.detach().clone())
            kinds[name] = False
    return holder, kinds
