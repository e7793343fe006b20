"""The paper's Eq. (4) / Theorem "Iterations of SGD + EMA": the 3×3 SGD+EMA matrix to the power κ, and
emarule's scaled step (its rules and its EMA recursion) against it."""

import numpy as np
import pytest

from emarule.scaling import rules
from emarule.studies.parabola import momenta


def step_matrix(eta, rho):
    return np.array([[1.0, 0.0, -eta], [1.0 - rho, rho, 0.0], [0.0, 0.0, 1.0]])


def delta(eta, rho, kappa):
    """EMA Scaling Rule error δ(η, ρ, κ) = −η (κ − (1 − ρ^κ)/(1 − ρ))."""
    return -eta * (kappa - (1 - rho**kappa) / (1 - rho))


def closed_form(eta, rho, kappa):
    return np.array([[1.0, 0.0, -kappa * eta], [1 - rho**kappa, rho**kappa, delta(eta, rho, kappa)],
                     [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("eta,rho,kappa", [
    (1e-4, 0.9999, 2), (1e-3, 0.99, 8), (0.1, 0.9, 5), (0.02, 0.992, 64), (1e-2, 0.5, 3), (0.3, 0.996, 256),
])
def test_matrix_power_equals_closed_form(eta, rho, kappa):
    np.testing.assert_allclose(np.linalg.matrix_power(step_matrix(eta, rho), kappa),
                               closed_form(eta, rho, kappa), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("kappa", [2, 4, 16])
def test_delta_is_the_sum_of_the_induction(kappa):
    eta, rho = 0.01, 0.97
    assert delta(eta, rho, kappa) == pytest.approx(-eta * sum(1 - rho**i for i in range(1, kappa)))


@pytest.mark.parametrize("kappa", [2, 8, 32])
def test_scaling_error_is_order_eta_times_one_minus_rho(kappa):
    # δ/η → 0 as ρ → 1: the rule's error is O(η × (1 − ρ))
    eta = 1e-3
    ratios = [abs(delta(eta, rho, kappa)) / (eta * (1 - rho)) for rho in (0.99, 0.999, 0.9999)]
    assert all(r < kappa**2 for r in ratios)
    assert abs(delta(eta, 0.9999, kappa)) < abs(delta(eta, 0.99, kappa))


def sgd_path(theta0, g, lr, steps):
    """θ_0..θ_steps of SGD on a constant gradient g (the theorem's state keeps g fixed)."""
    return theta0 - lr * g * np.arange(steps + 1)


@pytest.mark.parametrize("eta,rho,kappa", [(1e-3, 0.999, 8), (0.02, 0.992, 4), (1e-4, 0.9999, 64)])
def test_emarules_scaled_step_matches_kappa_steps_up_to_delta(eta, rho, kappa):
    """One step with the values emarule derives (SGD rule, EMA rule), its EMA run by the parabola study's
    recursion under the paper's convention, against κ base steps: equal up to δ·g, as Eq. (4) says."""
    theta0, zeta0, g = 0.3, -0.2, 1.7
    lr_hat, rho_hat = rules.lr_linear(eta, kappa), rules.ema_exponential(rho, kappa)
    many = sgd_path(theta0, g, eta, kappa)
    one = sgd_path(theta0, g, lr_hat, 1)
    zeta_many = momenta.ema_path(momenta.inputs(many[None], "pre"), np.array([zeta0]), rho)[0, -1, 0]
    zeta_one = momenta.ema_path(momenta.inputs(one[None], "pre"), np.array([zeta0]), rho_hat)[0, -1, 0]
    assert one[-1] == pytest.approx(many[-1], rel=1e-12)
    want = closed_form(eta, rho, kappa) @ np.array([theta0, zeta0, g])
    assert zeta_many == pytest.approx(want[1], rel=1e-9)
    assert zeta_many - zeta_one == pytest.approx(delta(eta, rho, kappa) * g, rel=1e-6)
