"""Where "matches or surpasses the baseline" turns into "falls short": the 2× end-spread threshold, checked
on both sides, and the sign of A − baseline for a metric where lower is better (a loss), on synthetic runs."""

import dataclasses

import pytest
from test_reproduce import write_run
from test_reproduce_windows import with_total

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import verdict as V


@pytest.mark.parametrize("d,ci,s,verdict", [
    # Between 1× and 2× the spread below the baseline, every seed agreeing: still level with it.
    (-1.5, (-2.5, -0.5), 1.0, "reproduced"),
    (-1.01, (-1.2, -0.9), 1.0, "reproduced"),
    (-2.0, (-2.5, -1.5), 1.0, "reproduced"),  # exactly 2×: "within" includes the bound
    (-0.9, (-1.0, -0.8), 0.5, "reproduced"),  # the threshold scales with the spread
    # Just past 2×: short of the baseline where the interval is wholly below 0, undecided where it is not.
    (-2.01, (-3.0, -1.0), 1.0, "contradicted"),
    (-1.1, (-1.3, -1.0), 0.5, "contradicted"),
    (-2.01, (-4.0, 0.5), 1.0, "inconclusive"),
])
def test_the_threshold_is_twice_the_end_spread(d, ci, s, verdict):
    assert V.decide_matches_or_better(d, ci, s)[0] == verdict


def loss_family():
    """byol-r50-lars's first claim (A = with the rule at κ=4) read on the BYOL loss, where lower is better."""
    family = K.FAMILIES["byol-r50-lars"]
    claim = dataclasses.replace(family.claims[0], metric=K.BYOL_LOSS.name)
    return dataclasses.replace(family, arms=(), more_metrics=(), claims=(claim,))


def loss_runs(root, shift):
    """Three seeds of baselines and κ=4 runs of one falling loss; the runs with the rule end `shift` above
    their own seed's baseline (worse), those without it on it."""
    dirs = []
    for s, o in enumerate((-0.3, 0.0, 0.3)):
        for name, k, rule, d in (("base", 1.0, "exponential", 0.0), ("rule", 4.0, "exponential", shift),
                                 ("norule", 4.0, None, 0.0)):
            p = write_run(root, f"k{k:g}-{name}-s{s}", k, rule, s,
                          {"byol_loss": lambda t, o=o, d=d: 5 - 0.3 * t + o + d, "probe_top1": lambda t: 10 * t},
                          experiment="byol-r50-lars")
            dirs.append(with_total(p, 1000))
    return load_runs(dirs)


def test_a_higher_loss_is_worse(tmp_path):
    """A loss 3 above the baseline's at the end, where the end spread is 0.4: A falls short by more than 2× it,
    and A − baseline, signed so that > 0 is better, is −3 for every seed."""
    (c,) = M.measure(loss_family(), loss_runs(tmp_path, 3.0))["claims"]
    assert c["metric"] == "byol_loss" and c["baseline_spread"] == pytest.approx(0.4)
    assert c["a_minus_baseline"]["per_seed"] == pytest.approx([-3.0, -3.0, -3.0])
    assert c["a_minus_baseline"]["mean"] == pytest.approx(-3.0)
    assert c["verdict"] == "contradicted"


def test_a_lower_loss_is_better(tmp_path):
    (c,) = M.measure(loss_family(), loss_runs(tmp_path / "lower", -3.0))["claims"]
    assert c["a_minus_baseline"]["mean"] == pytest.approx(3.0) and c["verdict"] == "reproduced"
