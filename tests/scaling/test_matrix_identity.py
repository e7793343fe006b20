"""The paper's Eq. (4) / Theorem "Iterations of SGD + EMA": the 3×3 SGD+EMA matrix to the power κ."""

import numpy as np
import pytest


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


def test_one_scaled_step_matches_kappa_steps_up_to_delta():
    eta, rho, kappa = 1e-3, 0.999, 8
    state = np.array([0.3, -0.2, 1.7])  # θ, ζ, g
    many = np.linalg.matrix_power(step_matrix(eta, rho), kappa) @ state
    one = step_matrix(kappa * eta, rho**kappa) @ state  # SGD rule + EMA rule, one step
    assert many[0] == pytest.approx(one[0])
    assert abs(many[1] - one[1]) == pytest.approx(abs(delta(eta, rho, kappa) * state[2]), rel=1e-9)
