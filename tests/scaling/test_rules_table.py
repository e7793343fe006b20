"""Parametrized tables of every scaling rule against hand-computed values."""

import math

import pytest

from emarule.errors import ScalingError
from emarule.scaling import rules
from emarule.scaling.tables import lr_table, momentum_table, paper_round


@pytest.mark.parametrize("rho,kappa,expected", [
    (0.99, 1, 0.99), (0.99, 2, 0.9801), (0.996, 8, 0.996**8), (0.9999, 0.5, math.sqrt(0.9999)),
    (0.992, 4, 0.992**4), (0.0, 3, 0.0),
])
def test_ema_exponential(rho, kappa, expected):
    assert rules.ema_exponential(rho, kappa) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("rho,kappa,expected", [(0.99, 2, 0.98), (0.9999, 8, 0.9992), (0.9, 0.5, 0.95)])
def test_ema_linear(rho, kappa, expected):
    assert rules.ema_linear(rho, kappa) == pytest.approx(expected)


@pytest.mark.parametrize("fn,value,kappa,expected", [
    (rules.lr_linear, 0.1, 4, 0.4), (rules.lr_linear, 0.4, 0.5, 0.2),
    (rules.lr_sqrt, 1e-3, 4, 2e-3), (rules.lr_sqrt, 1e-3, 16, 4e-3),
    (rules.beta_linear, 0.9, 2, 0.8), (rules.beta_linear, 0.999, 10, 0.99), (rules.beta_linear, 0.95, 6, 0.7),
    (rules.eps_sqrt, 1e-8, 4, 5e-9), (rules.eps_sqrt, 1e-6, 0.25, 2e-6),
    (rules.wd_linear, 0.04, 4, 0.16), (rules.wd_sqrt, 0.3, 4, 0.6),
    (rules.wd_uncoupled, 0.1, 2, 0.19), (rules.wd_uncoupled, 0.01, 3, 1 - 0.99**3),
])
def test_optimizer_and_decay_rules(fn, value, kappa, expected):
    assert fn(value, kappa) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("lam,kappa,lr,lr_hat,expected", [
    (1e-4, 4, 0.1, 0.4, 1e-4),  # SGD: η̂ = κη, so the decay is already scaled through the lr
    (0.3, 4, 1e-3, 2e-3, 0.6),  # Adam: η̂ = √κη gives √κ λ
    (0.1, 9, 1.0, 3.0, 0.3),
])
def test_weight_decay_auto(lam, kappa, lr, lr_hat, expected):
    assert rules.wd_auto(lam, kappa, lr, lr_hat) == pytest.approx(expected)
    # the per-step product η̂λ̂ equals κ times ηλ: κ small decays collapse to one
    assert lr_hat * rules.wd_auto(lam, kappa, lr, lr_hat) == pytest.approx(kappa * lr * lam)


@pytest.mark.parametrize("n,kappa,expected", [
    (64000, 4, 16000), (20000, 8, 2500), (19000, 3, 6333), (5000, 0.5, 10000), (7, 16, 1), (0, 4, 0),
])
def test_step_counted_durations(n, kappa, expected):
    assert rules.steps(n, kappa) == expected


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "abc", None])
def test_check_kappa_rejects(bad):
    with pytest.raises(ScalingError):
        rules.check_kappa(bad)


@pytest.mark.parametrize("beta,expected", [(0.9, 10), (0.95, 20), (0.999, 1000)])
def test_max_kappa_for_beta(beta, expected):
    assert rules.max_kappa_for_beta(beta) == pytest.approx(expected)


# The paper's Table "Scaled EMA momenta" (Appendix C.3), cell by cell, incl. the three cells
# that only match when ρ is held in float32.
PAPER_MOMENTA = {
    32: ["0.99999", "0.99987", "0.99874", "0.99997", "0.99994", "0.99992", "0.99976"],
    1024: ["0.9996", "0.99601", "0.9606", "0.999", "0.99799", "0.99749", "0.99241"],
    4096: ["0.9984", "0.98412", "0.85146", "0.996", "0.992", "0.99", "0.97"],
    16384: ["0.99362", "0.93798", "0.5256", "0.9841", "0.96838", "0.9606", "0.88529"],
    65536: ["0.97472", "0.77405", "0.07632", "0.93788", "0.8794", "0.85146", "0.61425"],
}
PAPER_LRS = {
    32: ["0.0125", "0.0375", "0.00625", "0.00035", "0.42426", "0.00009"],
    512: ["0.2", "0.6", "0.1", "0.00141", "1.69706", "0.00035"],
    8192: ["3.2", "9.6", "1.6", "0.00566", "6.78823", "0.00141"],
    65536: ["25.6", "76.8", "12.8", "0.016", "19.2", "0.004"],
}


@pytest.mark.parametrize("batch", sorted(PAPER_MOMENTA))
def test_paper_momentum_table(batch):
    row = next(r for r in momentum_table().rows if r[0] == batch)
    assert [paper_round(v) for v in row[1:]] == PAPER_MOMENTA[batch]


@pytest.mark.parametrize("batch", sorted(PAPER_LRS))
def test_paper_lr_table(batch):
    row = next(r for r in lr_table().rows if r[0] == batch)
    assert [paper_round(v) for v in row[1:]] == PAPER_LRS[batch]


def test_reference_cells_are_marked():
    t = momentum_table()
    assert (3, 1) in t.bold and (7, 4) in t.bold  # B=256 for ρ=0.9999, B=4096 for ρ=0.996
    assert len(t.bold) == 7


def test_your_own_values_keep_their_digits():
    """The paper's five decimals (and float32 ρ) are for its tables: an lr of 1e-6 is not 0, ρ = 0.99999999 not 1."""
    from emarule.scaling.tables import significant

    lr = lr_table([(256, 1e-6, "adam")], [32, 256])
    assert not lr.paper and [significant(v) for v in (lr.rows[0][1], lr.rows[1][1])] == ["3.54e-07", "1e-06"]
    rho = momentum_table([(256, 0.99999999)], [256, 25600, 256000])
    assert not rho.paper and rho.headers[1] == "rho=0.99999999@B=256"
    assert [significant(r[1]) for r in rho.rows] == ["0.99999999", "0.999999", "0.99999"]
    assert momentum_table().paper and lr_table().paper
    assert [significant(x) for x in (0.99202, 0.9841, 0.0353553, 25.6, 0.0)] == ["0.99202", "0.9841", "0.03536",
                                                                                  "25.6", "0"]
