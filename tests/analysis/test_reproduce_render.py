"""Every text shown of a verdict comes from its record through `render` (report.md, the console and the
README's table): numbers in one format, nothing cut short, and the qualifiers a verdict carries."""

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import render as D
from emarule.analysis.reproduce import report as RP
from emarule.analysis.reproduce import rules as R
from test_reproduce import polyak_runs

ONE_INTERVAL = re.compile(r"\[(?:[+−-][\d.e+−-]+|[+−]∞), (?:[+−-][\d.e+−-]+|[+−]∞)\]")


def test_numbers_and_intervals_have_one_format():
    assert D.num(0.123456) == "0.123" and D.num(-2.0, True) == "-2" and D.num(3.0, True) == "+3"
    assert D.num(None) == "—" and D.num(math.nan) == "—" and D.num(math.inf) == "∞"
    assert D.num(math.inf, True) == "+∞" and D.num(-math.inf, True) == "−∞"
    assert D.interval((-0.1234, 1.3)) == "[-0.123, +1.3]" and D.interval(None) == "—"
    assert D.interval((-math.inf, math.inf)) == "[−∞, +∞]"


@settings(max_examples=200, deadline=None)
@given(lo=st.floats(allow_nan=False), width=st.floats(0, 1e30, allow_nan=False))
def test_every_interval_reads_as_one(lo, width):
    hi = lo + width
    assert ONE_INTERVAL.fullmatch(D.interval((lo, hi))), D.interval((lo, hi))


def _record(**kw):
    base = {"claim": "c", "short": "s", "kind": "rule_needed", "metric": "ema_top1", "kappa": 2.0,
            "verdict": R.REPRODUCED, "shape": "directional", "effect": 3.0, "effect_ci": [2.5, 3.5], "mde": 0.4,
            "margin": None, "spread": 0.42, "parts": [], "why": "", "stand_in": ""}
    return base | kw


def test_the_effect_cell_gives_the_margin_of_equivalence_and_noninferiority():
    assert D.effect(_record()) == "+3 [+2.5, +3.5]"
    assert D.effect(_record(shape="equivalence", margin=0.42, effect=-0.1, effect_ci=[-0.2, 0.0])) == \
        "-0.1 [-0.2, +0], margin ±0.42"
    assert D.effect(_record(shape="noninferior", margin=0.42)) == "+3 [+2.5, +3.5], margin −0.42"
    assert D.effect(_record(effect=None, why="a setting was not run")) == "a setting was not run"
    assert D.mde(_record()) == "0.4 (spread 0.42)" and D.mde(_record(mde=None)) == "—"
    assert D.mde(_record(mde=math.inf)) == "∞ (spread 0.42)"


def test_the_verdict_carries_its_qualifiers_whole():
    opposite = _record(verdict=R.CONTRADICTED, effect=-3.0, effect_ci=[-3.5, -2.5], route=R.OPPOSITE)
    assert D.verdict(opposite) == "**contradicted** (the opposite effect)"
    assert D.verdict(opposite, bold=False) == "contradicted (the opposite effect)"
    assert D.verdict(_record(verdict=R.CONTRADICTED, shape="equivalence", route=R.OUTSIDE)) == "**contradicted**"
    long_why = "seed 3's baseline " + "and a long reason " * 30 + "ends here"
    assert D.verdict(_record(verdict=R.NOT_MEASURED, why=long_why)) == f"{R.NOT_MEASURED} ({long_why})"
    aside = D.verdict(_record(verdict=R.SET_ASIDE, set_aside="the target model strays", why=long_why))
    assert aside == f"{R.SET_ASIDE} (the target model strays: {long_why})"
    mech = {"name": "the EMA's horizon against the last lr stage", "what": "horizon 1 epochs: 0.2", "present": False}
    assert D.verdict(_record(verdict=R.NOT_TESTABLE, mechanism=mech)) == \
        f"{R.NOT_TESTABLE} (missing the EMA's horizon against the last lr stage: horizon 1 epochs: 0.2)"
    # what the seeds showed all the same, beside the reason it does not count
    assert D.verdict(_record(verdict=R.NOT_TESTABLE, mechanism=mech, verdict_if_applicable=R.CONTRADICTED)) == \
        f"{R.NOT_TESTABLE} (missing the EMA's horizon against the last lr stage: horizon 1 epochs: 0.2); the rules " \
        f"alone: {R.CONTRADICTED}"
    assert D.verdict(_record(verdict=R.SET_ASIDE, set_aside="s", why="w", verdict_if_applicable=R.REPRODUCED)) == \
        f"{R.SET_ASIDE} (s: w); the rules alone: {R.REPRODUCED}"
    parts = [{"label": "without departs", "verdict": R.REPRODUCED},
             {"label": "with matches", "verdict": R.NOT_REPRODUCED}]
    assert D.verdict(_record(verdict=R.NOT_REPRODUCED, parts=parts)) == \
        f"{R.NOT_REPRODUCED}; the part “without departs” is {R.REPRODUCED}"
    assert D.verdict(_record(stand_in="κ=8 beyond")) == "reproduced; a stand-in: κ=8 beyond"


def test_a_contradiction_says_whether_it_is_an_opposite_effect_or_an_absence():
    """An absence shown is a contradiction by the rules, but its sign may be the paper's: the cell says so."""
    absent = _record(verdict=R.CONTRADICTED, effect=0.1, effect_ci=[-0.2, 0.4], margin=0.42, route=R.ABSENT)
    assert D.verdict(absent) == "**contradicted** (an effect beyond ±0.42 shown absent, +0.1 on the paper's side)"
    away = _record(verdict=R.CONTRADICTED, shape="departure", effect=-0.1, effect_ci=[-0.4, 0.2], margin=0.42,
                   route=R.ABSENT)
    assert D.verdict(away) == "**contradicted** (an effect beyond ±0.42 shown absent, -0.1 measured)"
    assert D.verdict(away | {"mde_from_zero": 0.3}) == (
        "**contradicted** (an effect beyond ±0.42 shown absent (MDE against no effect 0.3), -0.1 measured)")
    parts = [{"label": "without departs", "shape": "directional", "verdict": R.CONTRADICTED, "effect": -2.0,
              "effect_ci": [-3.0, -1.0], "margin": None, "route": R.OPPOSITE},
             {"label": "A closer than B", "shape": "comparative", "verdict": R.CONTRADICTED, "effect": -1.0,
              "effect_ci": [-2.0, -0.5], "margin": None, "route": R.OPPOSITE},
             {"label": "with matches", "shape": "equivalence", "verdict": R.REPRODUCED}]
    assert D.verdict(_record(verdict=R.CONTRADICTED, parts=parts)) == (
        "**contradicted**; the part “with matches” is reproduced (without departs: the opposite effect; "
        "A closer than B: the opposite ordering (at the ratio the claim states))")


def test_a_part_line_and_a_cell():
    p = {"label": "without the rule at κ=2 departs from the baseline", "shape": "directional",
         "statistic": "mean Δ over the run", "effect": 3.0, "effect_ci": [2.9, 3.1], "mde": 0.2, "margin": None,
         "spread": 0.42, "n": 5, "verdict": R.REPRODUCED, "rule": "CI95 lies above 0"}
    assert D.part_line(p) == ("without the rule at κ=2 departs from the baseline (directional, mean Δ over the run): "
                              "+3 [+2.9, +3.1], MDE 0.2, spread 0.42, n = 5: reproduced (CI95 lies above 0)")
    assert D.part_line(p | {"margin": 0.42}).count(", margin 0.42,") == 1
    assert D.cell("a | b\nc") == "a \\| b c"


def test_every_judged_claim_renders_whole_in_the_report(tmp_path):
    m = M.measure(K.POLYAK, polyak_runs(tmp_path, ema_with=-3.0, ema_without=-6.0, target_with=-3.0))
    assert {c["verdict"] for c in m["claims"]} >= {R.SET_ASIDE, R.REPRODUCED, R.NOT_MEASURED}
    data = m | {"timing": {"wall_s": 1.0, "cpus": 2, "load_start": 0.0, "load_end": 0.0, "omp_threads": "1"},
                "command": "emarule reproduce polyak", "figures": [], "decision_rule": "rules",
                "not_judged_here": [], "settings": RP.settings_rows(m)}
    report = RP.markdown(data, K.POLYAK)
    json.dumps(RP.clean(data["claims"]))  # verdict.json can hold every record
    for c in m["claims"]:
        assert D.cell(D.verdict(c)) in report and D.cell(D.effect(c)) in report
        if c["verdict"] == R.SET_ASIDE:  # the target's numbers, and what the rules would have said
            assert c["why"].startswith("with the rule at κ=") and "top1 worse by +3 [+3, +3]" in c["why"]
            assert f"- Where the claim applied, the rules would have said: {c['verdict_if_applicable']}." in report
    cells = [x.strip() for line in report.splitlines() if line.startswith("| ") for x in line.split(" | ")]
    assert cells and not any(x.endswith("…") for x in cells)  # nothing cut short
    for p in (p for c in m["claims"] for p in c["parts"]):
        assert f"- Part: {D.part_line(p)}." in report


@pytest.mark.parametrize("family,where", [("byol", "L888"), ("dino", "L3098–3100"), ("ctc-pseudo-label", "L2366–2371")])
def test_a_claim_the_family_does_not_judge_is_listed_with_what_judging_it_needs(family, where):
    """The paper's claims that no preset here judges (BYOL's sensitivity grid, DINO's collapse at a sharp step,
    pseudo-labeling at κ=16) are in verdict.json and the report, each with its reason, and in no table row."""
    f = K.FAMILIES[family]
    data = RP.payload(f, {"command": f"emarule reproduce {family}"}, [], None, [], {})
    (listed,) = [c for c in data["not_judged_here"] if c["where"] == where]
    assert listed["why"] and listed["claim"] in {c.text for c in f.extra_claims}
    assert not any(c.where == where for c in f.claims)
    report = RP.markdown(data | {"timing": {"wall_s": 1.0, "cpus": 2, "load_start": 0.0, "load_end": 0.0,
                                            "omp_threads": "1"}}, f)
    assert "## Claims of this section not judged" in report and f"({where}): \"{listed['claim']}\" — " in report
