"""Where "matches or surpasses the baseline" turns into "falls short": the non-inferiority margin of one
signed end spread, checked on both sides, and the sign of A − baseline for a metric where lower is better
(a loss), on synthetic runs."""

import dataclasses

import pytest
from test_reproduce import write_run
from test_reproduce_windows import with_total

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import rules as R


@pytest.mark.parametrize("mean,noise,s,verdict", [
    (-0.5, 0.05, 1.0, R.REPRODUCED),  # half a spread below the baseline, every seed agreeing: level with it
    (+2.0, 0.05, 1.0, R.REPRODUCED),  # above it: surpasses
    (-0.9, 0.02, 1.0, R.REPRODUCED),  # just inside the margin
    (-0.9, 0.02, 0.5, R.REPRODUCED),  # in spreads: the margin scales with the spread
    (-1.1, 0.02, 1.0, R.CONTRADICTED),  # just past the margin, the whole interval below it
    (-1.1, 0.02, 0.5, R.CONTRADICTED),
    (-1.0, 0.5, 1.0, R.NOT_REPRODUCED),  # on the margin, the interval across it
    (-0.5, 2.0, 1.0, R.NOT_REPRODUCED),  # inside it on average, with the noise of several spreads
])
def test_the_margin_is_one_end_spread(mean, noise, s, verdict):
    values = [mean * s + noise * s * j for j in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    decision, (rec,) = J.decide_parts("matches_or_better", [J.Effects("A", values, s, "Δ at the end")])
    assert decision.verdict == verdict and rec["margin"] == pytest.approx(s)
    assert rec["effect"] == pytest.approx(mean * s) and rec["effect_ci"][0] <= rec["effect"] <= rec["effect_ci"][1]


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
        for name, k, rule, d in (("base", 1.0, "exponential", 0.0), ("rule", 4.0, "exponential", shift + 0.05 * s),
                                 ("norule", 4.0, None, 0.0)):
            p = write_run(root, f"k{k:g}-{name}-s{s}", k, rule, s,
                          {"byol_loss": lambda t, o=o, d=d: 5 - 0.3 * t + o + d, "probe_top1": lambda t: 10 * t},
                          experiment="byol-r50-lars")
            dirs.append(with_total(p, 1000))
    return load_runs(dirs)


def test_a_higher_loss_is_worse(tmp_path):
    """A loss 6 above the baseline's at the end (6, 6.05, 6.1 per seed), where the signed end spread is
    √0.18 = 0.42: A − baseline, signed so that > 0 is better, is about −6, wholly below −1 spread at its upper
    bound from 3 baselines (8.9 spreads, 3.8)."""
    (c,) = M.measure(loss_family(), loss_runs(tmp_path, 6.0))["claims"]
    assert c["metric"] == "byol_loss" and c["spread"] == pytest.approx(0.18 ** 0.5)
    assert c["parts"][0]["per_seed"] == pytest.approx([-6.0, -6.05, -6.1])
    assert c["effect"] == pytest.approx(-6.05) and c["effect_ci"][1] < -c["margin"]
    assert c["verdict"] == R.CONTRADICTED and c["statistic"] == "Δ at the end"


def test_a_lower_loss_is_better(tmp_path):
    (c,) = M.measure(loss_family(), loss_runs(tmp_path / "lower", -3.0))["claims"]
    assert c["effect"] == pytest.approx(2.95) and c["verdict"] == R.REPRODUCED and c["effect_ci"][0] > 0
