"""`emarule reproduce`: the paired statistics and the judgement of a family's claims on curves built so that
each verdict must come out, the study checks on records built the same way, the registry against the specs,
bad input, and a tiny BYOL reproduction end to end (written, then reused)."""

import json
import math
import types
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli_util import one_line_error

from emarule.analysis import compare as C
from emarule.cli.main import app
from emarule.analysis.compare import load_runs
from emarule.errors import UserError
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import judge as J
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import paired as P
from emarule.analysis import offline_probe as PC
from emarule.analysis.reproduce import rules as R
from emarule.analysis.reproduce import studies as S

runner = CliRunner()
T = [float(t) for t in range(11)]  # epochs 0..10


def curve(f, xs=T):
    return list(xs), [f(x) for x in xs]


# --- statistics ---------------------------------------------------------------------------------


def test_leave_one_out_spread_by_hand():
    # Offsets −1, 0, +1: seed −1 against mean(0, 1) = 0.5 → 1.5; seed 0 against 0 → 0; seed 1 → 1.5.
    seeds = [curve(lambda t, o=o: t + o) for o in (-1.0, 0.0, 1.0)]
    s = P.spread(seeds)
    assert s["run"] == pytest.approx(1.0) and s["end"] == pytest.approx(1.0) and s["seeds"] == 3
    assert P.spread(seeds[:1]) is None  # one seed: no spread


def test_gap_is_mean_over_seeds_of_mean_abs_difference():
    base = curve(lambda t: t)
    runs = [curve(lambda t: t + 0.5), curve(lambda t: t - 1.5 if t < 5 else t + 0.5)]
    g = P.gaps(runs, base)
    assert g["per_seed_run"][0] == pytest.approx(0.5)
    assert g["per_seed_run"][1] == pytest.approx((5 * 1.5 + 6 * 0.5) / 11)
    assert g["run"] == pytest.approx((0.5 + (5 * 1.5 + 6 * 0.5) / 11) / 2)
    assert g["end"] == pytest.approx(0.5)


def test_a_run_that_stops_early_has_an_infinite_gap():
    g = P.gaps([curve(lambda t: t, T[:5])], curve(lambda t: t))
    assert math.isinf(g["run"]) and g["incomplete"] == 1


def test_a_run_that_starts_after_the_baseline_ends_is_not_measured_not_infinite():
    """Pseudo-labeling that starts late logs pl_wer only from then on: no shared point is no gap, not ∞."""
    late = ([10.0, 10.5], [1.0, 1.0])
    g = P.gaps([late], ([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]))
    assert g["run"] is None and g["no_overlap"] == 1 and g["incomplete"] == 0
    g = P.paired_gaps([late], [([0.0, 1.0, 2.0], [1.0, 1.0, 1.0])])
    assert g["run"] is None and g["no_overlap"] == 1 and g["signed_run"] == []


def test_evaluations_a_hair_apart_across_seeds_share_the_grid():
    """Seconds batches end epochs at slightly different points per seed: the evaluation due at the same
    base step must stay on the baseline's grid (the first and last ones were dropped)."""
    a = ([1.857, 2.088, 2.32, 3.2505], [10.0, 20.0, 30.0, 40.0])
    b = ([1.858, 2.087, 2.321, 3.2500], [12.0, 22.0, 32.0, 42.0])
    grid, mean, _ = C.mean_curve([a, b])
    assert grid == a[0] and mean[0] == pytest.approx(11.0) and mean[-1] == pytest.approx(41.0)
    g = C.gap(([1.86, 3.251], [11.0, 41.0]), (grid, mean))
    assert g["points"] == 4 and g["gap_final"] == pytest.approx(0.0, abs=0.05)


def test_leave_one_out_spread_of_scalars():
    assert P.loo_spread([1.0, 2.0, 3.0]) == pytest.approx((1.5 + 0 + 1.5) / 3)
    assert P.loo_spread([5.0]) is None and P.loo_spread([4.0, 4.0]) == 0


def test_trailing_smoothing():
    xs, ys = P.smooth(([0.0, 0.5, 1.0, 1.5], [0.0, 2.0, 4.0, 6.0]), 0.5)
    assert ys == [0.0, 1.0, 3.0, 5.0] and xs == [0.0, 0.5, 1.0, 1.5]
    assert P.smooth(([0.0, 1.0], [1.0, 3.0]), 0.0)[1] == [1.0, 3.0]


# --- decisions ----------------------------------------------------------------------------------


def _effects(values, scale):
    return J.Effects("a part", list(values), scale, "mean Δ over the run")


def test_an_undefined_or_unbounded_spread_decides_nothing():
    """No finite spread to scale the effect by: not reproduced, with no interval, whatever the effect."""
    for scale in (None, 0.0, math.inf):
        d, (rec,) = J.decide_parts("gap_remains", [_effects([5.0, 5.1, 4.9], scale)])
        assert d.verdict == R.NOT_REPRODUCED and rec["rule"] == "no finite baseline spread to scale the effect by"
        assert rec["effect_ci"] == [-math.inf, math.inf] and math.isinf(rec["mde"]) and rec["n"] == 3
        assert rec["effect"] == pytest.approx(5.0)  # still measured, in the metric's units


EFFECT = st.floats(-20, 20, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(vals=st.lists(EFFECT, min_size=2, max_size=6), s=st.floats(1e-3, 1e3), k=st.floats(1e-3, 1e3),
       kind=st.sampled_from(sorted(R.KINDS)))
def test_decisions_are_unit_free_and_reported_in_the_metrics_units(vals, s, k, kind):
    """Effects and spread in other units (× k) give the same verdict; the records are in the metric's units:
    the effect is the per-seed mean, inside its interval."""
    parts = len(R.KINDS[kind].parts)
    d, recs = J.decide_parts(kind, [_effects(vals, s)] * parts)
    d2, recs2 = J.decide_parts(kind, [_effects([v * k for v in vals], s * k)] * parts)
    if d.verdict != d2.verdict:  # only float rounding where a bound sits on 0 or a margin of 1 spread
        sm = R.summarize([v / s for v in vals])
        near = (*sm.ci95, *sm.ci90, sm.mde)
        assert any(math.isclose(abs(b), m, abs_tol=1e-9) for b in near for m in (0.0, 1.0)), (d, d2)
    lo, hi = recs[0]["effect_ci"]
    assert recs[0]["effect"] == pytest.approx(sum(vals) / len(vals), abs=1e-9)
    assert recs2[0]["effect"] == pytest.approx(k * recs[0]["effect"], rel=1e-9, abs=1e-9)
    assert lo <= recs[0]["effect"] + 1e-9 and recs[0]["effect"] - 1e-9 <= hi
    assert d.verdict in R.VERDICTS and len(recs) == parts


# --- a family's claims on synthetic run directories ---------------------------------------------


def write_run(root: Path, name, kappa, rule, seed, metrics: dict, experiment="polyak-r50", layout=None, spec=None,
              rho=0.99, ts=T):
    d = root / name
    d.mkdir(parents=True)
    spec = {"pseudo_label": {"pretrain_steps": 50}, **(spec or {})}
    hyper = {"batch_size": {"base": 10, "scaled": 10 * kappa},
             "ema.momentum": {"base": rho, "scaled": rho ** (kappa if rule else 1)}}
    for r in (spec.get("ema") or {}).get("also") or []:
        hyper[f"ema.momentum/{r:.10g}"] = {"base": r, "scaled": r ** (kappa if rule else 1)}
    h = {"experiment": experiment, "kappa": kappa, "ema_rule": rule is not None, "ema_rule_form": rule,
         "seed": seed, "dataset_size": 100, "epoch_measure": 100, "spec": spec, "hyperparameters": hyper,
         "layout": layout or [{"start_epoch": 0.0, "end_epoch": 10.0, "kappa": kappa}]}
    (d / "hparams.json").write_text(json.dumps(h))
    rows = [{"kind": "eval", "samples_seen": int(t * 100), "epoch": t, **{m: f(t) for m, f in metrics.items()}}
            for t in ts]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def write_offline_probe(run_dir: Path, top1: float) -> None:
    """The converged probe of the run's final teacher, as `emarule probe` caches it (offline_probe.json)."""
    (run_dir / "offline_probe.json").write_text(json.dumps({"offline_probe_top1": top1, "step": 9}))


# Records from which polyak's "at the end" mechanism is measured, and present: at 10 steps an epoch and ρ_B = 0.99
# the EMA's horizon is 10 epochs against a last lr stage of 5 (2.0, present from 0.4).
POLYAK_SPEC = {"schedule": {"epochs": 10, "milestones_epochs": [5]}}


def polyak_layout(kappa: float) -> list:
    return [{"start_epoch": 0.0, "end_epoch": 10.0, "kappa": kappa, "steps_per_epoch": 10}]


def polyak_runs(root, ema_with, ema_without, target_with, noise=0.3):
    """Baseline seeds ±noise around t (EMA) and t − 1 (target); κ=2 and κ=4 settings offset as given."""
    dirs = []
    for s, o in enumerate((-noise, 0.0, noise)):
        dirs.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s,
                              {"ema_top1": lambda t, o=o: t + o, "top1": lambda t, o=o: t - 1 + o},
                              layout=polyak_layout(1.0), spec=POLYAK_SPEC))
        for k in (2.0, 4.0):
            dirs.append(write_run(root, f"k{k:g}-rule-s{s}", k, "exponential", s,
                                  {"ema_top1": lambda t, o=o: t + o + ema_with, "top1": lambda t, o=o: t - 1 + o
                                   + target_with}, layout=polyak_layout(k), spec=POLYAK_SPEC))
            dirs.append(write_run(root, f"k{k:g}-norule-s{s}", k, None, s,
                                  {"ema_top1": lambda t, o=o: t + o + ema_without,
                                   "top1": lambda t, o=o: t - 1 + o + target_with},
                                  layout=polyak_layout(k), spec=POLYAK_SPEC))
    return load_runs(dirs)


def verdicts(measured):
    return {(c["kind"], c["kappa"], c["statistic"]): c["verdict"] for c in measured["claims"]}


RUN, END = J.STATISTIC["signed", "run"], J.STATISTIC["signed", "end"]


def test_polyak_claims_reproduced_when_the_rule_closes_the_gap(tmp_path):
    m = M.measure(K.POLYAK, polyak_runs(tmp_path, ema_with=0.1, ema_without=-4.0, target_with=0.0))
    v = verdicts(m)
    assert v[("rule_needed", 2.0, RUN)] == R.REPRODUCED
    assert v[("rule_needed", 4.0, END)] == R.REPRODUCED
    assert v[("target_explains", 4.0, "top1: " + RUN)] == R.NOT_TESTABLE  # no EMA gap to explain
    assert v[("ema_above_target", 1.0, END)] == R.REPRODUCED
    row = m["tables"]["ema_top1"]["rows"][("baseline", 1.0)]
    # The pair spread: offsets −0.3, 0, 0.3, each seed against each other one: mean |Δ| (0.3 + 0.6 + 0.3) × 2 / 6,
    # RMS of Δ √((4 × 0.09 + 2 × 0.36) / 6).
    assert row["gaps"]["run"] == pytest.approx(0.4) and row["gaps"]["signed_run"] == pytest.approx(math.sqrt(0.18))
    assert row["unpaired"]["run"] == pytest.approx(0.3)  # leave-one-out: (0.45 + 0 + 0.45) / 3
    claim = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 2.0)
    # Paired: each seed against its own baseline, −0.1 and +4 (worse) for every seed, whatever its offset.
    without, with_ = claim["parts"]
    assert without["per_seed"] == pytest.approx([4.0] * 3) and with_["per_seed"] == pytest.approx([-0.1] * 3)
    assert claim["effect"] == pytest.approx(4.0) and claim["effect_ci"] == pytest.approx([4.0, 4.0])
    # no noise: the smallest effect the "does not match" part reproduces is its size, one spread, at the upper
    # bound of a spread estimated from 3 baselines (2 df): 8.92 spreads, which the 9.43 of +4 clears
    assert claim["spread"] == pytest.approx(math.sqrt(0.18)) and claim["n"] == 3
    assert (without["spread_df"], with_["spread_df"]) == (2, 2)
    assert claim["mde"] == pytest.approx(claim["spread"] * R.spread_factor(0.0125, 2, True))
    assert 8.9 < R.spread_factor(0.0125, 2, True) < 4.0 / math.sqrt(0.18)
    assert with_["margin"] == pytest.approx(math.sqrt(0.18)) and with_["shape"] == "equivalence"
    assert claim["numbers"]["gap_A"] == pytest.approx(0.1) and claim["numbers"]["gap_B"] == pytest.approx(4.0)
    # Unpaired (against the baselines' mean) the offsets come back: |−0.3 + 0.1|, |0.1|, |0.3 + 0.1|.
    unpaired = m["tables"]["ema_top1"]["rows"][("with", 2.0)]["unpaired"]
    assert unpaired["run"] == pytest.approx(0.7 / 3)


def test_polyak_claims_contradicted_and_set_aside(tmp_path):
    # The rule makes it worse (8 below the baseline, against a spread of 0.42 whose upper bound from 3 baselines
    # is 3.8); the target model tracks.
    m = M.measure(K.POLYAK, polyak_runs(tmp_path, ema_with=-8.0, ema_without=-4.0, target_with=0.0))
    v = verdicts(m)
    assert v[("rule_needed", 2.0, RUN)] == R.CONTRADICTED
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 2.0)
    assert [p["verdict"] for p in c["parts"]] == [R.REPRODUCED, R.CONTRADICTED]  # without drops; with drops more
    assert c["parts"][1]["rule"] == ("CI97.5 lies outside ±8.92 spreads (1 spread at the spread's 98.75 % upper "
                                     "bound, 2 df)")
    # the EMA strays with the rule, the target model does not: the claim states only a sign, so no absence
    # contradicts it; an opposite effect (the target better than its baseline) does
    assert v[("target_explains", 4.0, "top1: " + RUN)] == R.NOT_REPRODUCED
    m = M.measure(K.POLYAK, polyak_runs(tmp_path / "up", ema_with=-8.0, ema_without=-4.0, target_with=2.0))
    assert verdicts(m)[("target_explains", 4.0, "top1: " + RUN)] == R.CONTRADICTED
    # Now the target strays as well: the optimizer rule is to blame, and the EMA claims are set aside.
    m = M.measure(K.POLYAK, polyak_runs(tmp_path / "b", ema_with=-8.0, ema_without=-12.0, target_with=-3.0))
    assert verdicts(m)[("target_explains", 4.0, "top1: " + RUN)] == R.REPRODUCED
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["kappa"] == 2.0)
    assert c["verdict"] == R.SET_ASIDE and c["verdict_if_applicable"] == R.CONTRADICTED
    assert c["why"] == "with the rule at κ=2: top1 worse by +3 [+3, +3] against a spread of +0.424"
CTC_SPEC = {"ema": {"momentum": 0.99995, "also": [0.9999, 0.999]}, "data": {"eval_splits": ["dev-clean", "test-clean"]}}


def ctc_runs(root, spec=CTC_SPEC, also=(0.9999, 0.999), single_point=False):
    """ctc-polyak runs logging the main EMA's WER and one per `also` momentum; κ=4 with the rule evaluated
    once (at the end) when `single_point`."""
    dirs = []
    for s, o in enumerate((-0.5, 0.0, 0.5)):
        metrics = {"wer": lambda t, o=o: 60 - t + o, "ema_wer": lambda t, o=o: 58 - t + o,
                   **{f"ema_wer/{r:g}": (lambda t, o=o: 59 - t + o) for r in also}}
        dirs.append(write_run(root, f"k1-s{s}", 1.0, "exponential", s, metrics, "ctc-polyak", spec=spec, rho=0.99995))
        for rule in ("exponential", None):
            dirs.append(write_run(root, f"k4-{rule}-s{s}", 4.0, rule, s, metrics, "ctc-polyak", spec=spec,
                                  rho=0.99995, ts=T[-1:] if single_point and rule else T))
    return load_runs(dirs)


def test_the_short_horizon_control_is_the_specs_smallest_further_ema(tmp_path):
    from emarule.config.load import load_spec

    names = {p: {m.name for m in K.for_spec(K.CTC_POLYAK, load_spec("ctc-polyak", preset=p)).metrics}
             for p in ("cpu", "tiny", None)}
    assert names == {"cpu": {"ema_wer", "wer", "ema_wer/0.9"}, "tiny": {"ema_wer", "wer", "ema_wer/0.999"},
                     None: {"ema_wer", "wer", "ema_wer/0.999"}}
    m = M.measure(K.CTC_POLYAK, ctc_runs(tmp_path))
    control = next(c for c in m["claims"] if c["claim"].startswith("… for smaller values of ρ_B"))
    assert control["metric"] == "ema_wer/0.999" and control["verdict"] == R.REPRODUCED, control
    assert control["shape"] == "equivalence" and len(control["parts"]) == 2
    assert m["tables"]["ema_wer"]["metric"].label == "EMA WER (%), dev-clean"  # the split evaluated, not "test"
    # No ema.also: nothing to judge, and the report says why.
    bare = {"ema": {"momentum": 0.99995}, "data": {"eval_splits": ["dev-clean"]}}
    m = M.measure(K.CTC_POLYAK, ctc_runs(tmp_path / "bare", spec=bare, also=()))
    control = next(c for c in m["claims"] if c["claim"].startswith("… for smaller values of ρ_B"))
    assert control["verdict"] == R.NOT_MEASURED and "the spec has no ema.also" in control["why"]
    assert control["effect"] is None and control["parts"] == []


def test_the_figure_marks_single_points_tells_momenta_apart_and_names_the_split(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from emarule.analysis.reproduce import figures

    assert figures.momentum_text(0.99995) == "0.99995" and figures.momentum_text(0.99995 ** 4) == "0.9998"
    assert figures.momentum_text(0.9) == "0.9" and figures.momentum_text(0.98 ** 4) == "0.9224"
    runs = ctc_runs(tmp_path / "runs", single_point=True)
    m = M.measure(K.CTC_POLYAK, runs)
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    figures.plot(K.CTC_POLYAK, m, runs, tmp_path / "f.png", "t")
    (fig,) = drawn
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == ["EMA WER (%), dev-clean", "target model WER (%), dev-clean",
                                                "short-horizon EMA WER (%), dev-clean"]
    for ax in axes:
        single = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 1]
        assert single and all(ln.get_marker() not in (None, "None", "") for ln in single)  # a visible point
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("κ=4 without EMA rule" in t and "ρ=" in t for t in labels)
    main = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert any("ρ=0.99995" in t for t in main) and any("ρ=0.9998" in t for t in main)
    control = [t.get_text() for t in axes[2].get_legend().get_texts()]
    assert any("baseline, ρ=0.999 " in t for t in control)  # the panel's own EMA, ρ_B = 0.999
    plt.close(fig)


def test_every_quote_marks_its_cuts():
    """A quote that starts mid-sentence opens with "…" (or an editor's [bracket]); the polyak κ=2 claim keeps
    the clause that says where the EMA diverges."""
    for f in K.FAMILIES.values():
        for c in (*f.claims, *f.extra_claims):
            assert c.text[0].isupper() or c.text.startswith(("… ", "[")), (f.name, c.text)
            assert not c.text.endswith((".", ",", " ")), c.text
    assert any(c.text == "We match baseline EMA statistics across the full trajectory batch size 2048, where the test "
               "EMA performance diverges" for c in K.POLYAK.claims)


def test_full_scale_commands_are_valid(monkeypatch):
    """Each `emarule reproduce …` in a family's full-scale advice parses, and its torchrun form is the same
    command under `torchrun --nproc-per-node 8 -m`."""
    import re
    import shlex

    import emarule.analysis.reproduce.command as C

    seen = []
    monkeypatch.setattr(C, "reproduce", lambda console, name, **kw: seen.append((name, kw)))
    for f in K.FAMILIES.values():
        cmds = [c for c in re.findall(r"`([^`]+)`", f.full_scale) if c.startswith(("emarule ", "torchrun "))]
        assert cmds and cmds[0].startswith(f"emarule reproduce {f.name}"), f.full_scale
        for cmd in cmds:
            if cmd.startswith("torchrun"):
                assert cmd == f"torchrun --nproc-per-node 8 -m {cmds[0]}", cmd
                continue
            seen.clear()
            res = runner.invoke(app, shlex.split(cmd)[1:])
            assert res.exit_code == 0, (cmd, res.output)
            assert seen and seen[0][0] == f.name, cmd


def test_a_run_that_never_logged_the_metric_leaves_its_claims_unmeasured(tmp_path):
    """Pseudo-labeling that never starts at κ=4 logs no `pl_wer`: not a gap of ∞, not an error."""
    dirs = []
    for s, o in enumerate((-0.5, 0.0, 0.5)):
        both = {"pl_wer": lambda t, o=o: 50 - t + o, "wer": lambda t, o=o: 60 - t + o}
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s, both, "ctc-pseudo-label"))
        dirs.append(write_run(tmp_path, f"k4-rule-s{s}", 4.0, "exponential", s,
                              {"wer": both["wer"]} if s == 1 else both, "ctc-pseudo-label"))
        dirs.append(write_run(tmp_path, f"k4-norule-s{s}", 4.0, None, s,
                              {m: (lambda t, f=f: f(t) + 9) for m, f in both.items()}, "ctc-pseudo-label"))
    m = M.measure(replace(K.CTC_PL, kappas=(1.0, 4.0), headline_kappa=4.0), load_runs(dirs))  # a κ=4 sweep
    pl = [c for c in m["claims"] if c["metric"] == "pl_wer"]
    assert len(pl) == 2 and all(c["verdict"] == R.NOT_MEASURED and "never logged" in c["why"] for c in pl)
    assert m["tables"]["pl_wer"]["rows"][("with", 4.0)]["gaps"]["missing"] == 1
    wer = next(c for c in m["claims"] if c["metric"] == "wer" and c["kind"] == "rule_needed")
    assert wer["verdict"] == R.REPRODUCED and wer["effect"] == pytest.approx(9.0)  # 9 points of WER worse without
    assert wer["mechanism"]["present"] is True and wer["mechanism"]["value"] == pytest.approx(45.0)
    # Pre-training only (50 base steps of 10 = epoch 5): with the rule the student is the baseline's.
    pre = next(c for c in m["claims"] if c["kind"] == "optimizer_strays")
    assert "up to epoch 5 " in pre["statistic"] and pre["spread"] == pytest.approx(math.sqrt(0.5))  # RMS of Δ
    # paired: each seed is its baseline; a departure that states no size is never contradicted by its absence
    assert pre["effect"] == pytest.approx(0) and pre["verdict"] == R.NOT_REPRODUCED


def test_progressive_runs_are_compared_from_their_transition(tmp_path):
    """Before Progressive Scaling leaves κ=1 each run is its seed's baseline: the effects start where it does."""
    step = [{"start_epoch": 0.0, "end_epoch": 6.0, "kappa": 1.0}, {"start_epoch": 6.0, "end_epoch": 10.0, "kappa": 2.0}]
    dirs = []
    for s, o in enumerate((-1.0, 0.0, 1.0)):
        early = lambda t, o=o: t + (o if t < 6 else 0.1 * o)  # noqa: E731 — noisy early, quiet after 6
        dirs.append(write_run(tmp_path, f"k1-s{s}", 1.0, "exponential", s, {"ema_top1": early, "top1": early}))
        for rule, off in (("exponential", 0.01 * (s - 1)), (None, -2.0)):
            late = lambda t, e=early, off=off: e(t) + (off if t >= 6 else 0.0)  # noqa: E731
            dirs.append(write_run(tmp_path, f"k2-{rule}-s{s}", 2.0, rule, s, {"ema_top1": late, "top1": early},
                                  layout=step))
    runs = load_runs(dirs)
    assert M.transition_epoch([r for r in runs if not r.is_baseline]) == 6.0
    assert M.transition_epoch([r for r in runs if r.is_baseline]) is None  # constant κ: the whole run
    m = M.measure(K.POLYAK, runs)
    c = next(c for c in m["claims"] if c["kind"] == "rule_needed" and c["statistic"].startswith("mean"))
    assert c["statistic"] == f"{RUN} from epoch 6" and m["since_epoch"] == 6.0
    # The late, quiet part's pair spread (offsets −0.1, 0, 0.1: RMS of Δ √0.02), not the early one's.
    assert c["spread"] == pytest.approx(math.sqrt(0.02))
    assert c["effect"] == pytest.approx(2.0) and c["parts"][1]["per_seed"] == pytest.approx([0.01, 0.0, -0.01])
    assert c["verdict"] == R.REPRODUCED


def test_up_to_claims_expand_per_kappa_and_unmeasured_kappas_say_so():
    claims = M.expand(K.BYOL.claims, [1.0, 2.0, 4.0, 8.0])
    # Fig. 5 (right) compares two arms at κ=8, whatever the sweep's κ: it is not an "up to" claim.
    assert [(c.kappa, c.over) for c in claims] == [(2.0, "end"), (4.0, "end"), (2.0, "run"), (4.0, "run"),
                                                   (8.0, "end"), (8.0, "end")]
    assert [c.kappa for c in M.expand(K.BYOL.claims, [1.0, 8.0])] == [4.0, 4.0, 8.0, 8.0]  # the first two not run
    assert not any(c.stand_in_beyond for c in K.BYOL.claims)
    # polyak's "across all batch sizes": κ=0.5 too, and nothing past κ=4 (it takes no stand-ins)
    assert [c.kappa for c in M.expand(K.POLYAK.claims[1:2], [0.5, 1.0, 2.0, 4.0, 8.0])] == [0.5, 2.0, 4.0]
# --- studies ------------------------------------------------------------------------------------


def parabola_records(ratio_at_256=0.95, slope_kink=1.0, order_ok=True, ratio_small=1.0, no_rule=0.5, floor=1.5):
    """Records shaped like `emarule run parabola` writes, for κ = 1…1024 and ρ_B ∈ {0.9999, 0.99}; Err(ρ*) is
    Err_rule / `floor`."""
    recs = []
    for rho in (0.9999, 0.99):
        for conv in ("pre", "post"):
            for j in range(11):
                k = 2 ** j
                rule = rho ** k
                ratio = ratio_small if k < 256 else ratio_at_256 if conv == "pre" else 0.9
                err_rule = 1e-5 * k * (10 if rho == 0.99 and order_ok else 0.1 if rho == 0.99 else 1)
                err_target = 1e-5 * k * (slope_kink if k >= 256 else 1.0)
                recs.append({"rho_base": rho, "dim": 1, "convention": conv, "kappa": k, "rho_rule": rule,
                             "rho_star": 1 - ratio * (1 - rule), "err_rule": 0.0 if k == 1 else err_rule,
                             "err_no_rule": 0.0 if k == 1 else no_rule,
                             "err_star": 0.0 if k == 1 else err_rule / floor,
                             "err_linear": None, "err_target": 0.0 if k == 1 else err_target})
    return recs


STUDY_VERDICTS = (R.REPRODUCED, R.CONTRADICTED, R.NOT_MEASURED)


def judged(kind, results, kappa=None) -> dict:
    """The record `judge_study` writes for the family's claim of this kind (at κ where given), checked for the
    shape every study record has: exact, a rule, one line of numbers, the numbers as a dict."""
    family = K.PARABOLA if kind.startswith("parabola") else K.PRECISION
    claim = next(c for c in family.claims if c.kind == kind)
    claim = replace(claim, kappa=kappa) if kappa is not None else claim
    rec = S.judge_check(family, claim, results).as_dict()
    assert rec["shape"] == "exact" and rec["verdict"] in STUDY_VERDICTS, rec
    assert rec["rule"].strip() and "\n" not in rec["rule"], rec
    assert rec["why"].strip() and "\n" not in rec["why"] and len(rec["why"]) <= 160, rec["why"]
    assert isinstance(rec["numbers"], dict), rec
    assert rec["kind"] == kind and rec["short"] == claim.short and rec["kappa"] == claim.kappa
    if kind.startswith("parabola"):  # the EMA convention judged is named on every parabola record
        assert "pre" in rec["rule"] and "post" in rec["rule"], rec["rule"]
    return rec


def verdict_of(kind, results, kappa=None) -> str:
    return judged(kind, results, kappa)["verdict"]


def with_post(records, **changes):
    """The records with the post convention's values changed."""
    return [dict(r, **changes) if r["convention"] == "post" else r for r in records]


def test_parabola_checks_come_out_each_way():
    p = parabola_records
    assert verdict_of("parabola_rho_star_higher", p(0.95)) == "reproduced"
    assert verdict_of("parabola_rho_star_higher", p(1.05)) == "contradicted"
    mixed = [dict(r, rho_star=1 - 1.05 * (1 - r["rho_rule"])) if r["kappa"] == 1024 else r for r in p(0.95)]
    assert verdict_of("parabola_rho_star_higher", mixed) == "contradicted"  # not higher at κ=1024: not systematic
    assert verdict_of("parabola_match", p(), 8) == "reproduced"  # 0.5 ≫ 8e-5, 1.5× the floor
    assert verdict_of("parabola_match", p(no_rule=1e-4), 8) == "contradicted"  # without: only 1.25× with
    assert verdict_of("parabola_match", p(floor=3.0), 8) == "contradicted"  # with: 3× the floor
    assert verdict_of("parabola_match", p(), 3) == "not measured"  # κ=3 not computed
    assert verdict_of("parabola_target_onset", p(slope_kink=8.0)) == "reproduced"  # slope 4 into 256, 1 below
    assert verdict_of("parabola_target_onset", p(slope_kink=1.0)) == "contradicted"  # one power law
    assert verdict_of("parabola_target_onset", p(slope_kink=1.3)) == "contradicted"  # 1.38 < 1.5 × 1
    assert verdict_of("parabola_lower_rho_worse", p(order_ok=True)) == "reproduced"
    assert verdict_of("parabola_lower_rho_worse", p(order_ok=False)) == "contradicted"
    one_break = [dict(r, err_rule=1e-9) if r["rho_base"] == 0.99 and r["kappa"] == 16 else r for r in p()]
    broken = judged("parabola_lower_rho_worse", one_break)
    assert broken["verdict"] == "contradicted" and broken["numbers"]["broken_at"] == [16]
    assert verdict_of("parabola_tracks_rho_star", p(0.97)) == "reproduced"
    assert verdict_of("parabola_tracks_rho_star", p(0.9)) == "reproduced"  # off at 256, where tracking ends
    assert verdict_of("parabola_tracks_rho_star", p(0.97, ratio_small=1.1)) == "contradicted"
    assert verdict_of("parabola_tracks_rho_star", p(0.97, ratio_small=1.04)) == "reproduced"
    assert verdict_of("parabola_inflection", p()) == "contradicted"  # a pure power law: no inflection
    assert verdict_of("parabola_no_rule_large", p()) == "reproduced"
    assert verdict_of("parabola_no_rule_large", p(no_rule=0.15)) == "contradicted"  # 1.5× at 1024
    assert verdict_of("parabola_no_rule_large", p(no_rule=0.05)) == "contradicted"
    assert verdict_of("parabola_dimensions", p()) == "not measured"  # no D > 1
    # without the paper's (pre) convention a check is not measured, and its post rows are not read at all
    post_only = [dict(r, err_rule=None, rho_star=None) for r in p() if r["convention"] == "post"]
    for kind in ("parabola_rho_star_higher", "parabola_tracks_rho_star", "parabola_inflection",
                 "parabola_lower_rho_worse", "parabola_dimensions", "parabola_no_rule_large"):
        assert verdict_of(kind, post_only) == "not measured", kind
    assert verdict_of("parabola_match", post_only, 8) == "not measured"


def test_parabola_post_convention_is_judged_beside_pre():
    """The verdict is pre's; the same rule on post goes into numbers["post"], and into `why` where it differs."""
    same = judged("parabola_match", parabola_records(), 8)
    assert same["numbers"]["post"]["verdict"] == "reproduced" and "post" not in same["why"]
    differs = judged("parabola_match", with_post(parabola_records(), err_no_rule=1e-4), 8)
    assert differs["verdict"] == "reproduced" and differs["numbers"]["post"]["verdict"] == "contradicted"
    assert differs["why"].endswith("; the post-update convention reads contradicted")
    higher = judged("parabola_rho_star_higher", parabola_records(1.05))  # post's ratio is 0.9 from κ=256
    assert higher["verdict"] == "contradicted"
    assert higher["why"].endswith("; the post-update convention reads reproduced")


def test_every_study_check_gives_its_numbers_apart_from_its_decision():
    """Every record: shape exact, the rule's words in `rule`, one line of numbers in `why` (no verdict words),
    the measured values in `numbers`."""
    p, q = parabola_records, precision_results
    recs = [judged("parabola_rho_star_higher", p(r)) for r in (0.95, 1.05)] + [
        judged("parabola_match", p(), 8), judged("parabola_match", p(), 3),
        judged("parabola_target_onset", p(slope_kink=1.0)), judged("parabola_lower_rho_worse", p()),
        judged("parabola_lower_rho_worse", p(order_ok=False)), judged("parabola_tracks_rho_star", p()),
        judged("parabola_inflection", p()), judged("parabola_no_rule_large", p()),
        judged("parabola_dimensions", in_dimension(p(), 16, 1.2)), judged("parabola_dimensions", p()),
        judged("precision_fp16_variance", q(1e-3)), judged("precision_bf16_stable", q()),
        judged("precision_fp32_stable", q()), judged("precision_fp32_range", q())]
    assert {r["verdict"] for r in recs} == set(STUDY_VERDICTS)
    for r in recs:
        pre = r["why"].split("; the post-update convention reads")[0]
        assert not any(w in pre for w in ("reproduced", "contradicted")), r["why"]
        assert r["why"] not in r["rule"]
        if r["verdict"] != "not measured":
            assert r["numbers"], r
    higher = recs[1]
    assert higher["verdict"] == "contradicted" and "κ=1024: " in higher["why"]
    assert higher["numbers"]["ratio"][1024] == pytest.approx(1.05) and higher["numbers"]["not_higher_at"] == [256,
                                                                                                            512, 1024]
    limits = recs[-1]
    assert limits["why"].endswith("the paper: κ ≈ 4K, B ≈ 8M)") and limits["numbers"]["batch_min"] < 1
    out = S.judge_study(K.PRECISION, q())
    assert [r["kind"] for r in out] == [c.kind for c in K.PRECISION.claims] and all(type(r) is dict for r in out)


def precision_results(fp16_std_top=1e-1, bf16_std_top=1e-2, fp32_std_top=1e-8, bf16=0.3, steps=2000):
    """Records at ρ = 0.9, 0.99, 0.999 (horizons 10, 100, 1000): each run's std over repeats is flat across ρ
    but for its value at 0.999, the `*_std_top`."""
    recs = []
    for run, diff, std, top in (("fp16", 0.05, 1e-2, fp16_std_top), ("bf16", bf16, 1e-2, bf16_std_top),
                                ("fp32_seed", 1e-3, 1e-4, 1e-4), ("fp32_reorder", 1e-7, 1e-8, fp32_std_top)):
        for m in (0.9, 0.99, 0.999):
            recs.append({"run": run, "momentum": m, "ema_maxabsdiff": diff,
                         "ema_maxabsdiff_std": top if m == 0.999 else std, "ema_maxabsdiff_relative": diff / 2})
    return {"records": recs} | ({"config": {"steps": steps}} if steps is not None else {})


def test_precision_checks_come_out_each_way():
    q = precision_results
    assert verdict_of("precision_fp16_variance", q(1e-1)) == "reproduced"  # 10× the smallest ρ's, and the largest
    assert verdict_of("precision_fp16_variance", q(1e-3)) == "contradicted"  # it shrinks
    assert verdict_of("precision_fp16_variance", q(1.5e-2)) == "contradicted"  # the largest, but only 1.5×
    assert verdict_of("precision_bf16_stable", q(bf16_std_top=1e-2)) == "reproduced"  # flat
    assert verdict_of("precision_bf16_stable", q(bf16_std_top=1.9e-2)) == "reproduced"  # under 2×
    assert verdict_of("precision_bf16_stable", q(bf16_std_top=5e-2)) == "contradicted"  # grows
    assert verdict_of("precision_fp32_stable", q(fp32_std_top=1e-8)) == "reproduced"
    assert verdict_of("precision_fp32_stable", q(fp32_std_top=1e-6)) == "contradicted"
    bf = judged("precision_bf16_stable", q(bf16=0.3))  # far from FP32, yet stable: reported, not judged
    assert bf["verdict"] == "reproduced" and bf["numbers"]["bf16_over_fp32_seed"][0.9] == pytest.approx(300)
    assert "300–300× fp32_seed" in bf["why"]
    assert verdict_of("precision_fp32_range", q()) == "reproduced"
    r = judged("precision_fp32_range", q())["numbers"]
    assert r["batch_min"] < 1 and 1e6 <= r["batch_max"] == pytest.approx(r["kappa_max"] * 4096)


def test_precision_variance_is_judged_on_the_momenta_whose_horizon_the_run_covers():
    """500 steps cover 1/(1 − ρ) for ρ = 0.9 and 0.99, not 0.999: its growing spread is left out, and `why`
    and `numbers` say so; 50 steps cover one ρ only, too few to see growth; no steps, nothing known."""
    full = judged("precision_fp16_variance", precision_results(1e-1, steps=2000))
    assert full["verdict"] == "reproduced" and full["numbers"]["judged_momenta"] == [0.9, 0.99, 0.999]
    short = judged("precision_fp16_variance", precision_results(1e-1, steps=500))
    assert short["verdict"] == "contradicted" and short["numbers"]["judged_momenta"] == [0.9, 0.99]
    assert short["numbers"]["steps"] == 500 and short["numbers"]["horizon_at_largest_rho"] == pytest.approx(1000)
    assert "500 steps < horizon 1,000 of ρ=0.999" in short["why"]
    assert verdict_of("precision_bf16_stable", precision_results(bf16_std_top=5e-2, steps=500)) == "reproduced"
    assert verdict_of("precision_fp16_variance", precision_results(steps=50)) == "not measured"
    assert verdict_of("precision_fp16_variance", precision_results(steps=None)) == "not measured"
    assert verdict_of("precision_fp16_variance", {"records": [], "config": {"steps": 10}}) == "not measured"


@pytest.mark.parametrize("kappa_update,kappa_max,verdict", [
    (1e-5, 4000.0, "reproduced"),  # batches 0.04 … 16M
    (1e-3, 4000.0, "contradicted"),  # the smallest meaningful batch is 4 samples
    (1e-5, 100.0, "contradicted"),  # the largest is 409,600
])
def test_precision_fp32_range_each_way(kappa_update, kappa_max, verdict):
    lim = types.SimpleNamespace(kappa_update=kappa_update, kappa_max=kappa_max)
    got = S.precision_fp32_range(lim=lim)
    assert got.verdict == verdict and got.rule and "\n" not in got.why and got.numbers["kappa_max"] == kappa_max


def with_rule_error(records, err_of, rho=0.9999, dim=1, convention="pre"):
    """The records with Err_rule of (ρ_B, D, convention) replaced by err_of(κ) for κ ≥ 2."""
    out = []
    for r in records:
        r = dict(r)
        if r["rho_base"] == rho and r["dim"] == dim and r["convention"] == convention and r["kappa"] >= 2:
            r["err_rule"] = err_of(r["kappa"])
        out.append(r)
    return out


def err_with_slopes(slopes):
    """Err_rule(κ) for κ = 2, 4, …, whose log–log slope over [2^j, 2^(j+1)] is slopes[j − 1]."""
    def err(k):
        j = round(math.log2(k))
        return 1e-5 * math.prod(2.0 ** s for s in slopes[:j - 1])
    return err


@pytest.mark.parametrize("slopes,verdict", [
    ([1.1] * 5 + [1.0] + [1.05] * 3, "reproduced"),  # the minimum over κ 64→128, then up by 0.05
    ([1.1] * 4 + [1.0] + [1.03] * 4, "reproduced"),  # the minimum over κ 32→64, up by 0.03
    ([1.1] * 5 + [1.0] + [1.01] * 3, "contradicted"),  # up by 0.01 only
    ([1.1, 1.0] + [1.05] * 7, "contradicted"),  # the minimum at κ 4→8, far below 32
    ([1.1] * 7 + [1.0] + [1.05], "contradicted"),  # the minimum at κ 256→512, beyond 128
    ([1.5 - 0.05 * j for j in range(9)], "contradicted"),  # falling to the last interval
])
def test_parabola_inflection_each_way(slopes, verdict):
    records = with_rule_error(parabola_records(), err_with_slopes(slopes))
    got = judged("parabola_inflection", records)
    assert got["verdict"] == verdict, got["why"]
    assert got["numbers"]["slopes"]["64→128"] == pytest.approx(slopes[5])


def in_dimension(records, dim, err_factor=1.0, one_minus_rho_star_factor=1.0):
    """The D = 1 records at ρ_B = 0.9999 copied to D = dim, Err_rule and 1 − ρ* scaled by the factors."""
    out = []
    for r in records:
        if r["dim"] == 1 and r["rho_base"] == 0.9999:
            out.append(dict(r, dim=dim, err_rule=r["err_rule"] * err_factor,
                            rho_star=1 - one_minus_rho_star_factor * (1 - r["rho_star"])))
    return records + out


@pytest.mark.parametrize("err_factor,rho_factor,verdict", [
    (1.03, 0.98, "reproduced"),  # within 10 %
    (1.09, 0.92, "reproduced"),
    (1.12, 1.0, "contradicted"),  # beyond 10 %
    (1.0, 1.12, "contradicted"),  # 1 − ρ* counts too
    (1.40, 1.0, "contradicted"),
    (1.0, 0.70, "contradicted"),
])
def test_parabola_dimensions_each_way(err_factor, rho_factor, verdict):
    records = in_dimension(parabola_records(), 16, err_factor, rho_factor)
    got = judged("parabola_dimensions", records)
    assert got["verdict"] == verdict, got["why"]
    assert got["numbers"]["dims"] == [16]
    assert got["numbers"]["max_relative_err_rule_difference"] == pytest.approx(abs(err_factor - 1))


# --- the registry -------------------------------------------------------------------------------


def test_registry_matches_the_specs_and_the_checks():
    from emarule.request import checks
    from emarule.config.load import load_spec

    assert set(K.FAMILIES) == {"parabola", "precision", "polyak", "byol", "byol-vit", "byol-r50-lars", "dino",
                               "ctc-polyak", "ctc-pseudo-label"}
    for f in K.FAMILIES.values():
        spec = load_spec(f.experiment)
        for c in f.claims:
            if f.kind == "study":
                assert c.kind in S.CHECKS, c
            else:
                assert c.kind in K.RULE_KINDS and c.metric in {m.name for m in f.metrics}, c
                assert c.over in ("run", "end")
                arms = {a.name: a for a in f.arms}
                for name in c.settings:  # a setting is the sweep's own, or an arm at the claim's κ
                    assert name in K.STANDARD or (name in arms and arms[name].kappa == c.kappa), (f.name, c)
        if f.kind == "sweep":
            assert f.ema_metric.depends_on_ema and 1.0 in f.kappas
            known = checks.TASK_METRICS.get(spec["task"])
            for m in f.metrics:  # what the registry judges is what the task logs, or the probe check's file
                if m.file:
                    assert m.file == PC.CACHE and "probe_top1" in known, (f.name, m.name)
                    continue
                bare = m.name.split("/", 1)[0]  # `ema_wer/0.9`: a further EMA of `wer`
                bare = bare[4:] if bare.startswith("ema_") else bare
                assert known is None or bare in (*known, *checks.LOOP_METRICS), (f.name, m.name)


# --- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["nope"], "unknown family 'nope'"),
    (["byol", "--preset", "huge"], "has no 'huge' preset"),
    (["precision", "--seeds", "3"], "drop --seeds and --kappas"),
    (["byol", "--kappas", "1,x"], "--kappas must be a number"),
    (["byol", "--preset", "tiny", "--seeds", "0"], "--seeds must be ≥ 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "out"
    one_line_error(runner.invoke(app, ["reproduce", *args, "--out", str(out)]), needle)
    assert not out.exists()


def test_a_family_whose_task_is_not_runnable_says_so(tmp_path, monkeypatch):
    import emarule.tasks

    monkeypatch.setattr(emarule.tasks, "RUNNABLE_TASKS", ("parabola", "precision", "byol", "toy"))
    monkeypatch.setitem(K.FAMILIES, "fake", K.Family("fake", "ctc-polyak", "§0", "sweep", (),
                                                     ema_metric=K.CTC_POLYAK.ema_metric))
    one_line_error(runner.invoke(app, ["reproduce", "fake", "--out", str(tmp_path / "o")]), "cannot run yet")


def test_precision_study_reproduction_writes_and_reuses(tmp_path):
    from emarule.analysis.reproduce.command import reproduce

    from emarule.console import wide_console
    from emarule.scaling import plan
    from emarule.config.load import load_spec

    small = ["precision_study.features=8", "precision_study.samples=256", "precision_study.repeats=2",
             "schedule.total_steps=40"]

    def resolver(experiment, preset):
        def resolve_run(k, ema, baseline):
            s = load_spec(experiment, preset=preset, overrides=small)
            return s, 1.0, "exponential", None, plan(s, 1.0)
        return resolve_run

    console = wide_console(quiet=True)
    data = reproduce(console, "precision", preset=None, seeds=None, kappas=None, out=str(tmp_path), data=None,
                     resolver=resolver)
    assert [c["kind"] for c in data["claims"]] == [c.kind for c in K.PRECISION.claims]
    assert all(c["shape"] == "exact" and c["rule"] and "\n" not in c["why"] for c in data["claims"])
    # 40 steps cover the horizon 1/(1 − ρ) of ρ = 0.9 alone: too few momenta to see a spread grow
    assert [c["verdict"] for c in data["claims"]] == ["not measured"] * 3 + ["reproduced"]
    assert (tmp_path / "report.md").is_file() and data["timing"]["reused"] == 0
    again = reproduce(console, "precision", preset=None, seeds=None, kappas=None, out=str(tmp_path), data=None,
                      resolver=resolver)
    assert again["timing"]["reused"] == 1 and again["claims"] == data["claims"]
    small.append("precision_study.noise=0.2")  # other settings: the results there are not theirs
    with pytest.raises(UserError, match="computed with other settings"):
        reproduce(console, "precision", preset=None, seeds=None, kappas=None, out=str(tmp_path), data=None,
                  resolver=resolver)


TINY_BYOL = ["reproduce", "byol", "--preset", "tiny", "--seeds", "2", "--kappas", "1,2", "--out"]


@pytest.fixture(scope="module")
def tiny_byol(tmp_path_factory):
    """One tiny byol reproduction (12 runs) for the tests that read it or invoke it again, each on its own
    copy: (the root, the first invocation's output)."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny-byol")
    res = runner.invoke(app, [*TINY_BYOL, str(root)])
    assert res.exit_code == 0, res.output
    return root, res.output


def copy_of(root: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(root, to / "root"))


def test_seed_sets_pooled_through_links_reuse_the_finished_runs(tiny_byol, tmp_path):
    """docs/reproduce.md, "Pooling seed sets": a root of links to another root's finished runs, judged on
    the seeds given as a list of ranges, trains nothing, leaves the linked runs' logs as they were and
    reads the same verdicts as the root it links to."""
    source = copy_of(tiny_byol[0], tmp_path)
    v = json.loads((source / "verdict.json").read_text())
    pooled = tmp_path / "pooled" / "byol-r18"
    pooled.mkdir(parents=True)
    runs = sorted(d for d in (source / "byol-r18").iterdir() if d.is_dir())
    logs = {d.name: (d / "metrics.jsonl").read_bytes() for d in runs}
    for d in runs:
        (pooled / d.name).symlink_to(d, target_is_directory=True)
    res = runner.invoke(app, [*TINY_BYOL[:4], "--seeds", "0-0,1-1", "--kappas", "1,2", "--out", str(pooled.parent)])
    assert res.exit_code == 0, res.output
    got = json.loads((pooled.parent / "verdict.json").read_text())
    assert got["seeds"] == [0, 1] and got["timing"]["runs"] == got["timing"]["reused"] == 12
    assert got["timing"]["trained"] == 0 and got["claims"] == v["claims"]
    assert {d.name: (d / "metrics.jsonl").read_bytes() for d in runs} == logs


def test_tiny_byol_reproduction_end_to_end_then_reused(tiny_byol, tmp_path):
    """CI smoke: a tiny κ sweep writes report.md, the figure and verdict.json in the issue's shape;
    the second invocation reuses every finished run."""
    tmp_path = copy_of(tiny_byol[0], tmp_path)
    args = [*TINY_BYOL, str(tmp_path)]
    v = json.loads((tmp_path / "verdict.json").read_text())
    assert v["family"] == "byol" and v["seeds"] == [0, 1] and v["kappas"] == [1.0, 2.0]
    # "until 4096", judged at the only κ run: 2, over the run and at the end; Fig. 5 (right) on its arms, at κ=2
    # under tiny (its 128 digits cannot hold κ=8 × 32).
    assert len(v["claims"]) == 4
    # gap_remains reads A alone (arm k8, against its seed's baseline)
    assert v["claims"][2]["settings"]["A"] == "arm k8 at κ=2" and v["claims"][2]["verdict"] != R.NOT_MEASURED
    assert v["claims"][3]["settings"] == {"A": "arm k8-after-warmup at κ=2", "B": "arm k8-in-warmup at κ=2"}
    assert [a["progressive"] for a in v["arms"]] == ["constant", "step:1", "step:0.5"]
    assert {(r["setting"], r["kappa"]) for r in v["optimizer_check"]["rows"]} == {
        ("with", 2.0), ("without", 2.0), ("k8", 2.0), ("k8-after-warmup", 2.0), ("k8-in-warmup", 2.0)}
    for c in v["claims"]:
        assert {"claim", "paper", "metric", "kappa", "verdict", "shape", "effect", "effect_ci", "mde", "spread",
                "parts"} <= set(c)
        assert c["kappa"] == 2.0 and c["verdict"] in R.ALL_VERDICTS and c["shape"] == R.KINDS[c["kind"]].shape
        if c["verdict"] != R.NOT_MEASURED:
            assert c["spread"] is not None and c["effect"] is not None and len(c["effect_ci"]) == 2
            assert all(len(p["per_seed"]) == 2 for p in c["parts"]) and c["n"] == 2
    assert [len(c["parts"]) for c in v["claims"]] == [2, 2, 1, 2]
    # over the run the tracking probe; at the end the final teachers' converged probe, the arms' too
    assert [c["metric"] for c in v["claims"]] == ["offline_probe_top1", "probe_top1"] + ["offline_probe_top1"] * 2
    assert all((tmp_path / "byol-r18" / d / "offline_probe.json").is_file()
               for d in ("tiny-k2-rule-arm-k8-s0", "tiny-k2-rule-step1-arm-k8-after-warmup-s1"))
    assert {r["metric"] for r in v["settings"]} == {"probe_top1", "byol_loss", "offline_probe_top1"}
    assert {r["setting"] for r in v["settings"]} == {"κ=1 baseline (its own spread)", "with", "without", "k8",
                                                    "k8-after-warmup", "k8-in-warmup"}
    assert (tmp_path / "figures" / "byol.png").stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "emarule reproduce byol --preset tiny --seeds 2 --kappas 1,2" in report and "**Verdict:" in report
    assert v["timing"]["runs"] == 12 and v["timing"]["reused"] == 0
    assert "## The optimizer-rule check" in report and "## Arms" in report and "Seeds: 0, 1 (2)" in report
    check = v["probe_check"]["settings"]  # the offline probe of every final teacher, beside the tracking probe
    assert set(check) == {"baseline", "κ=2 with", "κ=2 without"}
    assert all(0 <= x <= 100 for row in check.values() for x in row["offline"]["values"])
    assert len(check["baseline"]["init"]["values"]) == 2 and "Does the tracking probe measure" in report
    assert "verdict" in tiny_byol[1] and "report:" in tiny_byol[1]

    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "verdict.json").read_text())
    assert again["timing"]["reused"] == 12 and again["claims"] == v["claims"]
    # The second invocation trained nothing; the reproduction's wall time is both invocations' together.
    assert again["timing"]["invocations"] == 2 and again["timing"]["trained"] == 12
    assert again["timing"]["wall_s_total"] == pytest.approx(v["timing"]["wall_s"] + again["timing"]["wall_s"])
    report = (tmp_path / "report.md").read_text()
    assert "over the 2 invocations of this command that trained 12 of its 12 runs" in report
    # Seed 1 alone: its runs are reused, and seed 0's, there in the same root, are not mixed in.
    res = runner.invoke(app, [*args[:4], "--seeds", "1-1", *args[6:]])
    assert res.exit_code == 0, res.output
    one = json.loads((tmp_path / "verdict.json").read_text())
    assert one["seeds"] == [1] and one["timing"]["runs"] == one["timing"]["reused"] == 6
    # the verdict of other seeds is kept beside it, and said
    assert json.loads((tmp_path / "verdict-1.json").read_text())["seeds"] == [0, 1]
    assert "--seeds 2" in (tmp_path / "report-1.md").read_text()
    assert f"the earlier verdict of `{again['command']}` is kept as verdict-1.json and report-1.md" in res.output
    assert all(r["seed_list"] == [1] for r in one["settings"] if r["setting"] != "κ=1 baseline (its own spread)")
    assert "--seeds 1-1" in one["command"]


def test_headline_only_keeps_the_runs_its_claim_reads():
    from dataclasses import replace

    polyak = K.headline_only(K.POLYAK)
    assert polyak.kappas == (1.0, 2.0) and polyak.arms == () and polyak.claims == (K.POLYAK.claims[0],)
    # "up to κ": every κ of the sweep up to headline_kappa (4), where the Adam rule still holds; not κ=8
    assert K.CTC_POLYAK.kappas == (1.0, 4.0, 8.0) and K.headline_only(K.CTC_POLYAK).kappas == (1.0, 4.0)
    fig5_right = K.headline_only(replace(K.BYOL, headline=3))  # a claim on two arms keeps them, and only κ=1
    assert [a.name for a in fig5_right.arms] == ["k8-after-warmup", "k8-in-warmup"] and fig5_right.kappas == (1.0,)
    gap = K.headline_only(replace(K.BYOL, headline=2))  # an arm against the standard setting at the arm's κ
    assert [a.name for a in gap.arms] == ["k8"] and gap.kappas == (1.0,)
    assert K.headline_only(K.PARABOLA) is K.PARABOLA
    for f in K.FAMILIES.values():  # a headline is the first claim (verdict.json lists it first), judged on the
        # EMA or target metric; byol's on the final teachers' converged probe (claims.py says why)
        claim = f.claims[f.headline]
        assert f.headline == 0
        assert f.kind == "study" or claim.metric in (f.ema_metric.name, f.target_metric.name, "offline_probe_top1")
    assert K.BYOL.claims[0].metric == K.OFFLINE_PROBE.name and K.BYOL.claims[0].over == "end"


def test_headline_on_a_study_is_refused(tmp_path):
    one_line_error(runner.invoke(app, ["reproduce", "parabola", "--headline", "--out", str(tmp_path / "o")]),
                   "drop --headline")
    assert not (tmp_path / "o").exists()


def test_tiny_headline_reuses_the_full_reproductions_runs(tiny_byol, tmp_path):
    tmp_path = copy_of(tiny_byol[0], tmp_path)
    args = [*TINY_BYOL, str(tmp_path)]
    full = json.loads((tmp_path / "verdict.json").read_text())
    res = runner.invoke(app, [*args[:2], "--headline", *args[2:]])
    assert res.exit_code == 0, res.output
    head = json.loads((tmp_path / "verdict.json").read_text())
    assert head["timing"]["runs"] == head["timing"]["reused"] == 6 and head["arms"] == []
    assert head["claims"] == full["claims"][:1] and head["claims"][0]["short"] == K.BYOL.claims[0].short
    assert head["command"].startswith("emarule reproduce byol --headline --preset tiny")


def test_docs_print_each_study_rule_the_code_records():
    """docs/reproduce.md's table of the studies' rules is `studies.rules_markdown()`, and every check has a rule
    there that is the one its verdict records (without the parabola's convention clause)."""
    from pathlib import Path

    from emarule.analysis.reproduce import studies as S

    doc = (Path(__file__).parents[2] / "docs" / "reproduce.md").read_text()
    assert S.rules_markdown() in doc and set(S.RULES) == set(S.CHECKS)
    assert S.precision_fp16_variance({"records": []}).rule == S.RULES["precision_fp16_variance"]
    assert S.parabola_tracks_rho_star([]).rule == S.RULES["parabola_tracks_rho_star"] + S.PRE


def test_the_spreads_degrees_of_freedom_drop_with_the_pairs_it_left_out():
    table = lambda seeds, pairs: {"rows": {("baseline", 1.0): {"gaps": {"seeds": seeds, "pairs": pairs}}}}  # noqa: E731
    assert J.scale_df(table(5, 20)) == 4
    assert J.scale_df(table(5, 12)) == 3  # 12 ordered pairs: the most that 4 baselines make
    assert J.scale_df(table(5, 2)) == 1
    assert J.scale_df(table(1, 0)) is None and J.scale_df({"rows": {("baseline", 1.0): {"gaps": None}}}) is None
