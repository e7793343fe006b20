"""Monte Carlo θ paths of the noisy parabola, one row per (seed, coordinate).

Coupling. The scaled run at κ sees, at step j, the κ base minibatches j κ … (j+1)κ − 1 at once:
its standard-normal noise is their sum divided by √κ. Each run keeps its exact marginal law
(the variance is divided by κ, steps are independent), so E g(ζ) of each is unchanged, but the
difference E g(ζ_base) − E g(ζ_scaled), which Err is made of, is estimated with far less
Monte Carlo noise than with independent draws. At κ=1 the scaled run *is* the base run.
"""

from __future__ import annotations

import math

import numpy as np

from emarule.studies.parabola.problem import Problem, Scaled


def base_noise(problem: Problem, seeds: int, dim: int, stream) -> np.ndarray:
    """Standard-normal noise of the base run, (seeds·D, I_B); float32 halves the memory, and
    both runs read the same rounded draws so the coupling is exact."""
    rng = np.random.default_rng(stream)
    return rng.standard_normal((seeds * dim, problem.iters), dtype=np.float32)


def scaled_noise(z: np.ndarray, kappa: int) -> np.ndarray:
    """(paths, ⌊n/κ⌋): the sum of κ consecutive draws of z over √κ (unit variance again)."""
    n = z.shape[1] // kappa
    out = z[:, 0: n * kappa: kappa].astype(np.float64)
    for i in range(1, kappa):  # strided adds: far faster than a reduction over a short last axis
        out += z[:, i: n * kappa: kappa]
    out /= math.sqrt(kappa)
    return out


def noise_levels(z: np.ndarray, kappas):
    """Yield (κ, scaled noise) in increasing κ, building each level from the last one it is a
    multiple of: ⌊⌊I/κ₁⌋/m⌋ = ⌊I/(mκ₁)⌋, so the sums are the same, at a fraction of the cost."""
    level, level_kappa = z, 1
    for kappa in sorted(set(kappas)):
        if kappa % level_kappa:
            level, level_kappa = z, 1
        if kappa != level_kappa:
            level, level_kappa = scaled_noise(level, kappa // level_kappa), kappa
        yield kappa, level


def theta_paths(run: Scaled, z: np.ndarray, dim: int) -> np.ndarray:
    """θ_0..θ_n for every row of the scaled noise z (paths, n): shape (paths, n + 1)."""
    p = run.problem
    paths, n = z.shape
    theta = np.empty((paths, n + 1))
    theta[:, 0] = p.theta0 / math.sqrt(dim)
    if p.c == 0.0:
        # θ_{k+1} = θ_k (1 − ηa(1 + √(b/κ) z_k)): a cumulative product, built in place (float64
        # even when z is float32), with no Python loop over steps.
        f = theta[:, 1:]
        np.multiply(z, -run.lr * p.a * run.noise_sd, out=f, dtype=np.float64)
        f += 1.0 - run.lr * p.a
        f[:, 0] *= theta[:, 0]
        np.cumprod(f, axis=1, out=f)
        return theta
    for k in range(n):
        th = theta[:, k]
        noise = np.sqrt((p.b * (p.a * th) ** 2 + p.c) / run.kappa) * z[:, k].astype(np.float64)
        theta[:, k + 1] = th - run.lr * (p.a * th + noise)
    return theta
