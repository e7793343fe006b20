"""The noisy parabola (§3.1, App. F.1): closed forms, the EMA kernels, the ρ* search, the CLI run."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from emarule.cli.main import app
from emarule.studies.parabola import momenta as ema, simulate
from emarule.studies.parabola.problem import Problem
from emarule.studies.parabola.search import minimize_beta
from emarule.studies.parabola.study import Settings, exact_study, montecarlo_study
from emarule.studies.parabola.run import RESULT_KEYS

SMALL = Problem(a=1.0, b=0.5, c=0.0, theta0=1.0, lr=1e-3, iters=1000)  # T = 1 in 1000 base steps


def reference_ema(x, zeta0, rho, convention):
    """ζ by the definition, one step at a time (x: θ_0..θ_n)."""
    z = [zeta0]
    for k in range(len(x) - 1):
        z.append(rho * z[-1] + (1 - rho) * (x[k] if convention == "pre" else x[k + 1]))
    return np.array(z)


# --- the EMA of known sequences -----------------------------------------------------------------

def test_ema_of_a_short_sequence_by_hand():
    theta = np.array([[1.0, 0.5, 0.25]])
    pre = ema.ema_path(ema.inputs(theta, "pre"), theta[:, 0], [0.5])[0, :, 0]
    post = ema.ema_path(ema.inputs(theta, "post"), theta[:, 0], [0.5])[0, :, 0]
    assert pre.tolist() == [1.0, 1.0, 0.75]  # ζ1 = .5·1 + .5·θ0, ζ2 = .5·1 + .5·θ1
    assert post.tolist() == [1.0, 0.75, 0.5]  # ζ1 = .5·1 + .5·θ1, ζ2 = .5·.75 + .5·θ2


def test_ema_of_a_constant_relaxes_geometrically():
    theta = np.full((1, 51), 2.0)
    theta[0, 0] = 0.0
    z = ema.ema_path(ema.inputs(theta, "post"), theta[:, 0], [0.9])[0, :, 0]
    np.testing.assert_allclose(z, 2.0 * (1 - 0.9 ** np.arange(51)), rtol=1e-13)


@pytest.mark.parametrize("convention", ["pre", "post"])
def test_exact_mean_is_the_ema_of_the_mean_path(convention):
    q, n = 1 - 0.01, 300
    mean_theta = q ** np.arange(n + 1)
    rhos = [0.0, 0.5, 0.97, q, 0.999, 0.99999]  # ρ = q is the κ=1 case where 1 − ρ_B = η_B a
    got = ema.exact_mean(1.0, q, rhos, n, convention)
    for i, rho in enumerate(rhos):
        np.testing.assert_allclose(got[i], reference_ema(mean_theta, 1.0, rho, convention), rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("convention", ["pre", "post"])
@pytest.mark.parametrize("stride", [1, 3, 16, 50])
def test_strided_ema_matches_the_definition(convention, stride):
    rng = np.random.default_rng(1)
    dim = 3
    theta = np.cumsum(rng.normal(0.0, 0.1, (2 * dim, 201)), axis=1) + 1.0
    rhos = np.array([0.0, 0.3, 0.9, 0.99, 0.9999])  # small ρ take the direct-weights branch
    got = ema.StridedEMA(theta, dim, convention, stride).zeta(rhos)
    for r, rho in enumerate(rhos):
        for p in range(theta.shape[0]):
            want = reference_ema(theta[p], theta[p, 0], rho, convention)[::stride][: got.shape[1]]
            np.testing.assert_allclose(got[p, :, r], want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dim", [1, 4])
def test_mean_norm_ema_matches_the_definition_including_the_slow_path(dim):
    rng = np.random.default_rng(2)
    theta = 1.0 + np.cumsum(rng.normal(0.0, 0.05, (3 * dim, 400)), axis=1)
    rhos = np.array([0.0, 0.2, 0.95, 0.9999])  # ρ ≤ 0.2: λn > 150, the Python loop
    got = ema.mean_norm_ema(theta, dim, rhos, "post")
    for r, rho in enumerate(rhos):
        paths = np.array([reference_ema(t, t[0], rho, "post") for t in theta])
        want = np.linalg.norm(paths.reshape(3, dim, -1), axis=1).mean(axis=0)
        np.testing.assert_allclose(got[:, r], want, rtol=1e-11)


# --- the simulator against its closed forms --------------------------------------------------------

def test_noise_of_a_scaled_run_is_the_sum_of_the_base_draws():
    z = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    levels = dict(simulate.noise_levels(z, [1, 2, 4, 8, 3]))
    z64 = z.astype(np.float64)
    np.testing.assert_allclose(levels[8], z64.reshape(5, 8, 8).sum(-1) / math.sqrt(8), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(levels[3], z64[:, :63].reshape(5, 21, 3).sum(-1) / math.sqrt(3), rtol=1e-12,
                               atol=1e-15)
    assert levels[1] is z


def test_theta_paths_follow_the_sgd_update():
    p = Problem(a=2.0, b=0.5, c=0.0, theta0=0.7, lr=1e-2, iters=50)
    run = p.scaled(2)
    z = np.random.default_rng(4).standard_normal((4, run.n))
    got = simulate.theta_paths(run, z, dim=2)  # each coordinate starts at ‖θ_0‖/√D
    for i in range(4):
        th = [0.7 / math.sqrt(2)]
        for k in range(run.n):
            g = p.a * th[-1] + math.sqrt(p.b * (p.a * th[-1]) ** 2 / 2) * z[i, k]
            th.append(th[-1] - run.lr * g)
        np.testing.assert_allclose(got[i], th, rtol=1e-12)


@pytest.mark.parametrize("kappa,c", [(1, 0.0), (8, 0.0), (4, 0.3)])
def test_mean_theta_and_mean_ema_match_the_closed_form(kappa, c):
    """E θ_k = (1 − ηa)^k θ_0 for any b, c; E ζ_k follows from it; checked within 5 standard errors."""
    p = Problem(a=1.0, b=0.5, c=c, theta0=1.0, lr=1e-3, iters=1000)
    run = p.scaled(kappa)
    z = next(z for k, z in simulate.noise_levels(simulate.base_noise(p, 4000, 1, [7]), [kappa]) if k == kappa)
    theta = simulate.theta_paths(run, z, dim=1)
    se = theta.std(axis=0) / math.sqrt(theta.shape[0])
    assert np.all(np.abs(theta.mean(axis=0) - run.mean_theta()) <= 5 * se + 1e-15)
    assert se[-1] > 0  # the noise is really there
    rho = 0.99
    zeta = ema.ema_path(ema.inputs(theta, "pre"), theta[:, 0], [rho])[:, :, 0]
    want = ema.exact_mean(1.0, run.q, [rho], run.n, "pre")[0]
    se_z = zeta.std(axis=0) / math.sqrt(zeta.shape[0])
    assert np.all(np.abs(zeta.mean(axis=0) - want) <= 5 * se_z + 1e-15)


# --- the search for ρ* ---------------------------------------------------------------------------

def test_search_finds_a_kinked_minimum_far_narrower_than_its_grid():
    u0 = math.log2(3.7e-4) + 1e-4  # not on any grid point

    def delta(betas):
        u = np.log2(betas)
        # two "peaks": a V at u0 and a flat floor; the minimax sits on the kink
        return np.stack([u - u0, 1e-3 * np.ones_like(u)])

    m = minimize_beta(delta, beta_center=1e-3)
    assert abs(math.log2(m.beta) - u0) < 1e-3
    assert m.err == pytest.approx(1e-3, rel=1e-9)


def test_search_reaches_the_edge_rho_zero():
    m = minimize_beta(lambda b: (1.0 - np.asarray(b))[None, :] + 0.0, beta_center=0.01)
    assert m.beta == 1.0 and m.rho == 0.0


# --- the study ----------------------------------------------------------------------------------

KAPPAS = [1, 4, 16, 64]


def test_exact_study_records_and_known_values():
    out = exact_study(SMALL, 0.999, Settings(KAPPAS), lambda msg: None)
    assert len(out.records) == 2 * len(KAPPAS)
    for r in out.records:
        assert set(r) == set(RESULT_KEYS)
        assert r["err_star"] <= r["err_rule"] + 1e-15 and r["err_star"] <= r["err_no_rule"] + 1e-15
        if r["kappa"] == 1:
            assert r["rho_star"] == 0.999 and r["err_rule"] == 0.0 and r["err_target"] == 0.0
    # the SGD rule's own error: max_t |(1 − η_B)^(jκ) − (1 − κη_B)^j|, by hand at κ=4
    j = np.arange(SMALL.iters // 4 + 1)
    want = np.abs((1 - 1e-3) ** (4 * j) - (1 - 4e-3) ** j).max()
    assert [r["err_target"] for r in out.records if r["kappa"] == 4][0] == pytest.approx(want, rel=1e-12)


def test_montecarlo_agrees_with_exact_moments_in_one_dimension():
    st = Settings(KAPPAS, method="montecarlo", seeds=400)
    mc = montecarlo_study(SMALL, 0.999, 1, st, lambda msg: None)
    ex = exact_study(SMALL, 0.999, Settings(KAPPAS), lambda msg: None)
    for a, b in zip(ex.records, mc.records, strict=True):
        assert (a["convention"], a["kappa"]) == (b["convention"], b["kappa"])
        assert b["rho_star"] == pytest.approx(a["rho_star"], rel=1e-4)
        for key in ("err_rule", "err_no_rule", "err_target"):
            assert b[key] == pytest.approx(a[key], rel=0.02, abs=1e-7)


def test_montecarlo_is_deterministic_in_its_seed():
    def run(seed):
        st = Settings([1, 8], method="montecarlo", seeds=40, seed=seed)
        return montecarlo_study(SMALL, 0.999, 2, st, lambda msg: None).records

    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert first != other


def test_the_paper_setting_ranks_the_conventions():
    """ρ_B = 0.9999, η_B = 1e-4, I_B = 1e4: ρ* sits above ρ_B^κ for the post-step EMA and below it for
    the paper's pre-step Definition; dropping the rule costs two orders of magnitude."""
    out = exact_study(Problem(), 0.9999, Settings([256]), lambda msg: None)
    pre, post = (r for r in out.records)
    assert (pre["convention"], post["convention"]) == ("pre", "post")
    assert post["rho_star"] > post["rho_rule"] > pre["rho_star"]
    assert 0.95 < (1 - post["rho_star"]) / (1 - post["rho_rule"]) < 0.96
    assert pre["err_no_rule"] > 50 * pre["err_rule"]


# --- the command line ---------------------------------------------------------------------------

def test_quick_preset_end_to_end(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "parabola", "--preset", "quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = json.loads((out / "results.json").read_text())
    assert records and all(list(rec) == list(RESULT_KEYS) for rec in records)
    assert {rec["convention"] for rec in records} == {"pre", "post"}
    assert {(rec["rho_base"], rec["dim"]) for rec in records} == {(0.9999, 1), (0.99, 1), (0.9999, 4)}
    for rec in records:
        assert 0.0 <= rec["rho_star"] < 1.0
        assert all(math.isfinite(v) for k, v in rec.items() if k.startswith("err") and v is not None)
        linear = 1 - rec["kappa"] * (1 - rec["rho_base"])
        assert (rec["err_linear"] is None) == (not 0.0 <= linear < 1.0)
    meta = json.loads((out / "run.json").read_text())
    assert {c["method"] for c in meta["configurations"]} == {"exact", "montecarlo"}
    assert meta["wall_time_s"] > 0
    for name in meta["files"]:
        assert (out / name).is_file()
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]  # no temporary file left behind
    assert "noisy parabola, post EMA" in (out / "table.txt").read_text()


def test_kappa_flag_is_refused_in_one_line(tmp_path):
    r = CliRunner().invoke(app, ["run", "parabola", "--preset", "quick", "--kappa", "2", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert r.output.strip().startswith("error: parabola sweeps κ and ρ itself") and "Traceback" not in r.output


@pytest.mark.parametrize("study", ["parabola", "precision"])
@pytest.mark.parametrize("option", [["--kappa", "1"], ["--batch-size", "64"], ["--no-ema-rule"],
                                    ["--ema-rule", "linear"], ["--progressive", "step:1"], ["--max-device-batch", "4"],
                                    ["--num-workers", "1"], ["--data", "."]])
def test_options_a_study_would_ignore_are_refused_before_anything_is_written(tmp_path, study, option):
    r = CliRunner().invoke(app, ["run", study, "--preset", "tiny", *option, "--out", str(tmp_path / "r")])
    assert r.exit_code == 2, r.output
    assert r.output.strip().startswith(f"error: {study} sweeps κ and ρ itself") and f"drop {option[0]}" in r.output
    assert not (tmp_path / "r").exists()


def test_non_integer_kappa_is_refused(tmp_path):
    r = CliRunner().invoke(app, ["run", "parabola", "--preset", "quick", "--set", "parabola.kappas=[1, 2.5]",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 2 and "whole number" in r.output


def test_tiny_preset_runs_the_whole_study_in_seconds(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "parabola", "--preset", "tiny", "--out", str(out)])
    assert r.exit_code == 0, r.output
    records = json.loads((out / "results.json").read_text())
    assert {(rec["rho_base"], rec["dim"], rec["kappa"]) for rec in records} == {
        (0.9999, d, k) for d in (1, 2) for k in (1, 4, 16)}
    assert all(0.0 <= rec["rho_star"] < 1.0 for rec in records)
    assert (out / "figures" / "summary.png").read_bytes()[:4] == b"\x89PNG"
