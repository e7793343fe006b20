"""byol's claims at the end read the final teachers' converged probe (`claims.OFFLINE_PROBE`): one value per
finished run, from its offline_probe.json, compared per seed with its own baseline's."""

import json

import pytest

from emarule.analysis.compare import load_runs
from emarule.analysis.reproduce import claims as K
from emarule.analysis.reproduce import figures as F
from emarule.analysis.reproduce import measure as M
from emarule.analysis.reproduce import rules as R
from test_reproduce import write_offline_probe, write_run

BASE = {0: 50.0, 1: 47.0, 2: 53.0}  # the baselines' final teachers, per seed


def byol_runs(root, with_rule: dict, without: dict, probed=True, arms=None):
    """Baselines and κ=4 runs of seeds 0–2; `with_rule`/`without`: per-seed offset of the final teacher's
    probe from its seed's baseline. The tracking probe and the loss are the same in every setting."""
    dirs = []
    settings = [("k1", 1.0, "exponential", {s: 0.0 for s in BASE}), ("k4-rule", 4.0, "exponential", with_rule),
                ("k4-norule", 4.0, None, without)] + list(arms or [])
    for name, k, rule, offset in settings:
        for s, b in BASE.items():
            d = write_run(root, f"{name}-s{s}", k, rule, s,
                          {"probe_top1": lambda t: 30 + t, "byol_loss": lambda t: 1.0 / (1 + t)}, "byol-r18")
            if probed:
                write_offline_probe(d, b + offset[s])
            dirs.append(d)
    return load_runs(dirs)


def _end_claim(m):
    return next(c for c in m["claims"] if c["metric"] == "offline_probe_top1" and c["kappa"] == 4.0)


def test_a_file_metric_is_one_point_at_the_runs_last_epoch(tmp_path):
    run = byol_runs(tmp_path, {0: 1, 1: 1, 2: 1}, {0: 1, 1: 1, 2: 1})[0]
    assert M.final_reading(run, K.OFFLINE_PROBE) == ([10.0], [50.0])  # T ends at epoch 10
    (run.path / "offline_probe.json").write_text("{not json")
    assert M.final_reading(run, K.OFFLINE_PROBE) == ([], [])


def test_the_end_claim_is_judged_on_the_final_teachers_paired_per_seed(tmp_path):
    # With the rule each final teacher lands within a point of its own seed's; without it 40 points lower, beyond
    # the one spread (4.24) that a "does not match" part must clear at its upper bound from 3 baselines (8.9×).
    m = M.measure(K.BYOL, byol_runs(tmp_path, {0: 0.5, 1: -0.5, 2: 0.3}, {0: -40.0, 1: -39.5, 2: -40.5}))
    c = _end_claim(m)
    assert c["statistic"] == "Δ at the end" and c["verdict"] == R.REPRODUCED, c
    without, with_ = c["parts"]
    assert without["per_seed"] == pytest.approx([40.0, 39.5, 40.5])
    assert with_["per_seed"] == pytest.approx([-0.5, 0.5, -0.3])
    assert c["effect"] == pytest.approx(40.0) and with_["effect"] == pytest.approx(-0.1)
    # the signed pair spread: each baseline seed against each other one (±3, ±3, ±6): √((4 × 9 + 2 × 36) / 6)
    assert c["spread"] == pytest.approx(18 ** 0.5) and with_["margin"] == pytest.approx(18 ** 0.5)
    assert c["numbers"]["gap_A"] == pytest.approx((0.5 + 0.5 + 0.3) / 3) and c["numbers"]["gap_B"] == pytest.approx(40)
    assert c["numbers"]["gap_baselines"] == pytest.approx((3 + 3 + 6) / 3)
    # the tracking probe is the same everywhere: the claim over the run reads no effect in either setting
    run_claim = next(c for c in m["claims"] if c["metric"] == "probe_top1")
    assert [p["effect"] for p in run_claim["parts"]] == pytest.approx([0.0, 0.0])


def test_final_teachers_that_match_either_way_leave_it_open_and_a_rise_contradicts_it(tmp_path):
    # No drop without the rule: the claim states only its sign, so a small effect does not oppose it.
    m = M.measure(K.BYOL, byol_runs(tmp_path / "a", {0: 0.4, 1: -0.6, 2: 0.2}, {0: -0.3, 1: 0.5, 2: -0.2}))
    c = _end_claim(m)
    assert c["verdict"] == R.NOT_REPRODUCED and c["parts"][0]["verdict"] == R.NOT_REPRODUCED
    assert c["parts"][0]["margin"] is None and c["parts"][0]["mde_from_zero"] <= c["spread"]  # the power was there
    # Without the rule every final teacher ends 8 points above its own seed's: the opposite effect.
    m = M.measure(K.BYOL, byol_runs(tmp_path / "b", {0: 0.4, 1: -0.6, 2: 0.2}, {0: 8.0, 1: 7.5, 2: 8.5}))
    c = _end_claim(m)
    assert c["verdict"] == R.CONTRADICTED and c["parts"][0]["rule"] == "CI95 lies below 0: the opposite effect"


def test_runs_never_probed_leave_the_claim_unmeasured(tmp_path):
    m = M.measure(K.BYOL, byol_runs(tmp_path, {0: 0, 1: 0, 2: 0}, {0: 0, 1: 0, 2: 0}, probed=False))
    c = _end_claim(m)
    assert c["verdict"] == R.NOT_MEASURED and "offline_probe.json" in c["why"] and c["effect"] is None


def test_the_figure_draws_the_final_teachers_as_columns(tmp_path):
    runs = byol_runs(tmp_path / "r", {0: 0.5, 1: -0.5, 2: 0.3}, {0: -8.0, 1: -7.5, 2: -8.5})
    m = M.measure(K.BYOL, runs)
    out = F.plot(K.BYOL, m, runs, tmp_path / "byol.png", "t")
    assert out.is_file() and out.stat().st_size > 10_000
    assert list(m["tables"]) == ["probe_top1", "byol_loss", "offline_probe_top1"]


def test_the_table_gives_byols_headline_cell_and_the_bar_caveat_to_its_claim_at_the_end(tmp_path):
    from emarule.analysis.reproduce import table as T

    claims = [{"claim": c.text, "short": c.short, "kappa": c.kappa, "metric": c.metric, "verdict": R.CONTRADICTED,
               "shape": "directional", "effect": -1.0, "effect_ci": [-1.5, -0.5], "mde": 0.3, "spread": 1.0,
               "route": R.OPPOSITE}
              for c in K.BYOL.claims]
    bar = {"trained": 46.1, "init": 32.9, "pixels": 22.4, "margin": 13.2, "required": 15.0, "met": False}
    main = T.Root({"claims": claims, "timing": {}, "probe_check": {"bar": bar}})
    rows, _, _, _ = T.rows(tmp_path, [("byol", K.BYOL, main, T.Root(None))])
    assert [r[5] for r in rows] == ["not run: no byol-headline/verdict.json", "—", "—", "—"]
    assert [r[3] for r in rows] == ["-1 [-1.5, -0.5]"] * 4
    # an "up to κ" claim has a row per κ (--kappas 1,2,4): the cell goes on the headline claim's first row
    per_kappa = [c | {"kappa": k} for c in claims[:2] for k in (2.0, 4.0)] + claims[2:]
    rows, _, _, _ = T.rows(tmp_path, [("byol", K.BYOL, T.Root(main.verdict | {"claims": per_kappa}), T.Root(None))])
    assert [r[5] != "—" for r in rows] == [True, False, False, False, False, False]
    # the data bar's caveat on every probe's verdict: the tracking probe's and the final teachers'
    assert all(r[2][0] == "**contradicted** (the opposite effect)" + T.BAR_MISSED for r in rows)
    assert T._caveat({"metric": "byol_loss"}, {"met": False}) == ""


def test_a_baseline_that_stopped_early_is_an_unfinished_seed_not_a_lost_metric(tmp_path):
    """The point sits at the planned end: a baseline whose log ends at epoch 7 of 10 leaves the other
    baselines' readings comparable, and is marked stopped (no final value) rather than emptying the table."""
    runs = byol_runs(tmp_path, {0: 0.5, 1: -0.5, 2: 0.3}, {0: -8.0, 1: -7.5, 2: -8.5})
    stopped = next(r for r in runs if r.is_baseline and r.seed == 2)
    rows = [json.loads(x) for x in (stopped.path / "metrics.jsonl").read_text().splitlines()]
    (stopped.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["epoch"] <= 7))
    h = json.loads((stopped.path / "hparams.json").read_text())
    (stopped.path / "hparams.json").write_text(json.dumps(h | {"total": 1000}))  # 10 epochs of 100 samples
    m = M.measure(K.BYOL, load_runs([r.path for r in runs]))
    table = m["tables"]["offline_probe_top1"]
    assert table["baseline"][0] == [10.0]  # the planned end, from the layout
    assert [bool(x) for x in table["rows"][("baseline", 1.0)]["stopped"]] == [False, False, True]
    assert table["rows"][("baseline", 1.0)]["finals"] == [50.0, 47.0, None]
    # the tracking probe's claim over the run is judged as before
    run_claim = next(c for c in m["claims"] if c["metric"] == "probe_top1")
    assert run_claim["verdict"] == R.NOT_MEASURED and "seed 2 stopped before its end" in run_claim["why"]
