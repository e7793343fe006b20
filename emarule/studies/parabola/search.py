"""ρ* = argmin_ρ Err(ρ), Err(ρ) = max_t |Δ_t(ρ)|, searched in u = log₂(1 − ρ).

Err has kinks (where two peaks of |Δ| trade places or Δ changes sign) and, at small κ, a
minimum far narrower than its distance from ρ_B^κ, so neither a parabola fit nor a plain grid
serves. Each Δ_t(u) is smooth, however: after a coarse octave grid has bracketed the minimum,
Δ_t is interpolated on Chebyshev nodes across the bracket, the minimax is found on the
interpolant to ~1e-9 in u, and Err at that point is then evaluated for real. If it disagrees
with the interpolant, the bracket shrinks around the point and the nodes are redrawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Minimum:
    beta: float
    err: float
    resolution: float  # relative step in 1 − ρ of the last zoom on the interpolant
    mismatch: float  # |Err − interpolated Err| / Err at the returned point
    evaluations: int  # momenta for which Δ was computed

    @property
    def rho(self) -> float:
        return 1.0 - self.beta


def minimize_beta(delta: Callable[[np.ndarray], np.ndarray], beta_center: float, span: int = 4,
                  nodes: int = 17, rtol: float = 1e-4, moves: int = 4, shrinks: int = 4) -> Minimum:
    """delta maps β (R,) in (0, 1] to the signed differences Δ, shape (T, R)."""
    if not 0.0 < beta_center <= 1.0:
        raise ValueError(f"beta_center must be in (0, 1], got {beta_center}")
    calls = 0

    def err(us):
        nonlocal calls
        calls += len(us)
        return np.abs(delta(2.0 ** np.asarray(us))).max(axis=0)

    center = math.log2(beta_center)
    for _ in range(moves + 1):  # octave grid; it moves when the minimum sits on its edge
        us = center + np.arange(-span, span + 1, dtype=float)
        if us[-1] > 0.0:
            us = np.append(us[us < 0.0], 0.0)  # β = 1 (ρ = 0) closes the range
        errs = err(us)
        i = int(np.argmin(errs))
        if i == 0:
            center -= span
        elif i == us.size - 1 and us[-1] < 0.0:
            center += span
        else:
            break
    best_u, best_err = float(us[i]), float(errs[i])
    a, b = float(us[max(i - 1, 0)]), float(us[min(i + 1, us.size - 1)])
    resolution, mismatch = 1.0, math.inf
    for _ in range(shrinks + 1):
        knots = _chebyshev(a, b, nodes)
        values = delta(2.0**knots)  # (T, P)
        calls += nodes
        node_err = np.abs(values).max(axis=0)
        u_hat, e_hat, step = _minimax_on_interpolant(knots, values, a, b)
        e_true = float(err([u_hat])[0])
        k = int(np.argmin(node_err))
        if node_err[k] < best_err:
            best_u, best_err = float(knots[k]), float(node_err[k])
        if e_true <= best_err:
            best_u, best_err = u_hat, e_true
        mismatch = abs(e_true - e_hat) / max(e_true, 1e-300)
        resolution = step * math.log(2.0)
        if abs(e_true - e_hat) <= rtol * e_true + 1e-14 and best_u == u_hat:
            break
        half = (b - a) / 8
        a, b = max(best_u - half, a), min(best_u + half, b, 0.0)
    return Minimum(float(2.0**best_u), best_err, resolution, mismatch, calls)


def _chebyshev(a: float, b: float, n: int) -> np.ndarray:
    return np.sort((a + b) / 2 + (b - a) / 2 * np.cos(np.pi * np.arange(n) / (n - 1)))


def _interpolate(knots: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Barycentric interpolation on Chebyshev points of the second kind: (T, P) → (T, len(at))."""
    w = (-1.0) ** np.arange(knots.size)
    w[0] *= 0.5
    w[-1] *= 0.5
    diff = at[:, None] - knots[None, :]
    exact = diff == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        c = w / diff
    rows = exact.any(axis=1)
    c[rows] = exact[rows].astype(float)
    c /= c.sum(axis=1, keepdims=True)
    return values @ np.ascontiguousarray(c.T)


def _minimax_on_interpolant(knots, values, a, b, points: int = 257, zooms: int = 8):
    lo, hi = a, b
    for _ in range(zooms):
        grid = np.linspace(lo, hi, points)
        e = np.abs(_interpolate(knots, values, grid)).max(axis=0)
        j = int(np.argmin(e))
        step = grid[1] - grid[0]
        lo, hi = max(a, grid[j] - 2 * step), min(b, grid[j] + 2 * step)
    return float(grid[j]), float(e[j]), float(step)
