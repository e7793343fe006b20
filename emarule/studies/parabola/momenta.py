"""The EMA ζ_{k+1} = ρ ζ_k + (1 − ρ) x_k of many paths, for many momenta at once.

Two conventions for x: "pre" averages θ_k (the paper's Definition: ζ is updated from the
parameters the gradient was taken at), "post" averages θ_{k+1} (BYOL, DINO and most code,
which update the EMA after the optimizer step). ζ_0 = θ_0 in both.

ζ is linear in the θ path, so one simulated path serves every candidate momentum. Over a block
of L steps ζ_{m+L} = ρ^L ζ_m + Σ_j (1 − ρ) ρ^{L−1−j} x_{m+j}; `StridedEMA` forms only every
L-th ζ, and gets the block sums for any ρ from a few moments of each block computed once (see
there), so a search over ρ reads the paths once rather than once per candidate.
"""

from __future__ import annotations

import math

import numpy as np

CONVENTIONS = ("pre", "post")


def inputs(theta: np.ndarray, convention: str) -> np.ndarray:
    """The sequence the EMA averages, from θ_0..θ_n along the last axis."""
    if convention == "pre":
        return theta[..., :-1]
    if convention == "post":
        return theta[..., 1:]
    raise ValueError(convention)


def ema_path(x: np.ndarray, zeta0: np.ndarray, rhos) -> np.ndarray:
    """Every ζ_0..ζ_n, shape (paths, n + 1, R), by the plain recursion (small inputs, references)."""
    rhos = np.atleast_1d(np.asarray(rhos, dtype=np.float64))
    out = np.empty((x.shape[1] + 1, x.shape[0], rhos.size))
    out[0] = zeta0[:, None]
    for k in range(x.shape[1]):
        out[k + 1] = rhos * out[k] + (1.0 - rhos) * x[:, k, None]
    return out.transpose(1, 0, 2)


def mean_norm(values: np.ndarray, dim: int, axis: int = 0) -> np.ndarray:
    """E‖v‖ over seeds, with paths laid out seed-major (seed·D + coordinate) along `axis`."""
    v = np.moveaxis(values, axis, 0)
    return _norms(v, dim).mean(axis=0)


def _norms(v: np.ndarray, dim: int) -> np.ndarray:
    """‖·‖ over each seed's D consecutive rows: (seeds·D, ...) → (seeds, ...)."""
    seeds, rest = v.shape[0] // dim, v.shape[1:]
    if dim == 1:
        return np.abs(v)
    flat = v.reshape(seeds, dim, -1)  # one trailing axis: einsum's fastest path here
    return np.sqrt(np.einsum("sdk,sdk->sk", flat, flat)).reshape(seeds, *rest)


def recurrence(init: np.ndarray, terms: np.ndarray, decay: np.ndarray) -> np.ndarray:
    """out[:, 0] = init, out[:, t+1] = decay·out[:, t] + terms[:, t], along axis 1.

    init (P, R), terms (P, T, R), decay (R,) → (P, T + 1, R); `terms` is overwritten. Where
    decay^−T stays far from overflow this is out_t = decay^t (init + Σ_{i<t} decay^−(i+1) terms_i),
    one cumulative sum in C; the other momenta take a Python loop over t.
    """
    p, t, r = terms.shape
    out = np.empty((p, t + 1, r))
    out[:, 0] = init
    grow, shrink, fast = _scales(decay, t)
    if fast.all():
        terms *= grow
        np.cumsum(terms, axis=1, out=out[:, 1:])
        out[:, 1:] += init[:, None, :]
        out[:, 1:] *= shrink
        return out
    if fast.any():
        acc = np.cumsum(terms[:, :, fast] * grow, axis=1)
        acc += init[:, None, fast]
        out[:, 1:, fast] = acc * shrink
    for col in np.flatnonzero(~fast):
        d = decay[col]
        for i in range(t):
            out[:, i + 1, col] = d * out[:, i, col] + terms[:, i, col]
    return out


def _scales(decay: np.ndarray, t: int):
    """decay^−(i+1) and decay^(i+1) for i < t, for the momenta where e^(λt) ≤ e^300."""
    with np.errstate(divide="ignore"):
        lam = -np.log(decay)
    fast = lam * t <= 300.0
    k = np.arange(1, t + 1)[:, None] * lam[fast]
    return np.exp(k), np.exp(-k), fast


def _chunks(paths: int, dim: int, per_path: int, budget: int = 2**20):
    """Slices of whole seeds holding about `budget` float64s each, so one chunk's work stays in cache."""
    seeds = paths // dim
    step = max(1, budget // max(1, dim * per_path))
    for s0 in range(0, seeds, step):
        yield slice(s0 * dim, min(seeds, s0 + step) * dim)


def mean_norm_ema(theta: np.ndarray, dim: int, rhos, convention: str, at: np.ndarray | None = None) -> np.ndarray:
    """E‖ζ_k‖ over seeds at every step k = 0..n, shape (n + 1, R); with `at`, only at those steps
    (the rows elsewhere are NaN), which spares the norms where nobody looks.

    ζ_k = ρ^k A_k with A_k = ζ_0 + Σ_{j<k} (1 − ρ) ρ^−(j+1) x_j, a cumulative sum; ρ^k is common
    to the D coordinates of a seed, so it scales the norm after the sum of squares, and each
    chunk of paths is read three times in all.
    """
    rhos = np.atleast_1d(np.asarray(rhos, dtype=np.float64))
    x = inputs(theta, convention)
    paths, n = x.shape
    seeds = paths // dim
    with np.errstate(divide="ignore"):
        lam = -np.log(rhos)
    # Squares of A reach e^(2λn): stay well inside float64 (e^709), else fall back to the loop.
    fast = lam * n <= 150.0
    steps = np.arange(n + 1) if at is None else np.asarray(at)
    total = np.zeros((steps.size, rhos.size))
    if fast.any():
        k = np.arange(n + 1)[:, None] * lam[fast]
        grow = np.exp(k[1:]) * (1.0 - rhos[fast])  # (1 − ρ) ρ^−(j+1)
        shrink = np.exp(-k[steps])
        for sl in _chunks(paths, dim, (n + 1) * int(fast.sum())):
            xc = x[sl]
            acc = np.empty((xc.shape[0], n + 1, grow.shape[1]))
            acc[:, 0] = theta[sl, :1]
            np.multiply(xc[:, :, None], grow, out=acc[:, 1:])
            np.cumsum(acc, axis=1, out=acc)
            picked = acc if at is None else acc[:, steps]
            total[:, fast] += _norms(picked, dim).sum(axis=0) * shrink
    for col in np.flatnonzero(~fast):
        for sl in _chunks(paths, dim, n + 1):
            zeta = recurrence(theta[sl, :1], x[sl, :, None] * (1.0 - rhos[col]), rhos[col:col + 1])
            total[:, col] += mean_norm(zeta[:, steps, 0], dim) * ((sl.stop - sl.start) // dim)
    if at is None:
        return total / seeds
    out = np.full((n + 1, rhos.size), np.nan)
    out[steps] = total / seeds
    return out


class StridedEMA:
    """ζ every L steps of fixed paths, for any set of momenta.

    Block sums from moments: with c = (L − 1)/2, u_j = (c − j)/c ∈ [−1, 1] and λ = −ln ρ,
        Σ_j (1 − ρ) ρ^{L−1−j} x_j = (1 − ρ) ρ^c Σ_p (−λc)^p / p! · μ_p,   μ_p = Σ_j u_j^p x_j,
    and the series truncated after `order` terms is exact to (λc)^order / order! relative.
    Momenta with λc above `max_lc` (far from 1) use the weights directly instead.
    """

    def __init__(self, theta: np.ndarray, dim: int, convention: str, stride: int, order: int = 14,
                 max_lc: float = 0.75):
        x = inputs(theta, convention)
        self.x, self.dim = x, dim
        self.paths, n = x.shape
        self.stride, self.order, self.max_lc = stride, order, max_lc
        self.m = m = n // stride
        self.zeta0 = theta[:, 0]
        self.c = c = (stride - 1) / 2
        self.factorials = np.array([float(math.factorial(k)) for k in range(order)])
        if stride > 1:
            u = (c - np.arange(stride)) / c
            basis = np.ascontiguousarray(u[:, None] ** np.arange(order)[None, :])  # (L, P)
            self.moments = np.empty((self.paths, m, order))
            for sl in _chunks(self.paths, dim, n):
                block = np.ascontiguousarray(x[sl, : m * stride]).reshape(-1, stride)
                self.moments[sl] = (block @ basis).reshape(-1, m, order)

    def _block_sums(self, sl: slice, rhos: np.ndarray) -> np.ndarray:
        rows = sl.stop - sl.start
        if self.stride == 1:
            return self.x[sl, : self.m, None] * (1.0 - rhos)
        out = np.empty((rows, self.m, rhos.size))
        with np.errstate(divide="ignore"):
            lam_c = -np.log(rhos) * self.c
        near = lam_c <= self.max_lc
        if near.any():
            p = np.arange(self.order)
            coef = (-lam_c[near, None]) ** p / self.factorials
            coef *= ((1.0 - rhos[near]) * rhos[near] ** self.c)[:, None]
            moments = self.moments[sl].reshape(-1, self.order)
            if near.all():  # the common case: straight into `out`, no fancy-index copy
                np.matmul(moments, np.ascontiguousarray(coef.T), out=out.reshape(-1, rhos.size))
                return out
            out[:, :, near] = (moments @ np.ascontiguousarray(coef.T)).reshape(rows, self.m, -1)
        if not near.all():
            far = rhos[~near]
            w = (1.0 - far)[:, None] * far[:, None] ** np.arange(self.stride - 1, -1, -1)[None, :]
            block = np.ascontiguousarray(self.x[sl, : self.m * self.stride]).reshape(-1, self.stride)
            out[:, :, ~near] = (block @ np.ascontiguousarray(w.T)).reshape(rows, self.m, -1)
        return out

    def zeta(self, rhos) -> np.ndarray:
        """ζ at steps 0, L, …, ML: shape (paths, M + 1, R)."""
        rhos = np.atleast_1d(np.asarray(rhos, dtype=np.float64))
        out = np.empty((self.paths, self.m + 1, rhos.size))
        for sl in _chunks(self.paths, self.dim, (self.m + 1) * rhos.size):
            out[sl] = self._zeta(sl, rhos)
        return out

    def _zeta(self, sl: slice, rhos: np.ndarray) -> np.ndarray:
        init = np.repeat(self.zeta0[sl, None], rhos.size, axis=1)
        return recurrence(init, self._block_sums(sl, rhos), rhos**self.stride)

    def mean_norm(self, rhos) -> np.ndarray:
        """E‖ζ‖ over seeds at steps 0, L, …, ML: shape (M + 1, R)."""
        rhos = np.atleast_1d(np.asarray(rhos, dtype=np.float64))
        total = np.zeros((self.m + 1, rhos.size))
        for sl in _chunks(self.paths, self.dim, (self.m + 1) * max(rhos.size, self.order)):
            total += mean_norm(self._zeta(sl, rhos), self.dim) * ((sl.stop - sl.start) // self.dim)
        return total / (self.paths // self.dim)


def exact_mean(theta0: float, q: float, rhos, n: int, convention: str) -> np.ndarray:
    """E ζ_j, j = 0..n, in D=1 where E θ_j = θ_0 q^j: shape (R, n + 1).

    E ζ is the EMA of E θ (everything is linear), so in closed form
        pre:  θ_0 [ρ^j + (1 − ρ) G_j],  post: θ_0 [ρ^j + (1 − ρ) q G_j],
        G_j = Σ_{i<j} ρ^{j−1−i} q^i = q^{j−1} expm1(j·ln(ρ/q)) / expm1(ln(ρ/q)),
    written with expm1 because ρ = q exactly at κ=1 when 1 − ρ_B = η_B a.
    """
    rho = np.maximum(np.atleast_1d(np.asarray(rhos, dtype=np.float64)), 1e-300)[:, None]  # ρ=0: G_j = q^{j−1}
    j = np.arange(n + 1, dtype=np.float64)[None, :]
    log_ratio = np.log(rho) - np.log(q)
    den = np.expm1(log_ratio)
    safe = np.where(den == 0.0, 1.0, den)
    with np.errstate(over="ignore", invalid="ignore"):
        g = np.where(den == 0.0, j * q ** (j - 1.0), q ** (j - 1.0) * np.expm1(j * log_ratio) / safe)
    weight = 1.0 if convention == "pre" else q
    return theta0 * (rho**j + (1.0 - rho) * weight * g)
