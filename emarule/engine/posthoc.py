"""Post-hoc EMA: track a few power-function EMAs, snapshot them, and after training reconstruct any EMA.

The idea is Karras et al. 2024 ("Analyzing and Improving the Training Dynamics of Diffusion Models",
§3 and App. C). A power-function EMA averages θ(τ) over [0, t] with weights ∝ τ^γ; its width relative
to t is σ_rel = sqrt((γ+1) / ((γ+2)² (γ+3))). Every EMA is a weighted sum of the weights seen so far,
so a target EMA whose weights are close to a linear combination of the snapshots' weights is that same
combination of the snapshots.

Here time is the GLOBAL samples seen, as in `ModelEma`: the profiles are in samples, so a target
(a σ_rel, or ρ at a base batch) means the same average at any batch, the EMA Scaling Rule. The fit is
exact for the discrete updates that took place: the tracker records the clock at every update, and
each EMA's weight on θ_k is computed from those times, not from a continuous approximation.

Reference with an example: docs/model-ema.md, "Post-hoc EMA".
"""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from emarule.engine.ema import ModelEma, StateMismatch, _module, _momentum, _number

MAX_SIGMA_REL = 1 / math.sqrt(12)  # γ = 0, the uniform average; narrower profiles have γ > 0


def gamma_of(sigma_rel: float) -> float:
    """The exponent γ ≥ 0 of the power-function profile of relative width `sigma_rel`."""
    s = _number("sigma_rel", sigma_rel)
    if s > MAX_SIGMA_REL:
        raise ValueError(f"sigma_rel must be in (0, {MAX_SIGMA_REL:.4f}] (the uniform average), got {sigma_rel!r}")
    # σ² (γ+2)² (γ+3) = γ + 1, a cubic in γ: its largest real root is the one ≥ 0
    roots = np.roots([s * s, 7 * s * s, 16 * s * s - 1, 12 * s * s - 1])
    return float(max(r.real for r in roots if abs(r.imag) < 1e-9 * max(1.0, abs(r))))


def _weights(times: np.ndarray, betas: np.ndarray) -> np.ndarray:
    """Weight on θ_0..θ_n of an EMA updated at times[1:] with momenta betas[1:] (θ_0: the start copy)."""
    after = np.append(np.cumprod(betas[:0:-1])[::-1], 1.0)  # ∏ of the betas after each update
    w = (1.0 - betas) * after
    w[0] = after[0]
    return w


def _power_betas(times: np.ndarray, gamma: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(times > 0, 1.0 - np.diff(times, prepend=times[0]) / times, 0.0)
    return np.clip(frac, 0.0, 1.0) ** (gamma + 1.0)


class PowerEma(nn.Module):
    """Power-function EMAs of `model` at each σ_rel in `sigma_rels`, snapshotted every `snapshot_every`
    global samples. Snapshots are kept in `self.snapshots`, or written to `snapshot_dir` (one file per
    snapshot time, written under a temporary name, then renamed)."""

    def __init__(self, model: nn.Module, sigma_rels: Sequence[float] = (0.05, 0.10), *, snapshot_every: float,
                 snapshot_dir: str | os.PathLike | None = None, samples_seen: float = 0,
                 dtype: torch.dtype | str | None = None, device: torch.device | str | None = None):
        super().__init__()
        _module(model, "PowerEma")
        if isinstance(sigma_rels, str | bytes) or not isinstance(sigma_rels, Iterable):
            raise ValueError(f"sigma_rels must be a list of relative widths, got {sigma_rels!r}")
        sigma_rels = list(sigma_rels)
        if not sigma_rels:
            raise ValueError("sigma_rels is empty: track at least one profile, e.g. (0.05, 0.10)")
        self.gammas = [gamma_of(s) for s in sigma_rels]  # checks each
        self.sigma_rels = [float(s) for s in sigma_rels]
        self.snapshot_every = _number("snapshot_every", snapshot_every)
        start = _number("samples_seen", samples_seen, strict=False)
        if snapshot_dir is not None and not isinstance(snapshot_dir, str | os.PathLike):
            raise TypeError(f"snapshot_dir must be a folder's path, got {type(snapshot_dir).__name__}")
        self.snapshot_dir = None if snapshot_dir is None else Path(snapshot_dir)
        if self.snapshot_dir is not None and not self.snapshot_dir.is_dir():
            raise ValueError(f"snapshot_dir {str(snapshot_dir)!r} is not a directory: create it first")
        # momentum is given per update (the power-function β); the clock is kept here
        if any(hasattr(p, "placements") for p in model.parameters()):
            raise ValueError("PowerEma does not take FSDP2-sharded models (snapshots hold whole weights): track "
                             "the EMA of the unsharded model, or use ModelEma")
        self.emas = nn.ModuleList(ModelEma(model, 0.0, dtype=dtype, device=device) for _ in self.gammas)
        self.times = [start]
        self.snapshots: list[dict] = []
        self._params = [n for n, _ in self.emas[0].module.named_parameters()]

    @property
    def samples_seen(self) -> float:
        return self.times[-1]

    def get_extra_state(self) -> dict:
        return {"sigma_rels": self.sigma_rels, "snapshot_every": self.snapshot_every, "times": list(self.times)}

    def set_extra_state(self, state: dict) -> None:
        self.snapshot_every, self.times = self._saved_settings(state)

    def _saved_settings(self, state) -> tuple[float, list[float]]:
        """(snapshot_every, times) of a saved state, every field checked before any is applied."""
        def bad(problem: str) -> StateMismatch:
            return StateMismatch(f"this PowerEma state {problem}; load a state_dict() that a PowerEma saved")

        if not isinstance(state, Mapping):
            raise bad(f"is a {type(state).__name__}, not the dict of its settings")
        missing = [k for k in ("sigma_rels", "snapshot_every", "times") if k not in state]
        if missing:
            raise bad(f"has no {', '.join(missing)}")
        try:
            saved = [_number("sigma_rels", v) for v in state["sigma_rels"]]
            every = _number("snapshot_every", state["snapshot_every"])
            times = [_number("times", t, strict=False) for t in state["times"]]
        except (ValueError, TypeError) as e:
            raise bad(f"holds a bad value: {e}") from None
        if saved != self.sigma_rels:
            raise ValueError(f"this state tracks sigma_rels {state['sigma_rels']}, not {self.sigma_rels}: build "
                             f"the PowerEma with the saved ones")
        if not times or any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise bad("has a clock (times) that does not grow")
        return every, times

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """Checked in full first (the settings, each profile's clock, every tensor's name and shape): a refused
        state leaves this tracker as it was."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict takes the dict that state_dict() returned, got "
                            f"{type(state_dict).__name__}")
        self._saved_settings(state_dict.get("_extra_state"))
        for i, ema in enumerate(self.emas):
            prefix = f"emas.{i}."
            ema._check_fits({k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}, strict)
            if prefix + "_extra_state" in state_dict:
                ema._check_settings(state_dict[prefix + "_extra_state"])
        if strict:
            prefixes = tuple(f"emas.{i}." for i in range(len(self.emas)))
            extra = [k for k in state_dict if k != "_extra_state" and not k.startswith(prefixes)]
            if extra:
                raise StateMismatch(f"this PowerEma state holds {extra[0]!r}, which a PowerEma has not; load a "
                                    f"state_dict() that a PowerEma of this model saved")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @torch.no_grad()
    def update(self, model: nn.Module, *, samples_seen: float | None = None, batch_size: float | None = None) -> None:
        """One update of every profile; `samples_seen`: the global samples seen after this step (or
        `batch_size`, the global batch, to advance the clock by it). Snapshots when a multiple of
        snapshot_every is passed."""
        last = self.times[-1]
        s = _number("samples_seen", samples_seen, strict=False, optional=True)
        b = _number("batch_size", batch_size, optional=True)
        if s is None and b is None:
            raise ValueError("PowerEma.update needs the clock: pass samples_seen=S (global samples seen) or "
                             "batch_size=B (the global batch)")
        if s is None:
            s = last + b
        if s <= last:
            raise ValueError(f"samples_seen must grow from one update to the next (it was {last:g}, now {s:g})")
        if b is not None and abs((s - last) - b) > 1e-6 * max(b, 1.0):
            raise ValueError(f"samples_seen grew by {s - last:g} but batch_size is {b:g}: both must count the "
                             f"global batch")
        for ema, gamma in zip(self.emas, self.gammas, strict=True):
            beta = (1.0 - (s - last) / s) ** (gamma + 1.0)
            ema.update(model, momentum=beta)
        self.times.append(s)
        if math.floor(s / self.snapshot_every) > math.floor(last / self.snapshot_every):
            self.snapshot()

    @torch.no_grad()
    def snapshot(self) -> list[dict]:
        """Snapshot every profile now (also done every snapshot_every samples); returns the snapshots."""
        times = torch.tensor(self.times, dtype=torch.float64)  # shared by this time's snapshots
        taken = [{"samples_seen": self.times[-1], "sigma_rel": sr, "gamma": g, "times": times,
                  "params": self._params,
                  "state": {k: v.detach().cpu().clone() for k, v in ema.module.state_dict().items()}}
                 for ema, sr, g in zip(self.emas, self.sigma_rels, self.gammas, strict=True)]
        if self.snapshot_dir is None:
            self.snapshots.extend(taken)
        else:
            path = self.snapshot_dir / f"phema-{self.times[-1]:020.3f}.pt"  # sorts by time
            fd, tmp = tempfile.mkstemp(dir=self.snapshot_dir, suffix=".tmp")
            os.close(fd)
            try:
                torch.save(taken, tmp)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return taken


    def reconstruct(self, **target) -> dict[str, torch.Tensor]:
        """`emarule.engine.posthoc.reconstruct` from this tracker's snapshots (in memory or in snapshot_dir)."""
        return reconstruct(self.snapshots if self.snapshot_dir is None else self.snapshot_dir, **target)


def load_snapshots(snapshot_dir: str | os.PathLike) -> list[dict]:
    """The snapshots a PowerEma wrote to `snapshot_dir` (tensors memory-mapped, read when used). A file that is
    not a PowerEma's snapshot (foreign, cut short) is refused by its name."""
    if not isinstance(snapshot_dir, str | os.PathLike):
        raise TypeError(f"snapshot_dir must be a folder's path, got {type(snapshot_dir).__name__}")
    folder = Path(snapshot_dir)
    if not folder.is_dir():
        raise ValueError(f"snapshot_dir {str(snapshot_dir)!r} is not a directory: pass the folder a PowerEma wrote "
                         f"its snapshots to")
    out = []
    for f in sorted(folder.glob("phema-*.pt")):
        if not f.is_file():
            raise ValueError(f"{f} is not a regular file: a PowerEma's snapshots are; move it out of {folder}")
        try:
            taken = torch.load(f, mmap=True, weights_only=True)
        except Exception:  # torch's errors for a damaged file are of many kinds, and name zip serialization
            raise ValueError(f"{f} cannot be read as a PowerEma snapshot (cut short, damaged, or not written by "
                             f"PowerEma); move it out of {folder}") from None
        if not isinstance(taken, list):
            raise ValueError(f"{f} is not a PowerEma snapshot (it holds a {type(taken).__name__}, not a list of "
                             f"snapshots); move it out of {folder}")
        for snap in taken:
            _check_snapshot(snap, str(f))
        out += taken
    return out


SNAPSHOT_KEYS = {"samples_seen": numbers.Real, "sigma_rel": numbers.Real, "gamma": numbers.Real,
                 "times": torch.Tensor, "params": list, "state": Mapping}


def _check_snapshot(snap, where: str) -> None:
    """A snapshot as PowerEma.snapshot makes it, or a ValueError naming `where` it came from."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"{where}: {problem}; reconstruct from the snapshots a PowerEma took")

    if not isinstance(snap, Mapping):
        raise bad(f"a snapshot is a {type(snap).__name__}, not a dict")
    for key, kind in SNAPSHOT_KEYS.items():
        if not isinstance(snap.get(key), kind if key != "times" else (torch.Tensor, np.ndarray, list)):
            raise bad(f"a snapshot's {key!r} is missing or a {type(snap.get(key)).__name__}")
    if not all(torch.is_tensor(v) for v in snap["state"].values()):
        raise bad("a snapshot's state holds values that are not tensors")


def _same_model(snapshots: Sequence[dict]) -> None:
    """Every snapshot holds the same tensors (names and shapes): a mix of two models has no combination."""
    first = {k: tuple(v.shape) for k, v in snapshots[0]["state"].items()}
    for snap in snapshots[1:]:
        shapes = {k: tuple(v.shape) for k, v in snap["state"].items()}
        if shapes != first:
            diff = sorted(set(first) ^ set(shapes)) or sorted(k for k in first if first[k] != shapes[k])
            raise ValueError(f"the snapshots are of different models (they differ at {diff[0]!r}): reconstruct "
                             f"from one model's snapshots")


def solve(snapshots: Sequence[dict], *, sigma_rel: float | None = None, momentum: float | None = None,
          base_batch_size: float | None = None, at: float | None = None) -> tuple[np.ndarray, float, list[dict]]:
    """(coefficients, relative error, the snapshots used): the least-squares combination of the snapshots
    taken up to `at` (default: the last) whose weights on θ_0..θ_n come closest to the target's. The
    target is a power-function EMA of width `sigma_rel`, or the exponential EMA of momentum ρ =
    `momentum` tuned at `base_batch_size` (each update applies ρ^(ΔS / base_batch_size))."""
    if (sigma_rel is None) == (momentum is None):
        raise ValueError("give the target as exactly one of sigma_rel=σ (power function) or momentum=ρ with "
                         "base_batch_size=B (exponential)")
    if momentum is not None:
        rho = _momentum(momentum)
        if base_batch_size is None:
            raise ValueError("momentum=ρ needs base_batch_size=B, the global batch ρ was tuned at: the snapshots "
                             "are in samples")
        base = _number("base_batch_size", base_batch_size)
    else:
        gamma = gamma_of(sigma_rel)
    if isinstance(snapshots, str | bytes | Mapping) or not isinstance(snapshots, Iterable):
        raise TypeError(f"snapshots must be a list of a PowerEma's snapshots, got {type(snapshots).__name__}")
    snapshots = list(snapshots)
    if not snapshots:
        raise ValueError("no snapshots: train with a PowerEma (snapshot_every=N samples) before reconstructing")
    for i, snap in enumerate(snapshots):
        _check_snapshot(snap, f"snapshots[{i}]")
    _same_model(snapshots)
    last = max(s["samples_seen"] for s in snapshots)
    t_end = last if at is None else _number("at", at, strict=False)
    used = [s for s in snapshots if s["samples_seen"] <= t_end]
    if t_end > last or not used:
        raise ValueError(f"at={t_end:g} samples is outside the snapshots (taken from "
                         f"{min(s['samples_seen'] for s in snapshots):g} to {last:g} samples): pick a time in that "
                         f"range")
    times = np.asarray(max(used, key=lambda s: len(s["times"]))["times"], dtype=np.float64).copy()
    times = times[times <= t_end]
    if times[-1] != t_end:
        raise ValueError(f"at={t_end:g} is not a time the tracker updated at: give a snapshot's samples_seen")
    if momentum is not None:
        target = _weights(times, rho ** (np.diff(times, prepend=times[0]) / base))
    else:
        target = _weights(times, _power_betas(times, gamma))
    columns = []
    for snap in used:
        t = times[: len(snap["times"])]
        if len(t) != len(snap["times"]) or not np.allclose(t, np.asarray(snap["times"], dtype=np.float64)):
            raise ValueError("the snapshots come from different runs (their clocks differ): reconstruct from one "
                             "run's snapshots")
        columns.append(np.pad(_weights(t, _power_betas(t, snap["gamma"])), (0, len(times) - len(t))))
    a = np.stack(columns, axis=1)
    # the L2 distance between profiles in samples: θ_k stands for Δ_k samples
    gaps = np.diff(times, prepend=times[0])
    gaps[0] = gaps[1] if len(gaps) > 1 else 1.0
    scale = 1.0 / np.sqrt(gaps)
    coef, *_ = np.linalg.lstsq(a * scale[:, None], target * scale, rcond=None)
    error = float(np.linalg.norm((a @ coef - target) * scale) / np.linalg.norm(target * scale))
    return coef, error, used


def reconstruct(snapshots: Sequence[dict] | str | os.PathLike, *, sigma_rel: float | None = None,
                momentum: float | None = None, base_batch_size: float | None = None, at: float | None = None,
                max_error: float = 0.02) -> dict[str, torch.Tensor]:
    """The model state_dict of the target EMA (see `solve`) at `at` samples, from a PowerEma's snapshots
    (a list, or the snapshot_dir). Refused when the snapshots reproduce the target's profile only to a
    relative error above `max_error`. Buffers come from the latest snapshot used."""
    limit = _number("max_error", max_error)
    if isinstance(snapshots, str | os.PathLike):
        snapshots = load_snapshots(snapshots)
    coef, error, used = solve(snapshots, sigma_rel=sigma_rel, momentum=momentum, base_batch_size=base_batch_size,
                              at=at)
    if error > limit:
        target = f"sigma_rel={sigma_rel}" if sigma_rel is not None else f"momentum={momentum} at {base_batch_size:g}"
        raise ValueError(f"the snapshots reproduce the profile of {target} only to a relative error of {error:.3g} "
                         f"(> max_error={limit:g}): track a σ_rel closer to it, snapshot more often, or pick a "
                         f"time when the target's horizon is within the tracked ones")
    latest = max(used, key=lambda s: s["samples_seen"])
    out = {}
    for name, value in latest["state"].items():
        if name in latest["params"] and value.is_floating_point():
            acc = sum(float(c) * s["state"][name].double() for c, s in zip(coef, used, strict=True))
            out[name] = acc.to(value.dtype)
        else:
            out[name] = value.clone()
    return out
