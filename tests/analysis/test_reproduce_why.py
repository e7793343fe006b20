"""A verdict's reason keeps its numbers and its decision apart (`verdict.Why`), so the README's table never
has to cut them from the joined string; the cut it keeps for verdict.json files without them agrees."""

import copy
import math
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import table as T
from emarule.analysis.reproduce import verdict as V
from test_reproduce import polyak_runs

gap = st.one_of(st.floats(0, 50), st.just(math.inf), st.none())
spread = st.one_of(st.floats(0.001, 20), st.none())
ci = st.one_of(st.none(), st.tuples(st.floats(-20, 20), st.floats(0, 20)).map(lambda t: (t[0], t[0] + t[1])))


def _whys(gw, gwo, s, c, d):
    for kind in ("rule_needed", "rule_closer", "same_either_way"):
        yield V.decide(kind, gw, gwo, s, c)
    yield V.decide_target(gw, s, gwo, s, c)
    yield V.decide_optimizer(gw, s, c)
    yield V.decide_arm_closer(gw, gwo, c)
    yield V.decide_matches_or_better(d, c, s)
    if d is not None:
        yield V.decide_with_better({2.0: d, 4.0: -d}, s, {2.0: c, 4.0: c} if c else None)
        yield V.decide_ema_above([d, -d / 2, d / 3])


@settings(max_examples=200, deadline=None)
@given(gw=gap, gwo=gap, s=spread, c=ci, d=st.one_of(st.floats(-30, 30), st.none()))
def test_every_decision_keeps_its_numbers_and_words_apart(gw, gwo, s, c, d):
    for verdict, why in _whys(gw, gwo, s, c, d):
        assert isinstance(why, V.Why) and verdict in ("reproduced", "contradicted", "inconclusive")
        assert why.numbers and why.decision
        if why.decision == why.numbers:  # for want of data: nothing was measured
            assert verdict == "inconclusive" and str(why) == why.numbers
        else:
            assert str(why) == f"{why.numbers}: {why.decision}"
            # the table's cut, for a verdict.json whose claims hold only `why`, finds the same place
            assert T._split({"why": str(why)}) == (why.numbers, why.decision)


def test_every_judged_claim_keeps_its_numbers_and_decision(tmp_path):
    m = M.measure(K.POLYAK, polyak_runs(tmp_path, ema_with=0.1, ema_without=-3.0, target_with=0.0))
    assert {c["verdict"] for c in m["claims"]} >= {"reproduced"}
    for c in m["claims"]:
        assert c["numbers"] and c["decision"], c["claim"]
        if not c.get("set_aside"):
            assert c["why"].startswith(c["numbers"])


def test_a_set_aside_row_shows_the_targets_numbers_and_the_emas():
    gate = {"blind": True, "metric": "top1", "rows": {("with", 4.0): {
        "metric": "top1", "gap": 6.5, "ci": (5.4, 7.8), "spread": 2.1, "state": "strays"}}}
    claim = next(c for c in K.POLYAK.claims if c.metric == "ema_top1" and c.kind in M.GATED)
    out = M.decided({}, *V.decide(claim.kind, 1.0, 3.0, 1.5, (0.5, 3.5)))
    got = M.gated(K.POLYAK, claim, out, gate, [("with", 4.0)])
    assert got["set_aside"] == M.ASIDE_STRAYS and got["verdict_if_target_tracked"] == "reproduced"
    assert got["numbers"].startswith("target: with the rule at κ=4: top1 gap 6.5")
    assert got["numbers"].endswith("EMA: " + out["numbers"])


def test_a_stopped_seed_adds_to_the_decision_not_to_the_numbers():
    out = M.decided({}, *V.decide_matches_or_better(-0.5, (-1.0, 0.0), 1.0))
    M.stopped_verdict(out, [3])
    assert out["verdict"] == "inconclusive" and out["numbers"].startswith("A − baseline at the end -0.5")
    assert out["decision"].endswith("but the run of seed 3 stopped before its end, so it has no final value")
    assert out["why"] == f"{out['numbers']}: {out['decision']}"


def test_a_reason_survives_copy_and_pickle_whole():
    why = V.decide("rule_needed", 0.5, 3.0, 1.0, (0.5, 3.5))[1]
    for again in (copy.deepcopy(why), pickle.loads(pickle.dumps(why))):
        assert isinstance(again, V.Why) and again == why
        assert (again.numbers, again.decision) == (why.numbers, why.decision)
