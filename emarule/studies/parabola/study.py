"""One (ρ_B, D) configuration of the noisy parabola → one record per (convention, κ).

Err(ρ, κ) = max_j |E g(ζ^base_{jκ}) − E g(ζ^{(κ,ρ)}_j)| on the shared grid t = jκη_B, with
g = ‖·‖ (g(ζ) = ζ in D=1, where ζ stays positive). Two ways to get E g:

- "exact" (D=1): E ζ is the EMA of E θ_j = θ_0 (1 − ηa)^j, in closed form. No seeds, so ρ*
  is the exact argmin and needs no hold-out. (The gradient noise does not enter E ζ at all.)
- "montecarlo" (any D): coupled simulated runs (see `simulate`). ρ* is chosen on one half of
  the seeds, on every ⌊n/search_points⌋-th grid point; every reported Err, ρ*'s included, is
  measured on the other half on the full grid, so ρ* does not fit its own noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from emarule.studies.parabola import momenta as ema, simulate
from emarule.studies.parabola.problem import Problem
from emarule.studies.parabola.search import minimize_beta
from emarule.scaling.rules import ema_exponential, ema_linear


@dataclass
class Settings:
    kappas: list
    conventions: tuple = ema.CONVENTIONS
    method: str = "exact"  # exact | montecarlo
    seeds: int = 10_000  # Monte Carlo seeds, both halves together
    seed: int = 0
    search_points: int = 128  # Monte Carlo: grid points per run on which ρ* is chosen
    nodes: int = 13  # Chebyshev nodes across the bracket of ρ*
    figure_kappas: tuple = (8, 256)


@dataclass
class Outcome:
    records: list
    info: dict
    curves: dict = field(default_factory=dict)  # Fig. 1a: single-run trajectories
    figures: dict = field(default_factory=dict)  # file name → PNG bytes


def candidates(rho_base: float, kappa: int) -> dict:
    """The momenta compared besides ρ*; the linear form is None where it leaves [0, 1)."""
    lin = ema_linear(rho_base, kappa)
    return {"rule": ema_exponential(rho_base, kappa), "no_rule": rho_base,
            "linear": lin if 0.0 <= lin < 1.0 else None}


def record(rho_base, dim, convention, kappa, rhos, rho_star, errs, err_target) -> dict:
    return {"rho_base": rho_base, "dim": dim, "convention": convention, "kappa": kappa,
            "rho_rule": rhos["rule"], "rho_star": rho_star, "err_rule": errs["rule"],
            "err_no_rule": errs["no_rule"], "err_linear": errs["linear"], "err_star": errs["star"],
            "err_target": err_target}


def errors_at(delta: Callable[[np.ndarray], np.ndarray], rhos: dict, rho_star: float) -> dict:
    named = {k: v for k, v in rhos.items() if v is not None} | {"star": rho_star}
    values = np.abs(delta(1.0 - np.array(list(named.values())))).max(axis=0)
    out = {k: None for k in rhos} | dict(zip(named, map(float, values), strict=True))
    return out


@dataclass
class SearchTrack:
    """How well ρ* was pinned down, over all κ and conventions of a configuration."""

    resolution: float = 0.0
    mismatch: float = 0.0
    evaluations: int = 0

    def add(self, m) -> None:
        self.resolution = max(self.resolution, m.resolution)
        self.mismatch = max(self.mismatch, m.mismatch)
        self.evaluations += m.evaluations

    def info(self) -> dict:
        return {"rho_star_resolution": self.resolution, "rho_star_interpolation_mismatch": self.mismatch,
                "momenta_evaluated": self.evaluations}


def exact_study(problem: Problem, rho_base: float, st: Settings, tick: Callable[[str], None]) -> Outcome:
    p = problem
    base_run = p.scaled(1)
    records, track = [], SearchTrack()
    for conv in st.conventions:
        base = ema.exact_mean(p.theta0, base_run.q, [rho_base], p.iters, conv)[0]
        for kappa in st.kappas:
            run = p.scaled(kappa)
            target = base[run.base_index()]

            def delta(betas, run=run, target=target, conv=conv):
                return (ema.exact_mean(p.theta0, run.q, 1.0 - np.asarray(betas), run.n, conv) - target).T

            rhos = candidates(rho_base, run.kappa)
            best = minimize_beta(delta, 1.0 - rhos["rule"], nodes=st.nodes)
            track.add(best)
            err_target = float(np.abs(base_run.mean_theta()[run.base_index()] - run.mean_theta()).max())
            records.append(record(rho_base, 1, conv, run.kappa, rhos, best.rho,
                                  errors_at(delta, rhos, best.rho), err_target))
            tick(f"ρ_B={rho_base:g} D=1 {conv} κ={run.kappa}")
    info = {"method": "exact", "rho_star_from": "exact first moment E ζ (closed form), no seeds"} | track.info()
    # A single simulated run for Fig. 1a, as the paper plots.
    z = simulate.base_noise(p, 1, 1, [st.seed, 1, 2])
    return Outcome(records, info, single_run_curves(p, z, 1, rho_base, st))


def montecarlo_study(problem: Problem, rho_base: float, dim: int, st: Settings,
                     tick: Callable[[str], None]) -> Outcome:
    p = problem
    seeds = max(2, st.seeds)
    halves = {"selection": seeds // 2, "evaluation": seeds - seeds // 2}
    kappas = sorted({p.check_kappa(k) for k in st.kappas})
    stars: dict = {}
    records: list = []
    curves: dict = {}
    track = SearchTrack()
    # The base run is compared at steps jκ (evaluation) or at every stride-th of them (selection).
    needed = {"selection": np.unique(np.concatenate([p.scaled(k).base_index()[:: stride_of(p.scaled(k), st)]
                                                     for k in kappas])),
              "evaluation": np.unique(np.concatenate([p.scaled(k).base_index() for k in kappas if k > 1] or
                                                     [np.zeros(1, dtype=int)]))}
    for half, n_seeds in halves.items():
        z = simulate.base_noise(p, n_seeds, dim, [st.seed, dim, 0 if half == "selection" else 1])
        theta = simulate.theta_paths(p.scaled(1), z, dim)
        base = {c: ema.mean_norm_ema(theta, dim, [rho_base], c, at=needed[half])[:, 0] for c in st.conventions}
        base_theta = ema.mean_norm(theta, dim)
        del theta
        if half == "evaluation":
            curves = single_run_curves(p, z[:dim], dim, rho_base, st)
        for kappa, noise in simulate.noise_levels(z, kappas):
            run = p.scaled(kappa)
            rhos = candidates(rho_base, kappa)
            if kappa == 1:  # the scaled run is the base run, path by path: Err(ρ_B) = 0
                if half == "evaluation":
                    zero = {k: (0.0 if v is not None else None) for k, v in rhos.items()} | {"star": 0.0}
                    records += [record(rho_base, dim, c, 1, rhos, rho_base, zero, 0.0) for c in st.conventions]
                tick(f"ρ_B={rho_base:g} D={dim} {half} κ=1")
                continue
            theta = simulate.theta_paths(run, noise, dim)
            idx = run.base_index()
            for conv in st.conventions:
                if half == "selection":
                    strided = ema.StridedEMA(theta, dim, conv, stride_of(run, st))
                    target = base[conv][idx[:: strided.stride]][: strided.m + 1]

                    def delta(betas, strided=strided, target=target):
                        return strided.mean_norm(1.0 - np.asarray(betas)) - target[:, None]

                    best = minimize_beta(delta, 1.0 - rhos["rule"], nodes=st.nodes)
                    stars[(conv, kappa)] = best.rho
                    track.add(best)
                else:
                    target = base[conv][idx]

                    def delta(betas, theta=theta, target=target, conv=conv):
                        return ema.mean_norm_ema(theta, dim, 1.0 - np.asarray(betas), conv) - target[:, None]

                    err_target = float(np.abs(ema.mean_norm(theta, dim) - base_theta[idx]).max())
                    star = stars[(conv, kappa)]
                    records.append(record(rho_base, dim, conv, kappa, rhos, star, errors_at(delta, rhos, star),
                                          err_target))
            del theta
            tick(f"ρ_B={rho_base:g} D={dim} {half} κ={kappa}")
        del z
    order = {c: i for i, c in enumerate(st.conventions)}
    records.sort(key=lambda r: (order[r["convention"]], r["kappa"]))
    info = {"method": "montecarlo",
            "rho_star_from": f"hold-out: chosen on {halves['selection']} seeds (every "
                             f"⌊n/{st.search_points}⌋-th grid point), errors on {halves['evaluation']} other seeds",
            "seeds_selection": halves["selection"], "seeds_evaluation": halves["evaluation"],
            "paths_per_half": halves["evaluation"] * dim} | track.info()
    return Outcome(records, info, curves)


def stride_of(run, st: Settings) -> int:
    """Grid points between the ones ρ* is chosen on: about `search_points` per run."""
    return max(1, run.n // st.search_points)


def single_run_curves(p: Problem, z: np.ndarray, dim: int, rho_base: float, st: Settings) -> dict:
    """‖ζ‖ of one seed (D rows of base noise) at base and at each figure κ, with and without the rule."""
    out: dict = {}
    theta = simulate.theta_paths(p.scaled(1), z, dim)
    base_run = p.scaled(1)
    for conv in st.conventions:
        out[(conv, 1)] = {"t": base_run.times(), "base": ema.mean_norm_ema(theta, dim, [rho_base], conv)[:, 0]}
    for kappa in st.figure_kappas:
        if kappa > p.iters or lr_too_big(p, kappa):
            continue
        run = p.scaled(kappa)
        th = simulate.theta_paths(run, simulate.scaled_noise(z, kappa), dim)
        rhos = [ema_exponential(rho_base, kappa), rho_base]
        for conv in st.conventions:
            zeta = ema.mean_norm_ema(th, dim, rhos, conv)
            out[(conv, kappa)] = {"t": run.times(), "rule": zeta[:, 0], "no_rule": zeta[:, 1]}
    return out


def lr_too_big(p: Problem, kappa: int) -> bool:
    return kappa * p.lr * p.a >= 1.0


def study(problem: Problem, rho_base: float, dim: int, st: Settings, tick=lambda msg: None) -> Outcome:
    if dim == 1 and st.method == "exact":
        return exact_study(problem, rho_base, st, tick)
    return montecarlo_study(problem, rho_base, dim, st, tick)


def steps_of(st: Settings, dim: int) -> int:
    """Progress ticks of one `study` call."""
    return len(st.kappas) * (len(st.conventions) if dim == 1 and st.method == "exact" else 2)
