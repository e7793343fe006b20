"""Hypothesis properties of the rules: identity at κ=1, composition, first-order agreement."""

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emarule.scaling import rules, scale
from emarule.config.load import experiment_names, load_spec

rho_st = st.floats(min_value=0.5, max_value=0.99999)
kappa_st = st.floats(min_value=0.05, max_value=64)
SPECS = {n: load_spec(n) for n in experiment_names()}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(SPECS)))
def test_kappa_one_is_identity(name):
    p = scale(SPECS[name], 1.0)
    for key, v in p.values.items():
        base = v.base if isinstance(v.base, list) else [v.base]
        scaled = v.scaled if isinstance(v.scaled, list) else [v.scaled]
        assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(base, scaled, strict=True)), key


@settings(max_examples=300, deadline=None)
@given(x=st.floats(min_value=-2.0, max_value=1.0), kappa=kappa_st)
def test_the_linear_rule_is_the_exact_value_rounded_once(x, kappa):
    from fractions import Fraction

    assert rules.linear(x, 1.0) == x  # every digit kept, not only the first 15
    exact = 1 - Fraction(repr(kappa)) * (1 - Fraction(repr(x)))
    got = Fraction(rules.linear(x, kappa))
    assert all(abs(got - exact) <= abs(Fraction(n) - exact) for n in (math.nextafter(float(got), -math.inf),
                                                                        math.nextafter(float(got), math.inf)))


@settings(max_examples=200, deadline=None)
@given(rho=rho_st, k1=kappa_st, k2=kappa_st)
def test_exponential_rule_composes(rho, k1, k2):
    once = rules.ema_exponential(rho, k1 * k2)
    twice = rules.ema_exponential(rules.ema_exponential(rho, k1), k2)
    assert math.isclose(once, twice, rel_tol=1e-9, abs_tol=1e-300)


@settings(max_examples=200, deadline=None)
@given(beta=rho_st, k1=kappa_st, k2=kappa_st, lr=st.floats(1e-6, 10))
def test_optimizer_rules_compose(beta, k1, k2, lr):
    assert math.isclose(rules.lr_sqrt(rules.lr_sqrt(lr, k1), k2), rules.lr_sqrt(lr, k1 * k2), rel_tol=1e-12)
    assert math.isclose(rules.lr_linear(rules.lr_linear(lr, k1), k2), rules.lr_linear(lr, k1 * k2), rel_tol=1e-12)
    a = rules.beta_linear(rules.beta_linear(beta, k1), k2)
    assert math.isclose(a, rules.beta_linear(beta, k1 * k2), rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(rho=st.floats(min_value=0.9, max_value=0.999999), kappa=kappa_st)
def test_linear_form_agrees_to_first_order(rho, kappa):
    x = kappa * (1 - rho)
    assume(x < 0.5)
    gap = abs(rules.ema_exponential(rho, kappa) - rules.ema_linear(rho, kappa))
    # ρ^κ = exp(κ log ρ) and κ log ρ = −x − κ(1−ρ)²/2 − …: the gap is second order in 1 − ρ
    assert gap <= x**2 / 2 + kappa * (1 - rho) ** 2 + 1e-15


@settings(max_examples=100, deadline=None)
@given(rho=rho_st, kappa=st.floats(min_value=1.0, max_value=64))
def test_larger_batch_means_smaller_momentum(rho, kappa):
    assert rules.ema_exponential(rho, kappa) <= rho


@settings(max_examples=100, deadline=None)
@given(lam=st.floats(1e-8, 0.05), k1=kappa_st, k2=kappa_st)
def test_uncoupled_decay_composes(lam, k1, k2):
    a = rules.wd_uncoupled(rules.wd_uncoupled(lam, k1), k2)
    assert math.isclose(a, rules.wd_uncoupled(lam, k1 * k2), rel_tol=1e-9)
