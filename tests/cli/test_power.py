"""`emarule power`: each verdict's frequency under the rules by claim shape, through the command line."""

import json

import pytest

from emarule.analysis.reproduce import rules
from tests.cli_util import invoke, refused_in_one_line


def power_json(*args):
    res = invoke("power", *args, "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_list_names_every_kind_with_its_shape_and_margin():
    listed = power_json("--list")
    assert [k["name"] for k in listed] == list(rules.KINDS)
    assert {k["shape"] for k in listed} <= set(rules.SHAPES)
    for k in listed:  # a margin where the rules use one; a claim of a sign alone has none
        if k["shape"] in ("equivalence", "noninferior"):
            assert k["margin"] > 0, k
        else:
            assert k["margin"] is None, k


def test_the_json_is_the_simulation_the_rules_give():
    got = power_json("rule_closer", "--effect", "0.5", "--seeds", "7", "--trials", "300")
    assert got == rules.simulate(rules.KINDS["rule_closer"], 0.5, 7, 300, spread="bounded")
    known = power_json("rule_closer", "--effect", "0.5", "--seeds", "7", "--trials", "300", "--spread", "known")
    assert known == rules.simulate(rules.KINDS["rule_closer"], 0.5, 7, 300)
    assert set(got) >= {"kind", "effect", "seeds", "trials", "verdicts", "mde"}
    assert sum(got["verdicts"].values()) == pytest.approx(1.0)


def test_an_effect_that_does_not_clear_the_size_needs_no_seed_count_and_says_so():
    """A "does not match" part must clear 1 spread: an effect of 1 is never shown beyond it at any seed count,
    and the console says why rather than "more than 1000 seeds"."""
    got = power_json("rule_needed", "--effect", "1", "--seeds", "5", "--trials", "50")
    assert (got["size"], got["seeds_for_effect"]) == (1.0, None)
    # as reproduce judges: the size at the 5 baselines' upper bound, the MDE at the level left beside it
    assert got["mde"] == pytest.approx(rules.mde(1.0, 5, alpha=0.025) + rules.spread_factor(0.0125, 4, True))
    res = invoke("power", "rule_needed", "--effect", "1", "--seeds", "5", "--trials", "50")
    assert res.exit_code == 0 and "does not clear the first part's size of 1 spread" in res.output
    assert "bounded (as reproduce judges)" in res.output
    known = ("--seeds", "5", "--trials", "50", "--spread", "known")
    assert power_json("rule_needed", "--effect", "1", *known)["mde"] == pytest.approx(rules.mde(1.0, 5) + 1.0)
    assert power_json("rule_needed", "--effect", "2.5", *known)["seeds_for_effect"] == rules.seeds_needed(1.5, 1.0)


@pytest.mark.parametrize("seeds", ["5", "10"])
@pytest.mark.parametrize("kind", [k for k, v in rules.KINDS.items() if v.shape == "directional"])
def test_directional_kinds_keep_their_error_rates(kind, seeds):
    """No effect: reproduced at most 5 % of the time; the paper's effect at one spread: contradicted at most 5 %."""
    assert power_json(kind, "--effect", "0", "--seeds", seeds, "--trials", "1000")["verdicts"]["reproduced"] <= 0.05
    assert power_json(kind, "--effect", "1", "--seeds", seeds, "--trials", "1000")["verdicts"]["contradicted"] <= 0.05


@pytest.mark.parametrize("noise", ["0.03", "0.1", "0.5", "2", "3"])
@pytest.mark.parametrize("kind", [k for k, v in rules.KINDS.items() if v.shape in ("directional", "comparative")])
def test_the_error_rates_hold_at_every_noise_a_family_measures(kind, noise):
    """The families' per-seed effects have sds from a few hundredths of a spread to over two (the README's family rows,
    "noise"); the rates above must not rest on a noise of exactly one spread."""
    args = ("--seeds", "5", "--trials", "600", "--noise", noise)
    assert power_json(kind, "--effect", "0", *args)["verdicts"]["reproduced"] <= 0.05
    assert power_json(kind, "--effect", "1", *args)["verdicts"]["contradicted"] <= 0.05


@pytest.mark.parametrize("kind", [k for k, v in rules.KINDS.items() if v.shape == "departure"])
def test_departure_kinds_keep_their_error_rates(kind):
    """Two-sided at 0.05: with no effect, reproduced 5 % by construction (within the simulation's own
    error); the paper's effect at one spread: contradicted at most 5 %."""
    got = power_json(kind, "--effect", "0", "--seeds", "5", "--trials", "2000")["verdicts"]["reproduced"]
    assert got <= 0.05 + 3 * (0.05 * 0.95 / 2000) ** 0.5
    assert power_json(kind, "--effect", "1", "--seeds", "5", "--trials", "1000")["verdicts"]["contradicted"] <= 0.05


def test_the_table_gives_the_minimum_detectable_effect_and_the_seeds_needed():
    res = invoke("power", "arm_closer", "--effect", "1", "--seeds", "5", "--trials", "100")
    assert res.exit_code == 0, res.output
    assert "minimum detectable effect at 5 seeds: 1.66 spreads" in res.output
    assert "seeds to detect 1: 10" in res.output


@pytest.mark.parametrize("argv, needle", [
    (["power"], "name a claim KIND"),
    (["power", "sideways", "--effect", "1"], "unknown claim kind 'sideways'"),
    (["power", "rule_closer"], "--effect E is needed"),
    (["power", "rule_closer", "--effect", "x"], "--effect must be a number"),
    (["power", "rule_closer", "--effect", "inf"], "--effect must lie in"),
    (["power", "rule_closer", "--effect", "1", "--seeds", "1"], "--seeds must lie in [2, 1000]"),
    (["power", "rule_closer", "--effect", "1", "--seeds", "2.5"], "--seeds must be a whole number"),
    (["power", "rule_closer", "--effect", "1", "--trials", "0"], "--trials must lie in"),
    (["power", "rule_closer", "--effect", "1", "--noise", "0"], "--noise must be finite and > 0"),
    (["power", "--list", "rule_closer"], "--list takes no KIND"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    refused_in_one_line(argv, capsys, needle)
