"""Every scaling rule of the paper as a small pure function of (base value, κ).

κ = B̂ / B is the ratio of the new batch to the reference batch at which the base
value was written. Each function returns the scaled value; `plan.py` pairs it with the
rule's name. References are to Busbridge et al. (2023), "How to Scale Your EMA".
"""

from __future__ import annotations

import math
from fractions import Fraction

from emarule.errors import ScalingError

# --- model EMA (Definition: EMA Scaling Rule) -------------------------------------------------


def ema_exponential(rho: float, kappa: float) -> float:
    """ρ̂ = ρ^κ: κ EMA updates at momentum ρ collapse to one at ρ^κ (Eq. 4, second row)."""
    return rho**kappa


def linear(x: float, kappa: float) -> float:
    """1 − κ(1 − x), computed exactly on the decimal values written (their shortest repr) and then
    rounded once: in floats, 1 − 1000(1 − 0.999) is −8.9e-16, not the 0 it is, and 1 − 10(1 − 0.9) 2.2e-16.
    At κ=1 it is x itself, whatever its digits."""
    exact = 1 - Fraction(repr(float(kappa))) * (1 - Fraction(repr(float(x))))  # Decimal would keep 28 digits
    return float(exact)


def ema_linear(rho: float, kappa: float) -> float:
    """ρ̂ = 1 − κ(1 − ρ): the first-order form of ρ^κ in 1 − ρ (the SDE's β₀ = (1 − ρ)/η fixed)."""
    return linear(rho, kappa)


# --- optimizers (Appendix C.2) ----------------------------------------------------------------


def lr_linear(lr: float, kappa: float) -> float:
    """SGD Scaling Rule: η̂ = κη (Goyal et al., 2017)."""
    return kappa * lr


def lr_sqrt(lr: float, kappa: float) -> float:
    """Adam / RMSProp Scaling Rule: η̂ = √κ η (Malladi et al., 2022)."""
    return math.sqrt(kappa) * lr


def beta_linear(beta: float, kappa: float) -> float:
    """Adam / RMSProp: β̂ = 1 − κ(1 − β); an optimizer EMA whose horizon is counted in steps."""
    return linear(beta, kappa)


def eps_sqrt(eps: float, kappa: float) -> float:
    """Adam / RMSProp: ε̂ = ε / √κ, so ε keeps its size relative to √v, which shrinks as 1/√κ."""
    return eps / math.sqrt(kappa)


def max_kappa_for_beta(beta: float) -> float:
    """Largest κ keeping 1 − κ(1 − β) ≥ 0 (κ = 1/(1 − β))."""
    return math.inf if beta >= 1.0 else 1.0 / (1.0 - beta)


# --- weight decay (Appendix C.2, Weight Decay Scaling Rule) ------------------------------------


def wd_auto(lam: float, kappa: float, lr: float, lr_hat: float) -> float:
    """λ̂ = κ η λ / η̂ for decay multiplied by the learning rate (θ ← θ − η λ θ).

    Matching κ small decays with one: 1 − η̂λ̂ = (1 − ηλ)^κ ≈ 1 − κηλ, so η̂λ̂ = κηλ.
    (The paper's Definition prints the ratio inverted, κη̂/η; its derivation gives η/η̂.)
    With SGD (η̂ = κη) this leaves λ unchanged; with Adam (η̂ = √κη) it gives √κ λ.
    """
    if lr_hat == 0.0:
        return lam
    return kappa * lr * lam / lr_hat


def wd_linear(lam: float, kappa: float) -> float:
    """λ̂ = κλ."""
    return kappa * lam


def wd_sqrt(lam: float, kappa: float) -> float:
    """λ̂ = √κ λ (Loshchilov & Hutter's normalized decay for Adam-style lr scaling)."""
    return math.sqrt(kappa) * lam


def wd_uncoupled(lam: float, kappa: float) -> float:
    """λ̂ = 1 − (1 − λ)^κ for decay not multiplied by the lr (θ ← (1 − λ)θ): optimizer-independent.

    Computed as −expm1(κ·log1p(−λ)): decays are tiny (1e-6) and 1 − (1 − λ)^κ would cancel.
    """
    return -math.expm1(kappa * math.log1p(-lam))


# --- durations (Appendix C.1) ------------------------------------------------------------------


def steps(n: float, kappa: float, name: str = "a step count") -> int:
    """N̂ = N / κ for quantities counted in optimizer steps; epochs and samples are unchanged.

    Rounded to the nearest whole step, halves up (2.5 → 3, as 3.5 → 4), and never to 0 when the base count
    is positive. emarule's own runs never use the rounded count: they measure N base steps as N × B of data.
    """
    if n == 0:
        return 0
    scaled = n / kappa
    if not math.isfinite(scaled):
        # N / κ past float64's range (κ = 1e-310): there is no whole number of steps to round to
        raise ScalingError(f"{name}: {n:g} / κ overflows at κ={kappa:g}; the smallest usable κ is "
                           f"{abs(n) / 1e308:.3g}")
    return max(1, math.floor(scaled + 0.5))


# --- validation --------------------------------------------------------------------------------


def check_kappa(kappa: float) -> float:
    try:
        k = float(kappa)
    except (TypeError, ValueError):
        raise ScalingError(f"κ must be a number, got {kappa!r}; pass e.g. --kappa 4") from None
    if not math.isfinite(k) or k <= 0:
        raise ScalingError(f"κ must be finite and > 0, got {kappa!r}; pass e.g. --kappa 4 or --kappa 0.5")
    return k


def check_unit_interval(name: str, value: float) -> None:
    """Momenta and betas live in [0, 1)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value < 1.0):
        raise ScalingError(f"{name} must be in [0, 1), got {value!r}")
