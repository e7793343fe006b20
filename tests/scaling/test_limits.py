"""Floating-point limits of ρ^κ and of the EMA update, checked against the formats themselves."""

import math

import pytest
import torch

from emarule.scaling.limits import limits, round_to


@pytest.mark.parametrize("dtype,tdtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                          ("float16", torch.float16)])
@pytest.mark.parametrize("x", [0.9999, 0.99995, 0.999, 0.996, 0.5, 1e-3, 1 - 2**-9, 1 - 3 * 2**-10, 0.99999994])
def test_round_to_matches_torch(dtype, tdtype, x):
    assert round_to(x, dtype) == torch.tensor(x, dtype=torch.float64).to(tdtype).item()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rho", [0.996, 0.99, 0.9999])
def test_bounds_are_where_rounding_happens(dtype, rho):
    lim = limits(rho, 4096, dtype)
    # just inside the range ρ^κ is neither 1 nor 0 after rounding; just outside it is
    assert round_to(rho ** (lim.kappa_min * 1.01), dtype) < 1.0
    assert round_to(rho ** (lim.kappa_min * 0.99), dtype) == 1.0
    assert round_to(1 - rho ** (lim.kappa_max * 0.99), dtype) < 1.0
    assert round_to(1 - rho ** (lim.kappa_max * 1.01), dtype) == 1.0


def test_update_bound_is_where_the_increment_is_lost():
    rho = 0.999
    lim = limits(rho, 256, "bfloat16")
    zeta = torch.tensor(1.0, dtype=torch.bfloat16)
    theta = torch.tensor(2.0, dtype=torch.bfloat16)  # relative gap r = 1
    for factor, moves in ((1.2, True), (0.8, False)):
        w = 1 - rho ** (lim.kappa_update * factor)
        new = zeta + torch.tensor(w, dtype=torch.bfloat16) * (theta - zeta)
        assert (new != zeta).item() is moves


def test_paper_appendix_magnitudes():
    # ρ_B = 0.996 at B = 4096 in FP32: the appendix's ≈1/32K and ≈4K, with corrected formulas
    lim = limits(0.996, 4096, "float32")
    assert 1 / lim.kappa_update == pytest.approx(2**24 * math.log(1 / 0.996), rel=1e-3)
    assert 30_000 < 1 / lim.kappa_update < 36_000 * 2
    assert 4000 < lim.kappa_max < 4500
    assert lim.kappa_max * 4096 > 16e6  # ≈17.7M samples, not the ≈8M the appendix quotes


def test_bfloat16_range_is_narrow():
    lim = limits(0.9999, 256, "bfloat16")
    assert lim.kappa_low > 1  # at B=256 itself ρ=0.9999 rounds to 1.0 in bfloat16
    d = lim.as_dict()
    assert d["meaningful_kappa"][0] == lim.kappa_low and "formula" in d["bounds"]["kappa_max"]


@pytest.mark.parametrize("gap", [0.00391, 0.001])
def test_an_empty_range_is_no_range(gap):
    lim = limits(0.9999, 256, "bfloat16", gap)
    assert not lim.meaningful
    d = lim.as_dict()
    assert d["meaningful_kappa"] is None and d["meaningful_batch_size"] is None
    assert limits(0.9999, 256, "bfloat16").as_dict()["meaningful_kappa"] == pytest.approx([39.14, 6.238e4], rel=1e-3)
