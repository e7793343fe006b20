"""Preset fidelity: each mechanism measured from a baseline run's records, in both layouts a run can have."""

import dataclasses
from types import SimpleNamespace

import pytest

from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import mechanisms as X


def run(rho: float, layout: list, total_steps: float | None = None):
    plan = {"ema.momentum": {"base": rho, "scaled": rho}}
    if total_steps is not None:
        plan["schedule.total_steps"] = {"base": total_steps, "scaled": total_steps}
    return SimpleNamespace(hparams={"hyperparameters": plan, "layout": layout})


ASR = next(c for c in K.CTC_POLYAK.claims if c.mechanism == "training_vs_horizon")


@pytest.mark.parametrize("rho,present", [(0.98, True), (0.995, False)])
def test_training_length_is_read_from_the_plan_where_an_epoch_has_no_step_count(rho, present):
    """A ctc run counts its batch in seconds of audio, so its layout has no steps per epoch: the plan's 900 base
    steps are 225 steps at κ=4; at ρ_B = 0.98 (a 50-step horizon) that is 4.5 horizons against the paper's
    20/4 = 5 (present from 2.5); at 0.995 (200 steps) 1.125, absent."""
    layout = [{"start_epoch": 0.0, "end_epoch": 11.46, "steps_per_epoch": None}]
    m = X.training_vs_horizon(dataclasses.replace(ASR, kappa=4.0), [run(rho, layout, 900)], {})
    assert m["value"] == pytest.approx(225 * (1 - rho)) and m["paper"] == 5.0 and m["threshold"] == 2.5
    assert m["present"] is present and "225 steps at κ=4" in m["what"]


def test_training_length_from_the_layout_and_unmeasured_without_either():
    layout = [{"start_epoch": 0.0, "end_epoch": 10.0, "steps_per_epoch": 30}]
    m = X.training_vs_horizon(ASR, [run(0.99, layout)], {})
    k = ASR.kappa or 1.0
    assert m["value"] == pytest.approx(300 / k * 0.01)
    none = X.training_vs_horizon(ASR, [run(0.99, [{"start_epoch": 0.0, "end_epoch": 1.0}])], {})
    assert none["present"] is None and none["value"] is None


def test_every_claim_on_the_pseudo_labels_needs_labels_that_carry_information():
    """The pseudo-label mechanism is §3.3's, and App. G's claim on the same teacher's pseudo-label WER is about
    the same pseudo-labeling: each claim on pl_wer or on the student's WER after pseudo-labeling names it."""
    for c in K.CTC_PL.claims:
        if c.metric == "pl_wer" or (c.metric == "wer" and c.until is None):
            assert c.mechanism == "informative_pseudo_labels", c.short
    pl = {"pl_wer": {"baseline": ([10.0, 20.0], [72.0, 66.0])}}
    m = X.informative_pseudo_labels(K.CTC_PL.claims[-1], [], pl)
    assert m["value"] == pytest.approx(69.0) and m["present"] is False and "69 %" in m["what"]
    assert X.informative_pseudo_labels(K.CTC_PL.claims[-1], [], {})["present"] is None


def test_the_drop_at_the_end_of_polyak_needs_a_horizon_against_the_last_stage():
    """§3.2's drop at the end comes from an EMA that averages weights from before the last lr decay: its claim
    names that mechanism, and the measure reads a preset's spec (ρ_B = 0.99 at 256 steps an epoch, a last
    stage of 12 − 10.67 epochs: 0.294, absent). The EMA-over-target claim names none: no mechanism for it was
    fixed before its verdict was seen."""
    at_end = {c.kind: c for c in K.POLYAK.claims if c.metric == "ema_top1" and c.over == "end"}
    assert at_end["rule_needed"].mechanism == "horizon_vs_last_stage" and not at_end["ema_above_target"].mechanism
    r = run(0.99, [{"start_epoch": 0.0, "end_epoch": 12.0, "steps_per_epoch": 256}])
    r.hparams["spec"] = {"schedule": {"epochs": 12, "milestones_epochs": [4, 8, 10.67]}}
    m = X.horizon_vs_last_stage(at_end["rule_needed"], [r], {})
    assert m["value"] == pytest.approx((100 / 256) / (12 - 10.67)) and m["present"] is False
